//! Loading: privileges and kernel checks with a clear error each, the per-kernel configuration
//! (tracepoint formats + BTF offsets), the object itself, the filter, then attaching. The
//! process, OOM and cgroup programs are mandatory; the memory-pressure ones are optional (a
//! kernel without one of the `vmscan` tracepoints loses only that source, with one warning), and
//! so is the memory cgroup level trigger (`memcg.rs`: cgroup v2 only, fentry).

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, MapData, PerCpuArray, RingBuf},
    programs::TracePoint,
};
use swiftlet_common::{
    DEFAULT_PRESSURE_MIN_INTERVAL_NS, FIELD_ABSENT, KindCounters, PressureSource, ProgramConfig,
    names,
};

use super::{
    Error, FilterHandle, KernelBtf, MemcgLayout, MemcgTrigger, TaskLayout, Watch,
    counters::CounterReader, stream::RingReader, tracefs, tracefs::Format,
};
use crate::cgroup::CgroupLayout;

/// The programs, built by `build.rs` from the `ebpf` crate. The scheduler audit loads the same
/// object (its own programs only).
pub(super) static OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/swiftlet-ebpf"));

/// What to load and how.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Size of the events ring buffer: a power-of-two multiple of the page size.
    pub ring_bytes: u32,
    /// Subtrees to watch (paths on, or relative to, the cgroup2 mount); empty = whole machine.
    pub watch: Vec<PathBuf>,
    pub tracefs: PathBuf,
    pub btf: PathBuf,
    /// At most one memory-pressure record per source per CPU in this interval (zero: every
    /// reclaim call makes one).
    pub pressure_min_interval: Duration,
    /// Attach the memory cgroup level programs (cgroup v2; see [`KernelEvents::memcg_trigger`]).
    pub memcg_level: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            ring_bytes: swiftlet_common::DEFAULT_RING_BYTES,
            watch: Vec::new(),
            tracefs: PathBuf::from(tracefs::TRACEFS),
            btf: PathBuf::from("/sys/kernel/btf/vmlinux"),
            pressure_min_interval: Duration::from_nanos(DEFAULT_PRESSURE_MIN_INTERVAL_NS),
            memcg_level: true,
        }
    }
}

/// What was found out while loading, for logs, `/healthz` and tests.
#[derive(Clone, Debug)]
pub struct LoadInfo {
    pub layout: CgroupLayout,
    pub cgroup2_root: PathBuf,
    /// Whether the exit tracepoint has `group_dead` (6.16+) or the program falls back to
    /// `signal->live`.
    pub exit_group_dead_field: bool,
    /// Whether `oom:mark_victim` carries memory figures (6.8+, and backported: Debian's 6.1).
    pub oom_memory_fields: bool,
    /// The memory-pressure sources whose tracepoint is attached (all three on 6.1+ kernels; a
    /// missing one was warned about at load).
    pub pressure_sources: Vec<PressureSource>,
    /// Every program attached, by name.
    pub programs: Vec<&'static str>,
    /// Whether the memory cgroup level trigger is attached, or why not (not asked for, not
    /// cgroup v2, no BTF or fentry for it).
    pub memcg_level: Result<(), String>,
    pub config: ProgramConfig,
    pub ring_bytes: u32,
}

/// The loaded programs and the stream of their events. Dropping it detaches everything.
pub struct KernelEvents {
    // Field order is drop order: stop reading before the programs go.
    pub(super) ring: RingReader,
    pub(super) counters: CounterReader,
    pub(super) filter: FilterHandle,
    pub(super) info: LoadInfo,
    memcg: Option<MemcgTrigger>,
    _logger: Option<tokio::task::JoinHandle<()>>,
    _ebpf: Ebpf,
}

impl Drop for KernelEvents {
    fn drop(&mut self) {
        if let Some(logger) = &self._logger {
            logger.abort();
        }
    }
}

