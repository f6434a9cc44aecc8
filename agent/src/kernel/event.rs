//! Typed kernel events: the decoded form of the ring-buffer records of `swiftlet-common`, as the
//! rest of the agent (and `swiftlet events --json`) sees them.

use std::path::PathBuf;

use serde::Serialize;
use swiftlet_common::{
    CgroupEvent, EventHeader, EventKind, ExecEvent, ExitEvent, MemcgLevelEvent, OomEvent,
    OomFields, PressureEvent, PressureSource,
};

/// One event from the kernel.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct KernelEvent {
    /// When the kernel saw it (CLOCK_MONOTONIC ns; for an OOM kill, when the victim was chosen).
    pub ts_ns: u64,
    /// When this process decoded it (CLOCK_MONOTONIC ns).
    #[serde(skip)]
    pub received_ns: u64,
    /// The CPU the program ran on.
    #[serde(skip)]
    pub cpu: u32,
    #[serde(flatten)]
    pub body: EventBody,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EventBody {
    Exit(ProcessExit),
    Exec(ProcessExec),
    Oom(OomKill),
    CgroupMkdir(CgroupChange),
    CgroupRmdir(CgroupChange),
    Pressure(MemoryPressure),
    MemcgLevel(MemcgLevel),
}

impl EventBody {
    pub fn kind(&self) -> EventKind {
        match self {
            EventBody::Exit(_) => EventKind::Exit,
            EventBody::Exec(_) => EventKind::Exec,
            EventBody::Oom(_) => EventKind::Oom,
            EventBody::CgroupMkdir(_) => EventKind::CgroupMkdir,
            EventBody::CgroupRmdir(_) => EventKind::CgroupRmdir,
            EventBody::Pressure(_) => EventKind::Pressure,
            EventBody::MemcgLevel(_) => EventKind::MemcgLevel,
        }
    }

    /// The cgroup2 id the event concerns (0 for kswapd waking up, which concerns the node).
    pub fn cgroup_id(&self) -> u64 {
        match self {
            EventBody::Exit(e) => e.cgroup_id,
            EventBody::Exec(e) => e.cgroup_id,
            EventBody::Oom(e) => e.cgroup_id,
            EventBody::CgroupMkdir(e) | EventBody::CgroupRmdir(e) => e.cgroup_id,
            EventBody::Pressure(e) => e.cgroup_id,
            EventBody::MemcgLevel(e) => e.cgroup_id,
        }
    }
}

/// A process (every thread of it) exited.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProcessExit {
    pub cgroup_id: u64,
    /// The process id (thread group id).
    pub pid: u32,
    /// The last thread to exit.
    pub tid: u32,
    pub comm: String,
    /// The exit code, when the process exited by itself.
    pub exit_code: Option<i32>,
    /// The signal that killed it, when one did.
    pub signal: Option<i32>,
    pub core_dumped: bool,
    /// The raw wait status.
    pub wait_status: u32,
}

impl ProcessExit {
    /// The container-runtime convention: the exit code, or 128 + the signal.
    pub fn container_exit_code(&self) -> i32 {
        match (self.exit_code, self.signal) {
            (Some(code), _) => code,
            (None, Some(signal)) => 128 + signal,
            (None, None) => 0,
        }
    }
}

/// Decodes a wait status (`WIFEXITED`/`WIFSIGNALED` as in `<sys/wait.h>`).
pub fn decode_wait_status(status: u32) -> (Option<i32>, Option<i32>, bool) {
    let signal = (status & 0x7f) as i32;
    if signal == 0 {
        (Some(((status >> 8) & 0xff) as i32), None, false)
    } else {
        (None, Some(signal), status & 0x80 != 0)
    }
}

/// A process started a new program.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProcessExec {
    pub cgroup_id: u64,
    pub pid: u32,
    pub tid: u32,
    pub old_pid: u32,
    pub comm: String,
    pub filename: String,
}

/// The OOM killer killed a process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct OomKill {
    pub cgroup_id: u64,
    pub pid: u32,
    pub comm: String,
    /// When the victim exited (CLOCK_MONOTONIC ns).
    pub exit_ts_ns: u64,
    /// Memory figures in KiB, on kernels whose tracepoint has them (6.8+).
    pub total_vm_kb: Option<u64>,
    pub anon_rss_kb: Option<u64>,
    pub file_rss_kb: Option<u64>,
    pub shmem_rss_kb: Option<u64>,
    pub pgtables_kb: Option<u64>,
    pub uid: Option<u32>,
    pub oom_score_adj: Option<i32>,
}

