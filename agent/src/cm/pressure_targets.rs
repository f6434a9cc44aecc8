//! Which pod and container cgroups exist on the cgroup2 mount, and whose they are: what the
//! per-pod and per-container pressure metrics read (cAdvisor's `container_pressure_*`).
//!
//! With the cgroupfs driver a pod's cgroup is `kubepods[/burstable|/besteffort]/pod<uid>`
//! (`cgroup::pods`) and the runtime names each container's cgroup below it by the container's id; the sandbox's pause
//! container has one too, which is no container of the pod's and is left out.
//!
//! Not here: where names come from (the composition root joins the status manager and the PLEG
//! cache), or reading the pressure (`cm::psi`).

use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
};

use crate::{cgroup::PodCgroupLayout, container::PodUid};

/// The cgroup2 directory of a pod (`container` empty, as cAdvisor labels the pod-level cgroup)
/// or of one of its containers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PressureTarget {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub dir: PathBuf,
}

/// A pod's cgroup2 directory and the directories below it (containers' and the sandbox's) as
/// `(container id, directory name)`: the same with cgroupfs, a runtime's scope with systemd.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodCgroupDir {
    pub uid: PodUid,
    pub dir: PathBuf,
    pub children: Vec<(String, String)>,
}

/// What the agent knows of a pod: its names, and its containers as (runtime id, spec name),
/// newest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodNames {
    pub namespace: String,
    pub name: String,
    pub containers: Vec<(String, String)>,
}

/// The pods' directories under `cgroup2_root/<parent>` for each of the layout's pod parents
/// (e.g. `kubepods`, `kubepods/burstable`), with the container ids of their subdirectories.
/// Missing parents are skipped.
pub fn pod_dirs(cgroup2_root: &Path, layout: &PodCgroupLayout) -> Vec<PodCgroupDir> {
    let mut pods = Vec::new();
    for parent in layout.pod_parents() {
        let Ok(entries) = std::fs::read_dir(cgroup2_root.join(&parent)) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(uid) = layout.uid_of_pod_dir_in(&parent, &name) else {
                continue;
            };
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let dir = entry.path();
            pods.push(PodCgroupDir {
                uid,
                children: subdirectories(&dir)
                    .into_iter()
                    .filter_map(|child| Some((layout.container_id_of_dir(&child)?, child)))
                    .collect(),
                dir,
            });
        }
    }
    pods
}

fn subdirectories(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Labels the pod directories by `names`: the pod's own cgroup, then each known container's
/// (the newest instance of each name when several have a cgroup). Pods without names and
/// directories that are no known container (the sandbox's) are left out.
pub fn label(
    dirs: Vec<PodCgroupDir>,
    names: impl Fn(&PodUid) -> Option<PodNames>,
) -> Vec<PressureTarget> {
    let mut targets = Vec::new();
    for pod in dirs {
        let Some(names) = names(&pod.uid) else {
            continue;
        };
        let target = |container: &str, dir: PathBuf| PressureTarget {
            namespace: names.namespace.clone(),
            pod: names.name.clone(),
            container: container.to_owned(),
            dir,
        };
        targets.push(target("", pod.dir.clone()));
        let children: HashMap<&str, &str> = pod
            .children
            .iter()
            .map(|(id, dir)| (id.as_str(), dir.as_str()))
            .collect();
        let mut seen = HashSet::new();
        for (id, name) in &names.containers {
            if let Some(dir) = children.get(id.as_str())
                && seen.insert(name.as_str())
            {
                targets.push(target(name, pod.dir.join(dir)));
            }
        }
    }
    targets
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_pods_under_each_parent_with_their_children() {
        let root = tempfile::tempdir().expect("tempdir");
        for dir in [
            "kubepods/podg/c1",
            "kubepods/burstable/podb/c2",
            "kubepods/burstable/podb/sandbox",
            "kubepods/besteffort/pode",
            "kubepods/burstable/not-a-pod",
        ] {
            std::fs::create_dir_all(root.path().join(dir)).expect("mkdir");
        }
        let mut dirs = pod_dirs(
            root.path(),
            &PodCgroupLayout::with_kubepods("kubepods", true),
        );
        dirs.sort_by(|a, b| a.uid.cmp(&b.uid));
        for d in &mut dirs {
            d.children.sort();
        }
        let want = |uid: &str, dir: &str, children: &[&str]| PodCgroupDir {
            uid: PodUid::from(uid),
            dir: root.path().join(dir),
            children: children
                .iter()
                .map(|c| ((*c).to_owned(), (*c).to_owned()))
                .collect(),
        };
        assert_eq!(
            dirs,
            [
                want("b", "kubepods/burstable/podb", &["c2", "sandbox"]),
                want("e", "kubepods/besteffort/pode", &[]),
                want("g", "kubepods/podg", &["c1"]),
            ]
        );
    }

    #[test]
    fn labels_known_pods_and_containers_only() {
        let dir = |uid: &str, children: &[&str]| PodCgroupDir {
            uid: PodUid::from(uid),
            dir: PathBuf::from(format!("/cg/pod{uid}")),
            children: children
                .iter()
                .map(|c| ((*c).to_owned(), format!("cri-containerd-{c}.scope")))
                .collect(),
        };
        let dirs = vec![
            dir("a", &["sandbox", "new", "old", "gone-from-cache"]),
            dir("unknown", &["x"]),
        ];
        let targets = label(dirs, |uid| {
            (uid.0 == "a").then(|| PodNames {
                namespace: "ns".into(),
                name: "web".into(),
                containers: vec![
                    ("new".into(), "main".into()),
                    ("old".into(), "main".into()),
                    ("exited".into(), "init".into()),
                ],
            })
        });
        let got: Vec<(&str, &str, &str, &Path)> = targets
            .iter()
            .map(|t| {
                (
                    t.namespace.as_str(),
                    t.pod.as_str(),
                    t.container.as_str(),
                    t.dir.as_path(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("ns", "web", "", Path::new("/cg/poda")),
                (
                    "ns",
                    "web",
                    "main",
                    Path::new("/cg/poda/cri-containerd-new.scope")
                ),
            ]
        );
    }
}