impl KernelEvents {
    /// Loads and attaches the programs. Needs a tokio runtime (the ring buffer is polled through
    /// it).
    pub fn load(options: &LoadOptions) -> Result<KernelEvents, Error> {
        // What the user gave is checked first: a typo is reported as such, root or not.
        let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .unwrap_or(4096) as u64;
        let bytes = u64::from(options.ring_bytes);
        if bytes < page || !bytes.is_power_of_two() || bytes % page != 0 {
            return Err(Error::RingSize {
                bytes: options.ring_bytes,
                page,
            });
        }
        let layout = CgroupLayout::detect()?;
        let cgroup2_root = layout.cgroup2_root()?.to_owned();
        let watches = options
            .watch
            .iter()
            .map(|p| Watch::resolve(p, &cgroup2_root))
            .collect::<Result<Vec<_>, _>>()?;
        if watches.len() > swiftlet_common::MAX_WATCHED as usize {
            return Err(Error::TooManyWatched {
                given: watches.len(),
                max: swiftlet_common::MAX_WATCHED as usize,
            });
        }

        check_privileges()?;
        super::features::require(super::features::EVENT_PROGRAMS)?;
        let btf = KernelBtf::open(&options.btf)?;
        let task = btf.task_layout()?;
        tracefs::ensure_mounted(&options.tracefs)?;
        let mut config = program_config(&options.tracefs, &task)?;
        config.pressure_min_interval_ns =
            u64::try_from(options.pressure_min_interval.as_nanos()).unwrap_or(u64::MAX);
        let memcg_layout = if !options.memcg_level {
            Err("not asked for".to_owned())
        } else if !matches!(layout, CgroupLayout::Unified { .. }) {
            Err(format!(
                "the memory controller is not on cgroup v2 ({} layout)",
                layout.name()
            ))
        } else {
            btf.memcg_layout().map_err(|error| {
                tracing::warn!(%error, "memory cgroup level programs not loaded");
                error.to_string()
            })
        };
        if let Ok(memcg) = &memcg_layout {
            set_memcg_layout(&mut config, memcg);
        }

        raise_memlock_limit();
        let log_level = log::max_level() as u8;
        let mut loader = EbpfLoader::new();
        loader
            .override_global(names::CONFIG, &config, true)
            .override_global("AYA_LOG_LEVEL", &log_level, false)
            .map_max_entries(names::EVENTS, options.ring_bytes);
        // Every load creates every map of the object: the scheduler audit's, unused here, are
        // kept to one entry (its per-CPU histograms would take megabytes on a large node).
        for map in names::SCHED_MAPS {
            loader.map_max_entries(map, 1);
        }
        let mut ebpf = loader.load(OBJECT).map_err(Error::Load)?;

        let logger = start_logger(&mut ebpf);
        let filter = FilterHandle::new(
            take_map::<Array<MapData, _>>(&mut ebpf, names::WATCHED)?,
            take_map::<Array<MapData, _>>(&mut ebpf, names::WATCH_COUNT)?,
        );
        // The filter is in place before the first program runs.
        filter.set(&watches)?;
        let counters: PerCpuArray<MapData, KindCounters> = take_map(&mut ebpf, names::COUNTERS)?;
        let lost_total: PerCpuArray<MapData, u64> = take_map(&mut ebpf, names::LOST_TOTAL)?;
        let ring: RingBuf<MapData> = take_map(&mut ebpf, names::EVENTS)?;
        let ring = crate::sys::register_readable(ring).map_err(Error::Io)?;

        for (program, category, name) in names::PROGRAMS {
            attach(&mut ebpf, program, category, name)?;
        }
        let pressure_sources = attach_pressure(&mut ebpf);
        let memcg = memcg_layout.and_then(|_| {
            super::memcg::attach(&mut ebpf, &options.btf, &btf).map_err(|error| {
                tracing::warn!(
                    %error,
                    hint = error.hint().unwrap_or_default(),
                    "memory cgroup level programs not attached"
                );
                error.to_string()
            })
        });
        let memcg_programs = names::MEMCG_PROGRAMS
            .iter()
            .map(|(program, _)| *program)
            .filter(|_| memcg.is_ok());
        let programs = names::PROGRAMS
            .iter()
            .map(|(program, _, _)| *program)
            .chain(pressure_sources.iter().map(|s| s.program().0))
            .chain(memcg_programs)
            .collect();
        let info = LoadInfo {
            layout,
            cgroup2_root,
            exit_group_dead_field: config.exit_group_dead != FIELD_ABSENT,
            oom_memory_fields: config.oom_total_vm != FIELD_ABSENT,
            pressure_sources,
            programs,
            memcg_level: memcg.as_ref().map(|_| ()).map_err(Clone::clone),
            config,
            ring_bytes: options.ring_bytes,
        };
        tracing::info!(
            cgroup_layout = info.layout.name(),
            cgroup2 = %info.cgroup2_root.display(),
            watched = watches.len(),
            ring_bytes = options.ring_bytes,
            exit_group_dead_field = info.exit_group_dead_field,
            pressure = ?info.pressure_sources.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
            memcg_level = ?info.memcg_level,
            "kernel event programs attached"
        );
        Ok(KernelEvents {
            ring: RingReader::new(ring, lost_total),
            counters: CounterReader::new(Arc::new(counters)),
            filter,
            info,
            memcg: memcg.ok(),
            _logger: logger,
            _ebpf: ebpf,
        })
    }