/// A cgroup appeared or went away on the cgroup2 hierarchy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CgroupChange {
    pub cgroup_id: u64,
    pub level: u32,
    /// Relative to the cgroup2 mount, starting with `/`.
    pub path: PathBuf,
}

/// The kernel started reclaiming memory (the event's `ts_ns` is when). Rate limited in the
/// kernel per CPU and source (`LoadOptions::pressure_min_interval`): a storm of reclaim shows as
/// a few of these, with the calls in between counted in `suppressed`, which are not losses.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MemoryPressure {
    /// cgroup2 id of the reclaiming task (`MemcgReclaim`: a task in a watched subtree, charged
    /// to the cgroup at its limit or below it; `DirectReclaim`: any task of the node); 0 for
    /// `KswapdWake`.
    pub cgroup_id: u64,
    #[serde(serialize_with = "serialize_source")]
    pub source: PressureSource,
    /// The allocation order (pages = 2^order) the kernel is reclaiming for, when its tracepoint
    /// says.
    pub order: Option<i32>,
    /// Reclaim calls of this source that the same CPU skipped (rate limit) since its previous
    /// record of this source.
    pub suppressed: u64,
}

/// The pods' memory cgroup reached the level the agent armed (cgroup v2): a charge in its subtree
/// takes its usage there. One per arming (the kernel disarms as it emits).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MemcgLevel {
    /// The watched cgroup's cgroup2 id.
    pub cgroup_id: u64,
    /// Its usage before the charge, in pages.
    pub usage_pages: u64,
    /// The pages charged.
    pub nr_pages: u64,
    /// The armed level, in pages.
    pub level_pages: u64,
}

/// `memcg_reclaim`, `direct_reclaim`, `kswapd_wake`.
fn serialize_source<S: serde::Serializer>(
    source: &PressureSource,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(source.as_str())
}

/// Why a record could not be decoded (a build mismatch between agent and programs).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("record of {len} bytes is shorter than its header")]
    Short { len: usize },
    #[error("unknown event kind {kind}")]
    UnknownKind { kind: u32 },
    #[error("unknown memory-pressure source {raw}")]
    UnknownPressureSource { raw: u32 },
    #[error("{kind} record is {len} bytes, expected {expected}")]
    Size {
        kind: &'static str,
        len: usize,
        expected: usize,
    },
}

/// What a record held besides the event itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordMeta {
    /// Events the same CPU dropped just before this one.
    pub lost_before: u32,
}

