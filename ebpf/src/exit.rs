//! `sched/sched_process_exit`: one record when a whole thread group is gone, with the wait status.
//! Every task exit also settles a pending OOM kill of that task (see `oom.rs`).

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_task},
    macros::map,
    maps::LruHashMap,
    programs::TracePointContext,
};
use swiftlet_common::{EventKind, ExitEvent, FIELD_ABSENT, SIGNAL_GROUP_EXIT};

use crate::{
    config,
    emit::{self, Result, read_field, read_kernel},
    filter, oom,
};

/// Key of [`EXIT_SEEN`]: a thread group, identified by its `signal_struct` and tgid.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ExitKey {
    signal: u64,
    tgid: u32,
    _pad: u32,
}

/// On kernels whose tracepoint lacks `group_dead`, two threads exiting together can both find
/// `signal->live == 0`; the first to insert here reports the exit.
#[map]
static EXIT_SEEN: LruHashMap<ExitKey, u8> = LruHashMap::with_max_entries(4096, 0);

const BPF_NOEXIST: u64 = 1;

pub fn try_exit(ctx: &TracePointContext) -> Result<()> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = pid_tgid as u32;
    let tgid = (pid_tgid >> 32) as u32;

    oom::settle_victim(pid, tgid);

    // SAFETY: a helper without preconditions; the result is only used as a kernel address.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let signal: *const u8 = read_kernel(task, config!(task_signal))?;

    if !group_dead(ctx, signal, tgid)? {
        return Ok(());
    }
    let Some(cgroup_id) = filter::current_watched() else {
        return Ok(());
    };
    let exit_code = wait_status(task, signal)?;

    let mut entry = emit::reserve::<ExitEvent>(EventKind::Exit)?;
    let record = entry.as_mut_ptr();
    // SAFETY: `record` points at a reserved, exclusively owned ring-buffer slot of the right size;
    // every field is written before submit.
    unsafe {
        (*record).header = emit::header(EventKind::Exit, emit::now());
        (*record).cgroup_id = cgroup_id;
        (*record).pid = pid;
        (*record).tgid = tgid;
        (*record).exit_code = exit_code;
        (*record)._pad = 0;
        (*record).comm = bpf_get_current_comm().unwrap_or([0; 16]);
    }
    emit::submit(EventKind::Exit, entry);
    Ok(())
}

fn group_dead(ctx: &TracePointContext, signal: *const u8, tgid: u32) -> Result<bool> {
    let field = config!(exit_group_dead);
    if field != FIELD_ABSENT {
        let dead: u8 = read_field(ctx, field)?;
        return Ok(dead != 0);
    }
    // `live` is an atomic_t: its int counter is at the field's offset.
    let live: i32 = read_kernel(signal, config!(signal_live))?;
    if live != 0 {
        return Ok(false);
    }
    let key = ExitKey {
        signal: signal as u64,
        tgid,
        _pad: 0,
    };
    Ok(EXIT_SEEN.insert(key, 1, BPF_NOEXIST).is_ok())
}

/// The status the parent's wait() will see: the group's code once a group exit began (exit_group,
/// fatal signal, or the last thread's own exit, which the kernel records as a group exit too),
/// else this task's own code.
fn wait_status(task: *const u8, signal: *const u8) -> Result<u32> {
    let flags: u32 = read_kernel(signal, config!(signal_flags))?;
    let code: i32 = if flags & SIGNAL_GROUP_EXIT != 0 {
        read_kernel(signal, config!(signal_group_exit_code))?
    } else {
        read_kernel(task, config!(task_exit_code))?
    };
    Ok(code as u32)
}