    pub fn info(&self) -> &LoadInfo {
        &self.info
    }

    /// A handle to change the watched subtrees while events flow.
    pub fn filter(&self) -> FilterHandle {
        self.filter.clone()
    }

    /// The memory cgroup level trigger, when attached (see [`LoadInfo::memcg_level`]).
    pub fn memcg_trigger(&self) -> Option<MemcgTrigger> {
        self.memcg.clone()
    }

    /// A handle to read the kernel's per-kind counters from elsewhere (e.g. a metrics scrape).
    pub fn counters(&self) -> CounterReader {
        self.counters.clone()
    }
}

/// Resolves every tracepoint field and struct offset the programs read.
pub fn program_config(tracefs_root: &Path, task: &TaskLayout) -> Result<ProgramConfig, Error> {
    let exit = Format::read(tracefs_root, "sched", "sched_process_exit")?;
    let exec = Format::read(tracefs_root, "sched", "sched_process_exec")?;
    let oom = Format::read(tracefs_root, "oom", "mark_victim")?;
    let mkdir = Format::read(tracefs_root, "cgroup", "cgroup_mkdir")?;
    let rmdir = Format::read(tracefs_root, "cgroup", "cgroup_rmdir")?;
    if mkdir.fields != rmdir.fields {
        // One program reads both; they are one event class in the kernel.
        return Err(Error::TracepointField {
            tracepoint: "cgroup/cgroup_rmdir".into(),
            field: "layout equal to cgroup_mkdir's".into(),
        });
    }
    let id_size = mkdir.field("id").map_or(0, |f| f.size);
    if id_size != 4 && id_size != 8 {
        return Err(Error::TracepointField {
            tracepoint: "cgroup/cgroup_mkdir".into(),
            field: "id (4 or 8 bytes)".into(),
        });
    }
    // Optional: a missing tracepoint (or field) leaves its offset absent; the attach of that
    // program then fails and is warned about (`attach_pressure`).
    let pressure_order = |source: PressureSource| {
        let (_, category, name) = source.program();
        Format::read(tracefs_root, category, name).map_or(FIELD_ABSENT, |f| f.optional("order"))
    };
    Ok(ProgramConfig {
        task_signal: task.task_signal,
        task_exit_code: task.task_exit_code,
        signal_flags: task.signal_flags,
        signal_group_exit_code: task.signal_group_exit_code,
        signal_live: task.signal_live,
        exit_group_dead: exit.optional("group_dead"),
        exec_filename: exec.required("filename")?,
        exec_pid: exec.required("pid")?,
        exec_old_pid: exec.optional("old_pid"),
        oom_pid: oom.required("pid")?,
        oom_comm: oom.optional("comm"),
        oom_total_vm: oom.optional("total_vm"),
        oom_anon_rss: oom.optional("anon_rss"),
        oom_file_rss: oom.optional("file_rss"),
        oom_shmem_rss: oom.optional("shmem_rss"),
        oom_uid: oom.optional("uid"),
        oom_pgtables: oom.optional("pgtables"),
        oom_score_adj: oom.optional("oom_score_adj"),
        cgroup_root: mkdir.required("root")?,
        cgroup_level: mkdir.required("level")?,
        cgroup_id: mkdir.required("id")?,
        cgroup_id_size: id_size,
        cgroup_path: mkdir.required("path")?,
        cgroup2_hierarchy_id: 0,
        pressure_memcg_order: pressure_order(PressureSource::MemcgReclaim),
        pressure_direct_order: pressure_order(PressureSource::DirectReclaim),
        pressure_kswapd_order: pressure_order(PressureSource::KswapdWake),
        // The scheduler audit's program is not loaded with these (see `sched::SchedAudit::load`).
        task_pid: FIELD_ABSENT,
        task_run_delay: FIELD_ABSENT,
        _pad: 0,
        pressure_min_interval_ns: DEFAULT_PRESSURE_MIN_INTERVAL_NS,
        // Set by `set_memcg_layout` when the trigger is wanted and the BTF has the structs.
        ..ProgramConfig::UNSET
    })
}