/// Decodes one ring-buffer record.
pub fn decode(bytes: &[u8], received_ns: u64) -> Result<(KernelEvent, RecordMeta), DecodeError> {
    let header: EventHeader =
        crate::sys::read_pod(bytes).ok_or(DecodeError::Short { len: bytes.len() })?;
    let kind =
        EventKind::from_raw(header.kind).ok_or(DecodeError::UnknownKind { kind: header.kind })?;
    let expected = kind.record_size();
    if bytes.len() < expected || header.size as usize != expected {
        return Err(DecodeError::Size {
            kind: kind.as_str(),
            len: bytes.len(),
            expected,
        });
    }
    let short = || DecodeError::Short { len: bytes.len() };
    let body = match kind {
        EventKind::Exit => {
            let r: ExitEvent = crate::sys::read_pod(bytes).ok_or_else(short)?;
            let (exit_code, signal, core_dumped) = decode_wait_status(r.exit_code);
            EventBody::Exit(ProcessExit {
                cgroup_id: r.cgroup_id,
                pid: r.tgid,
                tid: r.pid,
                comm: c_string(&r.comm),
                exit_code,
                signal,
                core_dumped,
                wait_status: r.exit_code,
            })
        }
        EventKind::Exec => {
            let r: ExecEvent = crate::sys::read_pod(bytes).ok_or_else(short)?;
            EventBody::Exec(ProcessExec {
                cgroup_id: r.cgroup_id,
                pid: r.tgid,
                tid: r.pid,
                old_pid: r.old_pid,
                comm: c_string(&r.comm),
                filename: c_string(&r.filename),
            })
        }
        EventKind::Oom => {
            let r: OomEvent = crate::sys::read_pod(bytes).ok_or_else(short)?;
            let has = |bit: u32| r.fields & bit != 0;
            let memory = |v: u64| has(OomFields::MEMORY).then_some(v);
            EventBody::Oom(OomKill {
                cgroup_id: r.cgroup_id,
                pid: r.pid,
                comm: c_string(&r.comm),
                exit_ts_ns: r.exit_ts_ns,
                total_vm_kb: memory(r.total_vm_kb),
                anon_rss_kb: memory(r.anon_rss_kb),
                file_rss_kb: memory(r.file_rss_kb),
                shmem_rss_kb: memory(r.shmem_rss_kb),
                pgtables_kb: memory(r.pgtables_kb),
                uid: has(OomFields::UID).then_some(r.uid),
                oom_score_adj: has(OomFields::OOM_SCORE_ADJ).then_some(r.oom_score_adj),
            })
        }
        EventKind::CgroupMkdir | EventKind::CgroupRmdir => {
            let r: CgroupEvent = crate::sys::read_pod(bytes).ok_or_else(short)?;
            let change = CgroupChange {
                cgroup_id: r.id,
                level: r.level,
                path: PathBuf::from(c_string(&r.path)),
            };
            if kind == EventKind::CgroupMkdir {
                EventBody::CgroupMkdir(change)
            } else {
                EventBody::CgroupRmdir(change)
            }
        }
        EventKind::Pressure => {
            let r: PressureEvent = crate::sys::read_pod(bytes).ok_or_else(short)?;
            let source = PressureSource::from_raw(r.source)
                .ok_or(DecodeError::UnknownPressureSource { raw: r.source })?;
            EventBody::Pressure(MemoryPressure {
                cgroup_id: r.cgroup_id,
                source,
                // The programs write -1 when the tracepoint has no `order`; a real order is >= 0.
                order: (r.order >= 0).then_some(r.order),
                suppressed: r.suppressed,
            })
        }
        EventKind::MemcgLevel => {
            let r: MemcgLevelEvent = crate::sys::read_pod(bytes).ok_or_else(short)?;
            EventBody::MemcgLevel(MemcgLevel {
                cgroup_id: r.cgroup_id,
                usage_pages: r.usage_pages,
                nr_pages: r.nr_pages,
                level_pages: r.level_pages,
            })
        }
    };
    Ok((
        KernelEvent {
            ts_ns: header.ts_ns,
            received_ns,
            cpu: header.cpu,
            body,
        },
        RecordMeta {
            lost_before: header.lost_before,
        },
    ))
}

