//! `oom/mark_victim`: the OOM killer chose a victim. The tracepoint runs in the killer's context
//! and names the victim only by pid, so the record is parked in `OOM_PENDING` and emitted from the
//! victim's own exit (`exit.rs` calls [`settle_victim`] for every task exit), where the victim's
//! cgroup is the current one: no race with the victim being reaped, on every kernel. The record
//! keeps the kill's timestamp and precedes the victim's exit record in the ring.

use aya_ebpf::{
    helpers::bpf_get_current_comm, macros::map, maps::LruHashMap, programs::TracePointContext,
};
use swiftlet_common::{COMM_LEN, EventKind, FIELD_ABSENT, OomEvent, OomFields};

use crate::{
    config,
    emit::{self, Result, read_field},
    exec::read_data_loc_str,
    filter,
};

/// Victims chosen but not yet exited, by pid. Bounded and LRU: a victim that never exits (a
/// kernel bug) cannot pin an entry forever.
#[map]
static OOM_PENDING: LruHashMap<u32, OomEvent> = LruHashMap::with_max_entries(1024, 0);

pub fn try_mark_victim(ctx: &TracePointContext) -> Result<()> {
    let pid: i32 = read_field(ctx, config!(oom_pid))?;
    let mut record = OomEvent {
        header: emit::header_unsubmitted(EventKind::Oom, emit::now()),
        cgroup_id: 0,
        pid: pid as u32,
        tgid: 0,
        exit_ts_ns: 0,
        total_vm_kb: 0,
        anon_rss_kb: 0,
        file_rss_kb: 0,
        shmem_rss_kb: 0,
        pgtables_kb: 0,
        uid: 0,
        oom_score_adj: 0,
        fields: 0,
        _pad: 0,
        comm: [0; COMM_LEN],
    };
    let comm = config!(oom_comm);
    if comm != FIELD_ABSENT {
        let loc: u32 = read_field(ctx, comm)?;
        if read_data_loc_str(ctx, loc, record.comm.as_mut_ptr(), COMM_LEN) > 0 {
            record.fields |= OomFields::COMM;
        }
    }
    let total_vm = config!(oom_total_vm);
    if total_vm != FIELD_ABSENT {
        record.total_vm_kb = read_field(ctx, total_vm)?;
        record.anon_rss_kb = read_optional(ctx, config!(oom_anon_rss))?;
        record.file_rss_kb = read_optional(ctx, config!(oom_file_rss))?;
        record.shmem_rss_kb = read_optional(ctx, config!(oom_shmem_rss))?;
        record.pgtables_kb = read_optional(ctx, config!(oom_pgtables))?;
        record.fields |= OomFields::MEMORY;
    }
    let uid = config!(oom_uid);
    if uid != FIELD_ABSENT {
        record.uid = read_field(ctx, uid)?;
        record.fields |= OomFields::UID;
    }
    let score_adj = config!(oom_score_adj);
    if score_adj != FIELD_ABSENT {
        let adj: i16 = read_field(ctx, score_adj)?;
        record.oom_score_adj = i32::from(adj);
        record.fields |= OomFields::OOM_SCORE_ADJ;
    }
    OOM_PENDING
        .insert(record.pid, record, 0)
        .map_err(emit::Error::from)
}

fn read_optional(ctx: &TracePointContext, field: u32) -> Result<u64> {
    if field == FIELD_ABSENT {
        return Ok(0);
    }
    read_field(ctx, field)
}

/// Emits the pending OOM record of task `pid`, if it has one, now that it exits.
#[inline(always)]
pub fn settle_victim(pid: u32, tgid: u32) {
    let Some(pending) = OOM_PENDING.get_ptr(pid) else {
        return;
    };
    if let Some(cgroup_id) = filter::current_watched()
        && let Ok(mut entry) = emit::reserve::<OomEvent>(EventKind::Oom)
    {
        let record = entry.as_mut_ptr();
        // SAFETY: `pending` points at a live map value of the same type (the map entry is
        // only removed below); `record` is a reserved, exclusively owned slot.
        unsafe {
            core::ptr::copy_nonoverlapping(pending, record, 1);
            let killed_at = (*record).header.ts_ns;
            (*record).header = emit::header(EventKind::Oom, killed_at);
            (*record).cgroup_id = cgroup_id;
            (*record).tgid = tgid;
            (*record).exit_ts_ns = emit::now();
            if (*record).fields & OomFields::COMM == 0 {
                (*record).comm = bpf_get_current_comm().unwrap_or([0; COMM_LEN]);
                (*record).fields |= OomFields::COMM;
            }
        }
        emit::submit(EventKind::Oom, entry);
    }
    let _ = OOM_PENDING.remove(pid);
}