/// The memory cgroup level programs' offsets.
pub fn set_memcg_layout(config: &mut ProgramConfig, layout: &MemcgLayout) {
    config.memcg_pc_usage = layout.pc_usage;
    config.memcg_pc_parent = layout.pc_parent;
    config.memcg_css = layout.memcg_css;
    config.memcg_memory = layout.memcg_memory;
    config.memcg_css_cgroup = layout.css_cgroup;
    config.memcg_cgroup_kn = layout.cgroup_kn;
    config.memcg_kn_id = layout.kn_id;
}

/// Root, or CAP_SYS_ADMIN, or CAP_BPF with CAP_PERFMON (Linux 5.8+).
pub(super) fn check_privileges() -> Result<(), Error> {
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_PERFMON: u32 = 38;
    const CAP_BPF: u32 = 39;
    let effective = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        })
        .unwrap_or(0);
    let has = |cap: u32| effective & (1 << cap) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        return Ok(());
    }
    let missing: Vec<&str> = [
        (CAP_BPF, "CAP_BPF"),
        (CAP_PERFMON, "CAP_PERFMON"),
        (CAP_SYS_ADMIN, "CAP_SYS_ADMIN"),
    ]
    .into_iter()
    .filter(|(cap, _)| !has(*cap))
    .map(|(_, name)| name)
    .collect();
    let who = if nix::unistd::geteuid().is_root() {
        "root without"
    } else {
        "not root, no"
    };
    Err(Error::NotPrivileged {
        missing: format!("{who} {}", missing.join(", ")),
    })
}

/// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK; later ones ignore it.
pub(super) fn raise_memlock_limit() {
    use nix::sys::resource::{RLIM_INFINITY, Resource, setrlimit};
    if let Err(errno) = setrlimit(Resource::RLIMIT_MEMLOCK, RLIM_INFINITY, RLIM_INFINITY) {
        tracing::debug!(%errno, "could not raise RLIMIT_MEMLOCK (only matters before Linux 5.11)");
    }
}

pub(super) fn take_map<M>(ebpf: &mut Ebpf, name: &'static str) -> Result<M, Error>
where
    M: TryFrom<aya::maps::Map, Error = aya::maps::MapError>,
{
    let map = ebpf
        .take_map(name)
        .ok_or(Error::Missing { what: "map", name })?;
    M::try_from(map).map_err(|source| Error::Map { map: name, source })
}

/// The program `name` of the object, as its type `P`.
pub(super) fn program_mut<'a, P>(
    ebpf: &'a mut Ebpf,
    program: &'static str,
) -> Result<&'a mut P, Error>
where
    &'a mut P: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    ebpf.program_mut(program)
        .ok_or(Error::Missing {
            what: "program",
            name: program,
        })?
        .try_into()
        .map_err(|source| Error::Program { program, source })
}

pub(super) fn attach(
    ebpf: &mut Ebpf,
    program: &'static str,
    category: &str,
    tracepoint: &str,
) -> Result<(), Error> {
    let prog: &mut TracePoint = program_mut(ebpf, program)?;
    prog.load()
        .map_err(|source| Error::Program { program, source })?;
    prog.attach(category, tracepoint)
        .map_err(|source| Error::Program { program, source })?;
    Ok(())
}

/// Attaches the memory-pressure programs that this kernel has a tracepoint for; says which.
fn attach_pressure(ebpf: &mut Ebpf) -> Vec<PressureSource> {
    let mut attached = Vec::with_capacity(PressureSource::ALL.len());
    for source in PressureSource::ALL {
        let (program, category, name) = source.program();
        match attach(ebpf, program, category, name) {
            Ok(()) => attached.push(source),
            Err(error) => tracing::warn!(
                tracepoint = format!("{category}:{name}"),
                %error,
                "memory-pressure tracepoint not attached: no {} events on this kernel",
                source.as_str()
            ),
        }
    }
    attached
}