/// The text before the first NUL (kernel strings are NUL-terminated, not always valid UTF-8).
fn c_string(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use swiftlet_common::{COMM_LEN, PATH_LEN};

    fn bytes_of<T: aya::Pod>(value: &T) -> Vec<u8> {
        // SAFETY: `T: Pod` has no padding that is not explicit and initialised.
        unsafe { std::slice::from_raw_parts((value as *const T).cast::<u8>(), size_of::<T>()) }
            .to_vec()
    }

    fn header(kind: EventKind) -> EventHeader {
        EventHeader {
            kind: kind as u32,
            size: kind.record_size() as u32,
            ts_ns: 1000,
            lost_before: 2,
            cpu: 1,
        }
    }

    fn comm(s: &str) -> [u8; COMM_LEN] {
        let mut out = [0; COMM_LEN];
        out[..s.len()].copy_from_slice(s.as_bytes());
        out
    }

    #[test]
    fn wait_statuses() {
        assert_eq!(decode_wait_status(0), (Some(0), None, false));
        assert_eq!(decode_wait_status(3 << 8), (Some(3), None, false));
        assert_eq!(decode_wait_status(9), (None, Some(9), false));
        assert_eq!(decode_wait_status(11 | 0x80), (None, Some(11), true));
    }

    #[test]
    fn decodes_an_exit_record() {
        let record = ExitEvent {
            header: header(EventKind::Exit),
            cgroup_id: 42,
            pid: 101,
            tgid: 100,
            exit_code: 3 << 8,
            _pad: 0,
            comm: comm("sh"),
        };
        let (event, meta) = decode(&bytes_of(&record), 2000).expect("decodes");
        assert_eq!(meta.lost_before, 2);
        assert_eq!(event.ts_ns, 1000);
        assert_eq!(event.received_ns, 2000);
        let EventBody::Exit(exit) = event.body else {
            panic!("not an exit: {event:?}")
        };
        assert_eq!(
            (exit.pid, exit.tid, exit.exit_code, exit.signal),
            (100, 101, Some(3), None)
        );
        assert_eq!(exit.comm, "sh");
        assert_eq!(exit.container_exit_code(), 3);
    }

    #[test]
    fn decodes_cgroup_records_and_serialises_them_as_json_lines() {
        let mut path = [0u8; PATH_LEN];
        path[..5].copy_from_slice(b"/a/bc");
        let record = CgroupEvent {
            header: header(EventKind::CgroupRmdir),
            id: 7,
            level: 2,
            path_len: 5,
            path,
        };
        let (event, _) = decode(&bytes_of(&record), 0).expect("decodes");
        let json = serde_json::to_value(&event).expect("serialises");
        assert_eq!(json["kind"], "cgroup_rmdir");
        assert_eq!(json["cgroup_id"], 7);
        assert_eq!(json["path"], "/a/bc");
        assert_eq!(json["ts_ns"], 1000);
    }

    fn pressure(source: u32, order: i32, suppressed: u64) -> PressureEvent {
        PressureEvent {
            header: header(EventKind::Pressure),
            cgroup_id: 77,
            source,
            order,
            suppressed,
        }
    }

    #[test]
    fn decodes_memcg_level_records() {
        let record = MemcgLevelEvent {
            header: header(EventKind::MemcgLevel),
            cgroup_id: 41,
            usage_pages: 1000,
            nr_pages: 64,
            level_pages: 1024,
        };
        let (event, _) = decode(&bytes_of(&record), 0).expect("decodes");
        assert_eq!(event.body.kind(), EventKind::MemcgLevel);
        assert_eq!(event.body.cgroup_id(), 41);
        assert_eq!(
            event.body,
            EventBody::MemcgLevel(MemcgLevel {
                cgroup_id: 41,
                usage_pages: 1000,
                nr_pages: 64,
                level_pages: 1024,
            })
        );
        let json = serde_json::to_value(&event).expect("serialises");
        assert_eq!(json["kind"], "memcg_level");
        assert_eq!(json["level_pages"], 1024);
        let short = &bytes_of(&record)[..40];
        assert!(matches!(
            decode(short, 0),
            Err(DecodeError::Size {
                kind: "memcg_level",
                ..
            })
        ));
    }

    #[test]
    fn decodes_pressure_records_of_every_source() {
        let cases = [
            (PressureSource::MemcgReclaim, 0, 0, Some(0), "memcg_reclaim"),
            (
                PressureSource::DirectReclaim,
                3,
                12,
                Some(3),
                "direct_reclaim",
            ),
            (PressureSource::KswapdWake, -1, 5000, None, "kswapd_wake"),
        ];
        for (source, raw_order, suppressed, order, name) in cases {
            let record = pressure(source as u32, raw_order, suppressed);
            let (event, meta) = decode(&bytes_of(&record), 3000).expect("decodes");
            assert_eq!(meta.lost_before, 2);
            assert_eq!(event.body.kind(), EventKind::Pressure);
            assert_eq!(event.body.cgroup_id(), 77);
            assert_eq!(
                event.body,
                EventBody::Pressure(MemoryPressure {
                    cgroup_id: 77,
                    source,
                    order,
                    suppressed,
                }),
                "{name}"
            );
            let json = serde_json::to_value(&event).expect("serialises");
            assert_eq!(json["kind"], "pressure");
            assert_eq!(json["source"], name);
            assert_eq!(json["suppressed"], suppressed);
            assert_eq!(
                json["order"],
                order.map_or(serde_json::Value::Null, |o| o.into())
            );
        }
    }

    #[test]
    fn rejects_pressure_records_of_unknown_sources_and_sizes() {
        assert_eq!(
            decode(&bytes_of(&pressure(9, 0, 0)), 0).err(),
            Some(DecodeError::UnknownPressureSource { raw: 9 })
        );
        let record = bytes_of(&pressure(PressureSource::MemcgReclaim as u32, 0, 0));
        assert!(matches!(
            decode(&record[..record.len() - 8], 0),
            Err(DecodeError::Size {
                kind: "pressure",
                ..
            })
        ));
    }

    #[test]
    fn rejects_unknown_kinds_and_wrong_sizes() {
        let mut h = header(EventKind::Exit);
        h.kind = 99;
        assert_eq!(
            decode(&bytes_of(&h), 0).err(),
            Some(DecodeError::UnknownKind { kind: 99 })
        );
        let h = header(EventKind::Exit);
        assert!(matches!(
            decode(&bytes_of(&h), 0),
            Err(DecodeError::Size { .. })
        ));
        assert!(matches!(
            decode(&[0u8; 4], 0),
            Err(DecodeError::Short { len: 4 })
        ));
    }
}
