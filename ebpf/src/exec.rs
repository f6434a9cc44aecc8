//! `sched/sched_process_exec`: a task in a watched cgroup started a new program. The first exec in
//! a container's cgroup is how the agent learns that a container started.

use aya_ebpf::{
    EbpfContext as _,
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid},
    programs::TracePointContext,
};
use swiftlet_common::{EventKind, ExecEvent, FIELD_ABSENT, PATH_LEN};

use crate::{
    config,
    emit::{self, Result, read_field},
    filter,
};

pub fn try_exec(ctx: &TracePointContext) -> Result<()> {
    let Some(cgroup_id) = filter::current_watched() else {
        return Ok(());
    };
    let pid_tgid = bpf_get_current_pid_tgid();
    let old_pid_field = config!(exec_old_pid);
    let old_pid: i32 = if old_pid_field == FIELD_ABSENT {
        pid_tgid as i32
    } else {
        read_field(ctx, old_pid_field)?
    };
    let filename_loc: u32 = read_field(ctx, config!(exec_filename))?;

    let mut entry = emit::reserve::<ExecEvent>(EventKind::Exec)?;
    let record = entry.as_mut_ptr();
    let filename_len = read_data_loc_str(
        ctx,
        filename_loc,
        // SAFETY: a field of the reserved slot; only its address is taken.
        unsafe { (&raw mut (*record).filename).cast() },
        PATH_LEN,
    );
    // SAFETY: `record` is a reserved, exclusively owned slot; every field is written before submit.
    unsafe {
        (*record).header = emit::header(EventKind::Exec, emit::now());
        (*record).cgroup_id = cgroup_id;
        (*record).pid = pid_tgid as u32;
        (*record).tgid = (pid_tgid >> 32) as u32;
        (*record).old_pid = old_pid as u32;
        (*record).filename_len = filename_len;
        (*record).comm = bpf_get_current_comm().unwrap_or([0; 16]);
    }
    emit::submit(EventKind::Exec, entry);
    Ok(())
}

/// Copies a `__data_loc char[]` tracepoint field (low 16 bits: offset in the record, high 16:
/// length) as a NUL-terminated string into `dst` (capacity `cap`). Returns the length without the
/// NUL; 0 (and an empty string) if the read fails.
#[inline(always)]
pub fn read_data_loc_str(ctx: &TracePointContext, loc: u32, dst: *mut u8, cap: usize) -> u32 {
    let src = (ctx.as_ptr() as *const u8).wrapping_add((loc & 0xffff) as usize);
    // SAFETY: `dst` has room for `cap` bytes; the helper bounds the copy by `cap` and validates
    // `src` itself.
    let copied = unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_kernel_str(dst.cast(), cap as u32, src.cast())
    };
    if copied <= 0 {
        // SAFETY: `dst` has room for at least one byte.
        unsafe { *dst = 0 };
        0
    } else {
        (copied - 1) as u32
    }
}
