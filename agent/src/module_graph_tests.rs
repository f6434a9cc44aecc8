//! The top-level modules of the agent depend on each other one way (ARCHITECTURE.md's picture):
//! this reads every source file, collects which top-level modules each one names through
//! `crate::`, and fails on a cycle, naming the files of each edge in it. The low modules that
//! everyone may use (`clock`, `lock`, `container`, `pod`, `cgroup`) are held to what they may import themselves.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

type Graph = BTreeMap<String, BTreeMap<String, BTreeSet<PathBuf>>>;

fn source_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The top-level modules: each directory and each `.rs` file of `src` but the crate roots.
fn top_level_modules(src: &Path) -> BTreeSet<String> {
    let mut modules = BTreeSet::new();
    for entry in fs::read_dir(src).expect("agent/src is readable") {
        let path = entry.expect("directory entry").path();
        let Some(name) = path.file_stem().and_then(|n| n.to_str()) else {
            continue;
        };
        if path.is_dir()
            || (path.extension().is_some_and(|e| e == "rs") && name != "lib" && name != "main")
        {
            modules.insert(name.to_owned());
        }
    }
    modules
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("source directory is readable") {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The first identifiers of every path that starts with `crate::` in `code`, including each
/// branch of a `crate::{a::b, c}` use tree.
fn crate_roots(code: &str) -> Vec<&str> {
    let ident_end = |s: &str| {
        s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(s.len())
    };
    let mut roots = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        if let Some(tree) = rest.strip_prefix('{') {
            let mut depth = 1;
            let mut branch_start = 0;
            for (i, c) in tree.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 1 => {
                        let branch = tree[branch_start..i].trim_start();
                        roots.push(&branch[..ident_end(branch)]);
                        branch_start = i + 1;
                    }
                    _ => {}
                }
                if depth == 0 {
                    let branch = tree[branch_start..i].trim_start();
                    roots.push(&branch[..ident_end(branch)]);
                    break;
                }
            }
        } else {
            roots.push(&rest[..ident_end(rest)]);
        }
    }
    roots
}

/// Who imports whom, with the files that do; comment lines (docs' links included) do not count.
fn module_graph() -> Graph {
    let src = source_dir();
    let modules = top_level_modules(&src);
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut graph = Graph::new();
    for file in files {
        let relative = file.strip_prefix(&src).expect("below src").to_path_buf();
        let Some(from) = relative
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .map(|c| c.trim_end_matches(".rs").to_owned())
        else {
            continue;
        };
        if !modules.contains(&from) {
            continue;
        }
        let text = fs::read_to_string(&file).expect("source file is readable");
        let code: String = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .flat_map(|l| [l, "\n"])
            .collect();
        for to in crate_roots(&code) {
            if to != from && modules.contains(to) {
                graph
                    .entry(from.clone())
                    .or_default()
                    .entry(to.to_owned())
                    .or_default()
                    .insert(relative.clone());
            }
        }
    }
    graph
}

/// A cycle through `start`, if any, as the list of modules along it.
fn cycle_from(graph: &Graph, start: &str) -> Option<Vec<String>> {
    fn walk(
        graph: &Graph,
        start: &str,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        let Some(last) = path.last().cloned() else {
            return false;
        };
        for next in graph.get(&last).into_iter().flat_map(|e| e.keys()) {
            if next == start {
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if walk(graph, start, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    let mut path = vec![start.to_owned()];
    walk(graph, start, &mut path, &mut BTreeSet::new()).then_some(path)
}

#[test]
fn reads_use_trees() {
    let code = "use crate::{a::b, c::{d, e}, f};\nlet x = crate::g::h();";
    assert_eq!(crate_roots(code), ["a", "c", "f", "g"]);
}

#[test]
fn top_level_modules_import_each_other_one_way() {
    let graph = module_graph();
    assert!(
        graph
            .get("kubelet")
            .is_some_and(|e| e.contains_key("kuberuntime")),
        "the reader sees the kubelet's imports"
    );
    let mut cycles = Vec::new();
    for module in graph.keys() {
        if let Some(cycle) = cycle_from(&graph, module) {
            let edges: Vec<String> = cycle
                .iter()
                .zip(cycle.iter().cycle().skip(1))
                .map(|(a, b)| format!("{a} -> {b} ({:?})", graph[a][b]))
                .collect();
            cycles.push(edges.join(", "));
        }
    }
    assert!(cycles.is_empty(), "module cycles:\n{}", cycles.join("\n"));
}

#[test]
fn low_modules_import_only_lower_ones() {
    let graph = module_graph();
    // `testing` is the test-only builder of pods and the scripted API server, importing nothing
    // of the agent but the clock.
    let allowed: [(&str, &[&str]); 6] = [
        ("testing", &["clock"]),
        ("clock", &[]),
        ("lock", &[]),
        ("container", &["testing"]),
        ("pod", &["container", "testing"]),
        ("cgroup", &["container", "pod", "testing"]),
    ];
    for (module, may) in allowed {
        for (to, files) in graph.get(module).into_iter().flatten() {
            assert!(
                may.contains(&to.as_str()),
                "{module} imports {to} ({files:?}); it may import only {may:?}"
            );
        }
    }
}
