//! Struct layouts of the running kernel, read from its BTF (`/sys/kernel/btf/vmlinux`). The exit
//! program reads `task_struct` and `signal_struct` fields that no tracepoint exposes, the memory
//! cgroup level programs `page_counter`, `mem_cgroup` and `cgroup` fields; their offsets change
//! with every kernel build (and config: `page_counter.parent` is at 160 on Debian's 6.1, 232 on
//! its 6.12), so they are resolved here and handed to the programs at load.

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
        Self::from_btf(&open(path)?)
    }

    fn from_btf(btf: &Btf) -> Result<TaskLayout, Error> {
        let offset = |strukt: &str, member: &str| member_offset(btf, strukt, member);
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

/// Byte offsets the memory cgroup level programs (`ebpf/src/memcg.rs`) read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemcgLayout {
    pub pc_usage: u32,
    pub pc_parent: u32,
    pub memcg_css: u32,
    pub memcg_memory: u32,
    pub css_cgroup: u32,
    pub cgroup_kn: u32,
    pub kn_id: u32,
}

impl MemcgLayout {
    pub fn from_btf_file(path: &Path) -> Result<MemcgLayout, Error> {
        Self::from_btf(&open(path)?)
    }

    fn from_btf(btf: &Btf) -> Result<MemcgLayout, Error> {
        let offset = |strukt: &str, member: &str| member_offset(btf, strukt, member);
        Ok(MemcgLayout {
            pc_usage: offset("page_counter", "usage")?,
            pc_parent: offset("page_counter", "parent")?,
            memcg_css: offset("mem_cgroup", "css")?,
            memcg_memory: offset("mem_cgroup", "memory")?,
            css_cgroup: offset("cgroup_subsys_state", "cgroup")?,
            cgroup_kn: offset("cgroup", "kn")?,
            kn_id: offset("kernfs_node", "id")?,
        })
    }
}

/// The kernel's BTF, parsed once for every layout and function check a load needs (a parse
/// costs seconds in the kernel matrix's emulated VMs).
pub struct KernelBtf {
    btf: Btf,
}

impl KernelBtf {
    pub fn open(path: &Path) -> Result<KernelBtf, Error> {
        Ok(KernelBtf { btf: open(path)? })
    }

    pub fn task_layout(&self) -> Result<TaskLayout, Error> {
        TaskLayout::from_btf(&self.btf)
    }

    pub fn memcg_layout(&self) -> Result<MemcgLayout, Error> {
        MemcgLayout::from_btf(&self.btf)
    }

    /// Whether the kernel has an out-of-line function `name` (a BTF `FUNC`: one that fentry can
    /// attach to, unless the kernel lacks ftrace).
    pub fn has_function(&self, name: &str) -> bool {
        self.btf
            .resolve_types_by_name(name)
            .is_ok_and(|types| types.iter().any(|t| matches!(t, Type::Func(_))))
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

    /// The memory cgroup level programs' offsets on this kernel, and the functions they attach
    /// to. The layout's facts that hold on every kernel since 5.5 are asserted; the VMs' kernels
    /// are covered by the kernel matrix (`tests/tests/kernel_features.rs`).
    #[test]
    fn resolves_memcg_layout_from_the_running_kernel() {
        let path = Path::new("/sys/kernel/btf/vmlinux");
        if !path.exists() {
            eprintln!("skipped: this kernel has no BTF at {}", path.display());
            return;
        }
        let btf = KernelBtf::open(path).expect("BTF parses");
        let layout = btf.memcg_layout().expect("memcg layout");
        assert_eq!(layout.pc_usage, 0, "usage leads page_counter everywhere");
        assert_eq!(layout.memcg_css, 0, "css leads mem_cgroup");
        assert_eq!(layout.css_cgroup, 0, "cgroup leads cgroup_subsys_state");
        assert!(layout.pc_parent > layout.pc_usage && layout.pc_parent.is_multiple_of(8));
        assert!(layout.memcg_memory > 0 && layout.memcg_memory.is_multiple_of(8));
        assert!(layout.cgroup_kn > 0 && layout.kn_id > 0);
        for function in [
            "page_counter_try_charge",
            "page_counter_charge",
            "memory_current_read",
        ] {
            assert!(btf.has_function(function), "{function} is a BTF FUNC");
        }
        assert!(
            !btf.has_function("page_counter"),
            "a struct is not a function"
        );
        assert!(!btf.has_function("swiftlet_no_such_function"));
        assert_eq!(
            MemcgLayout::from_btf_file(path).expect("memcg layout"),
            layout
        );
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
