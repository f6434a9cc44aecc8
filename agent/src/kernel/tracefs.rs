//! tracefs: making sure it is mounted (aya attaches tracepoints through it) and reading tracepoint
//! formats, whose field offsets differ between kernels and are handed to the programs at load.

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use nix::mount::{MsFlags, mount};

use super::Error;

/// Where tracefs lives on every kernel swiftlet supports.
pub const TRACEFS: &str = "/sys/kernel/tracing";

/// Mounts tracefs at `path` unless it is already there (a mounted tracefs is never empty).
pub fn ensure_mounted(path: &Path) -> Result<(), Error> {
    let populated = |p: &Path| {
        fs::read_dir(p)
            .map(|mut d| d.next().is_some())
            .unwrap_or(false)
    };
    if populated(path) {
        return Ok(());
    }
    mount(
        Some("tracefs"),
        path,
        Some("tracefs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(|errno| Error::Tracefs {
        path: path.to_owned(),
        source: io::Error::from(errno),
    })?;
    tracing::info!(path = %path.display(), "mounted tracefs (it was not mounted)");
    Ok(())
}

/// One field of a tracepoint record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    /// The C declaration as the format prints it, e.g. `__data_loc char[] path`.
    pub decl: String,
    pub offset: u32,
    pub size: u32,
}

/// A tracepoint's record layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Format {
    /// `category/name`, for error messages.
    pub tracepoint: String,
    pub fields: Vec<Field>,
}

impl Format {
    /// Reads `<tracefs>/events/<category>/<name>/format`.
    pub fn read(tracefs: &Path, category: &str, name: &str) -> Result<Format, Error> {
        let path: PathBuf = tracefs
            .join("events")
            .join(category)
            .join(name)
            .join("format");
        let text = fs::read_to_string(&path).map_err(|source| Error::Tracepoint {
            tracepoint: format!("{category}/{name}"),
            path: path.clone(),
            source,
        })?;
        Ok(Format::parse(&format!("{category}/{name}"), &text))
    }

    /// Parses the text of a format file; lines that are not fields are ignored.
    pub fn parse(tracepoint: &str, text: &str) -> Format {
        let fields = text.lines().filter_map(parse_field).collect();
        Format {
            tracepoint: tracepoint.to_owned(),
            fields,
        }
    }

    pub fn field(&self, name: &str) -> Option<&Field> {
        self.fields.iter().find(|f| f.name == name)
    }

    /// The offset of a field the programs cannot do without.
    pub fn required(&self, name: &str) -> Result<u32, Error> {
        self.field(name)
            .map(|f| f.offset)
            .ok_or_else(|| Error::TracepointField {
                tracepoint: self.tracepoint.clone(),
                field: name.to_owned(),
            })
    }

    /// The offset of a field newer kernels added, or `FIELD_ABSENT`.
    pub fn optional(&self, name: &str) -> u32 {
        self.field(name)
            .map_or(swiftlet_common::FIELD_ABSENT, |f| f.offset)
    }
}

/// `\tfield:unsigned long total_vm;\toffset:16;\tsize:8;\tsigned:0;`
fn parse_field(line: &str) -> Option<Field> {
    let mut decl = None;
    let mut offset = None;
    let mut size = None;
    for part in line.trim().split(';') {
        let part = part.trim();
        if let Some(rest) = part.strip_prefix("field:") {
            decl = Some(rest.trim().to_owned());
        } else if let Some(rest) = part.strip_prefix("offset:") {
            offset = rest.trim().parse().ok();
        } else if let Some(rest) = part.strip_prefix("size:") {
            size = rest.trim().parse().ok();
        }
    }
    let decl = decl?;
    // The name is the last word once a trailing array suffix is cut: `char comm[16]` -> `comm`,
    // `__data_loc char[] path` -> `path`, `const char * name` -> `name`.
    let base = match decl.strip_suffix(']') {
        Some(_) => decl
            .rsplit_once('[')
            .map_or(decl.as_str(), |(head, _)| head),
        None => decl.as_str(),
    };
    let name = base
        .split_whitespace()
        .last()?
        .trim_start_matches('*')
        .to_owned();
    Some(Field {
        name,
        decl,
        offset: offset?,
        size: size?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXIT_6_18: &str = "name: sched_process_exit
ID: 300
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:char comm[16];\toffset:8;\tsize:16;\tsigned:0;
\tfield:pid_t pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:int prio;\toffset:28;\tsize:4;\tsigned:1;
\tfield:bool group_dead;\toffset:32;\tsize:1;\tsigned:0;

print fmt: \"comm=%s pid=%d prio=%d group_dead=%s\", REC->comm, REC->pid";

    #[test]
    fn parses_fields_with_arrays_and_data_loc() {
        let f = Format::parse("sched/sched_process_exit", EXIT_6_18);
        assert_eq!(f.field("comm").map(|f| (f.offset, f.size)), Some((8, 16)));
        assert_eq!(f.required("group_dead").ok(), Some(32));
        assert_eq!(f.required("pid").ok(), Some(24));

        let loc = Format::parse(
            "cgroup/cgroup_mkdir",
            "\tfield:__data_loc char[] path;\toffset:24;\tsize:4;\tsigned:0;",
        );
        assert_eq!(loc.required("path").ok(), Some(24));
    }

    #[test]
    fn missing_fields_are_absent_or_named_errors() {
        let old = Format::parse(
            "sched/sched_process_exit",
            "\tfield:pid_t pid;\toffset:24;\tsize:4;\tsigned:1;",
        );
        assert_eq!(old.optional("group_dead"), swiftlet_common::FIELD_ABSENT);
        let err = old.required("group_dead").err().map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("sched/sched_process_exit") && e.contains("group_dead")),
            "{err:?}"
        );
    }

    #[test]
    fn pointer_fields_are_named() {
        let f = Format::parse(
            "x/y",
            "\tfield:const char * name;\toffset:8;\tsize:8;\tsigned:0;",
        );
        assert_eq!(f.required("name").ok(), Some(8));
    }
}