/// Forwards the programs' aya-log records to `log`, which `tracing` picks up.
fn start_logger(ebpf: &mut Ebpf) -> Option<tokio::task::JoinHandle<()>> {
    let logger = match aya_log::EbpfLogger::init(ebpf) {
        Ok(logger) => logger,
        Err(error) => {
            tracing::debug!(%error, "eBPF programs log nothing this build");
            return None;
        }
    };
    let mut logger = match crate::sys::register_readable(logger) {
        Ok(fd) => fd,
        Err(error) => {
            tracing::warn!(%error, "cannot poll the eBPF log buffer; program logs are dropped");
            return None;
        }
    };
    Some(tokio::spawn(async move {
        loop {
            let Ok(mut guard) = logger.readable_mut().await else {
                return;
            };
            guard.get_inner_mut().flush();
            guard.clear_ready();
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TASK: TaskLayout = TaskLayout {
        task_signal: 1,
        task_exit_code: 2,
        signal_flags: 3,
        signal_group_exit_code: 4,
        signal_live: 5,
    };

    /// A tracefs with the mandatory tracepoints (6.18 layouts) and the given `vmscan` ones.
    fn fake_tracefs(vmscan: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        let field = |decl: &str, offset: u32, size: u32| {
            format!("\tfield:{decl};\toffset:{offset};\tsize:{size};\tsigned:0;\n")
        };
        let cgroup = [
            field("int root", 8, 4),
            field("int level", 12, 4),
            field("u64 id", 16, 8),
            field("__data_loc char[] path", 24, 4),
        ]
        .concat();
        let formats = [
            ("sched", "sched_process_exit", field("pid_t pid", 24, 4)),
            (
                "sched",
                "sched_process_exec",
                [
                    field("__data_loc char[] filename", 8, 4),
                    field("pid_t pid", 12, 4),
                ]
                .concat(),
            ),
            ("oom", "mark_victim", field("int pid", 8, 4)),
            ("cgroup", "cgroup_mkdir", cgroup.clone()),
            ("cgroup", "cgroup_rmdir", cgroup),
        ];
        let vmscan = vmscan
            .iter()
            .map(|(name, body)| ("vmscan", *name, (*body).to_owned()));
        for (category, name, body) in formats.into_iter().chain(vmscan) {
            let tp = dir.path().join("events").join(category).join(name);
            std::fs::create_dir_all(&tp).expect("mkdir");
            std::fs::write(tp.join("format"), format!("name: {name}\nformat:\n{body}"))
                .expect("write format");
        }
        dir
    }

    #[test]
    fn pressure_offsets_come_from_the_vmscan_formats() {
        let reclaim = "\tfield:int order;\toffset:8;\tsize:4;\tsigned:1;\n";
        let kswapd = "\tfield:int nid;\toffset:8;\tsize:4;\tsigned:1;\n\
                      \tfield:int zid;\toffset:12;\tsize:4;\tsigned:1;\n\
                      \tfield:int order;\toffset:16;\tsize:4;\tsigned:1;\n";
        let tracefs = fake_tracefs(&[
            ("mm_vmscan_memcg_reclaim_begin", reclaim),
            ("mm_vmscan_direct_reclaim_begin", reclaim),
            ("mm_vmscan_kswapd_wake", kswapd),
        ]);
        let config = program_config(tracefs.path(), &TASK).expect("config");
        assert_eq!(
            (
                config.pressure_memcg_order,
                config.pressure_direct_order,
                config.pressure_kswapd_order
            ),
            (8, 8, 16)
        );
        assert_eq!(
            config.pressure_min_interval_ns,
            DEFAULT_PRESSURE_MIN_INTERVAL_NS
        );
    }

    #[test]
    fn missing_vmscan_tracepoints_are_not_an_error() {
        // A kernel without kswapd_wake, and one whose direct reclaim tracepoint lost `order`.
        let tracefs = fake_tracefs(&[
            (
                "mm_vmscan_memcg_reclaim_begin",
                "\tfield:int order;\toffset:8;\tsize:4;\tsigned:1;\n",
            ),
            (
                "mm_vmscan_direct_reclaim_begin",
                "\tfield:unsigned long gfp_flags;\toffset:16;\tsize:8;\tsigned:0;\n",
            ),
        ]);
        let config = program_config(tracefs.path(), &TASK).expect("config");
        assert_eq!(config.pressure_memcg_order, 8);
        assert_eq!(config.pressure_direct_order, FIELD_ABSENT);
        assert_eq!(config.pressure_kswapd_order, FIELD_ABSENT);
        assert_eq!(
            config.exec_filename, 8,
            "the mandatory fields are still read"
        );
    }
}
