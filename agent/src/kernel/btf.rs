//! Struct layouts of the running kernel, read from its BTF (`/sys/kernel/btf/vmlinux`). The exit
//! program reads `task_struct` and `signal_struct` fields that no tracepoint exposes; their offsets
//! change with every kernel build, so they are resolved here and handed to the program at load.

use std::path::Path;

use btf_rs::{Btf, Type};

use super::Error;

/// Byte offsets the exit program needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskLayout {
    pub task_signal: u32,
    pub task_exit_code: u32,
    pub signal_flags: u32,
    pub signal_group_exit_code: u32,
    pub signal_live: u32,
}

impl TaskLayout {
    pub fn from_btf_file(path: &Path) -> Result<TaskLayout, Error> {
        let btf = open(path)?;
        let offset = |strukt: &str, member: &str| member_offset(&btf, strukt, member);
        Ok(TaskLayout {
            task_signal: offset("task_struct", "signal")?,
            task_exit_code: offset("task_struct", "exit_code")?,
            signal_flags: offset("signal_struct", "flags")?,
            signal_group_exit_code: offset("signal_struct", "group_exit_code")?,
            signal_live: offset("signal_struct", "live")?,
        })
    }
}

/// Byte offsets the scheduler audit's `sched_switch` program reads in `task_struct`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedLayout {
    pub task_pid: u32,
    /// `sched_info.run_delay`, from the start of `task_struct`.
    pub task_run_delay: u32,
}

impl SchedLayout {
    pub fn from_btf_file(path: &Path) -> Result<SchedLayout, Error> {
        let btf = open(path)?;
        let offset = |strukt: &str, member: &str| member_offset(&btf, strukt, member);
        Ok(SchedLayout {
            task_pid: offset("task_struct", "pid")?,
            // Kernels without CONFIG_SCHED_INFO have no `sched_info`: a clear error at load.
            task_run_delay: offset("task_struct", "sched_info")?
                + offset("sched_info", "run_delay")?,
        })
    }
}

fn open(path: &Path) -> Result<Btf, Error> {
    if !path.exists() {
        return Err(Error::NoBtf {
            path: path.to_owned(),
        });
    }
    let failed = |reason: String| Error::Btf {
        path: path.to_owned(),
        reason,
    };
    // Read whole, then parsed: from the file, btf-rs seeks for every type (a syscall each,
    // tens of thousands, which cost seconds in the kernel matrix's emulated VMs).
    let bytes = std::fs::read(path).map_err(|e| failed(e.to_string()))?;
    Btf::from_bytes(&bytes).map_err(|e| failed(e.to_string()))
}

/// Byte offset of `member` in `struct strukt`, looking through anonymous structs and unions.
fn member_offset(btf: &Btf, strukt: &str, member: &str) -> Result<u32, Error> {
    let missing = || Error::BtfMember {
        strukt: strukt.to_owned(),
        member: member.to_owned(),
    };
    let types = btf.resolve_types_by_name(strukt).map_err(|_| missing())?;
    let found = types.iter().find_map(|t| match t {
        Type::Struct(s) if !s.members.is_empty() => find_in(btf, s, member, 0),
        _ => None,
    });
    let bits = found.ok_or_else(missing)?;
    if bits % 8 != 0 {
        return Err(missing());
    }
    Ok(bits / 8)
}

fn find_in(btf: &Btf, s: &btf_rs::Struct, member: &str, base_bits: u32) -> Option<u32> {
    for m in &s.members {
        let name = btf.resolve_name(m).unwrap_or_default();
        let bits = base_bits + m.bit_offset();
        if name == member {
            return Some(bits);
        }
        if name.is_empty() {
            let inner = btf.resolve_chained_type(m).ok()?;
            if let Type::Struct(inner) | Type::Union(inner) = inner
                && let Some(found) = find_in(btf, &inner, member, bits)
            {
                return Some(found);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads this machine's BTF when it has one; the offsets are real, so only their relations
    /// can be asserted portably.
    #[test]
    fn resolves_task_layout_from_the_running_kernel() {
        let path = Path::new("/sys/kernel/btf/vmlinux");
        if !path.exists() {
            eprintln!("skipped: this kernel has no BTF at {}", path.display());
            return;
        }
        let layout = TaskLayout::from_btf_file(path).expect("BTF parses");
        assert!(layout.task_signal > 0 && layout.task_exit_code > 0);
        assert_ne!(layout.signal_flags, layout.signal_group_exit_code);
        assert_eq!(layout.task_signal % 8, 0, "a pointer is 8-aligned");
    }

    #[test]
    fn a_missing_btf_file_is_named() {
        let err = TaskLayout::from_btf_file(Path::new("/nonexistent/vmlinux"))
            .err()
            .map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("/nonexistent/vmlinux"))
        );
    }
}
