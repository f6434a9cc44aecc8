//! `cgroup/cgroup_mkdir` and `cgroup/cgroup_rmdir` on the cgroup2 hierarchy (other hierarchies of
//! a hybrid layout are skipped in the kernel).

use aya_ebpf::{macros::map, maps::PerCpuArray, programs::TracePointContext};
use aya_log_ebpf::debug;
use swiftlet_common::{CgroupEvent, EventKind, PATH_LEN};

use crate::{
    config,
    emit::{self, Result, read_field},
    exec::read_data_loc_str,
    filter,
};

/// Per-CPU scratch for the path, read once for the filter before anything is reserved, so that a
/// full ring buffer never counts an unwatched cgroup as lost.
#[map]
static PATH_SCRATCH: PerCpuArray<[u8; PATH_LEN]> = PerCpuArray::with_max_entries(1, 0);

pub fn try_cgroup(ctx: &TracePointContext, kind: EventKind) -> Result<()> {
    let root: i32 = read_field(ctx, config!(cgroup_root))?;
    if root as u32 != config!(cgroup2_hierarchy_id) {
        return Ok(());
    }
    let level: i32 = read_field(ctx, config!(cgroup_level))?;
    let id_field = config!(cgroup_id);
    let id: u64 = if config!(cgroup_id_size) == 8 {
        read_field(ctx, id_field)?
    } else {
        u64::from(read_field::<u32>(ctx, id_field)?)
    };
    let path_loc: u32 = read_field(ctx, config!(cgroup_path))?;

    let Some(scratch) = PATH_SCRATCH.get_ptr_mut(0) else {
        return Err(emit::Error::Read);
    };
    let len = read_data_loc_str(ctx, path_loc, scratch.cast(), PATH_LEN);
    // SAFETY: a per-CPU scratch slot, only used by this program on this CPU.
    if !filter::path_watched(unsafe { &*scratch }, len as usize) {
        return Ok(());
    }

    let mut entry = emit::reserve::<CgroupEvent>(kind)?;
    let record = entry.as_mut_ptr();
    let path_len = read_data_loc_str(
        ctx,
        path_loc,
        // SAFETY: a field of the reserved slot; only its address is taken.
        unsafe { (&raw mut (*record).path).cast() },
        PATH_LEN,
    );
    // SAFETY: `record` is a reserved, exclusively owned slot; every field is written before submit.
    unsafe {
        (*record).header = emit::header(kind, emit::now());
        (*record).id = id;
        (*record).level = level as u32;
        (*record).path_len = path_len;
    }
    emit::submit(kind, entry);
    debug!(
        ctx,
        "cgroup event kind={} id={} level={}", kind as u32, id, level
    );
    Ok(())
}
