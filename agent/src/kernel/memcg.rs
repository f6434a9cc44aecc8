//! The memory cgroup level trigger (cgroup v2): attaching the charge programs of
//! `ebpf/src/memcg.rs` and the handle that points them at one cgroup and arms a level. A crossing
//! arrives as a [`super::MemcgLevel`] event on the ordinary stream, once per arming.
//!
//! Optional: a kernel without BTF for the three functions, without fentry (no ftrace), or a
//! machine whose memory controller is not on cgroup v2 loses only this (one warning at load);
//! the eviction manager then polls `memory.current` instead. Not here: which level (the
//! eviction manager's wake-ups). No upstream counterpart.

use std::{
    fs::OpenOptions,
    io::Read as _,
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use aya::{
    Btf, Ebpf, Endianness,
    maps::{Array, MapData},
    programs::FEntry,
};
use swiftlet_common::{MemcgWatch, names};

use super::{
    Error, KernelBtf,
    loader::{program_mut, take_map},
};
use crate::lock::MutexExt as _;

/// Reads of `memory.current` the discovery may take: the first one normally does it; more
/// only cover a read the program missed (another CPU's store to the trigger in between).
const DISCOVERY_READS: usize = 3;

/// The trigger's handle: cheap to clone. The programs stay attached as long as the
/// [`super::KernelEvents`] that made it lives.
#[derive(Clone)]
pub struct MemcgTrigger {
    watch: Arc<Mutex<Array<MapData, MemcgWatch>>>,
}

impl std::fmt::Debug for MemcgTrigger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemcgTrigger").finish_non_exhaustive()
    }
}

impl MemcgTrigger {
    /// Points the trigger at the cgroup2 directory `dir` (which must have the memory
    /// controller), disarmed: its cgroup2 id is set, then this process reads its
    /// `memory.current`, which the discovery program turns into the counter's address. Returns
    /// the cgroup2 id. Called again when the directory was re-created (a new id).
    pub fn watch(&self, dir: &Path) -> Result<u64, Error> {
        let cgroup_id = super::cgroup_id_of(dir).map_err(cgroup_error(dir))?;
        self.set(MemcgWatch {
            counter: 0,
            level_pages: u64::MAX,
            cgroup_id,
            armed: 0,
            agent_tgid: std::process::id(),
        })?;
        let current = dir.join("memory.current");
        for _ in 0..DISCOVERY_READS {
            read_current(&current)?;
            if self.get()?.counter != 0 {
                return Ok(cgroup_id);
            }
        }
        Err(Error::MemcgDiscovery { path: current })
    }

    /// Arms the trigger: the next charge that takes the watched cgroup's usage to `level_pages`
    /// or past it makes one record, and disarms it.
    pub fn arm(&self, level_pages: u64) -> Result<(), Error> {
        let mut watch = self.get()?;
        watch.level_pages = level_pages;
        watch.armed = 1;
        self.set(watch)
    }

    pub fn disarm(&self) -> Result<(), Error> {
        let mut watch = self.get()?;
        watch.armed = 0;
        self.set(watch)
    }

    /// The trigger as the programs see it now.
    pub fn get(&self) -> Result<MemcgWatch, Error> {
        self.watch
            .lock_unpoisoned()
            .get(&0, 0)
            .map_err(|source| Error::Map {
                map: names::MEMCG_WATCH,
                source,
            })
    }

    fn set(&self, watch: MemcgWatch) -> Result<(), Error> {
        self.watch
            .lock_unpoisoned()
            .set(0, watch, 0)
            .map_err(|source| Error::Map {
                map: names::MEMCG_WATCH,
                source,
            })
    }
}

/// One read of a `memory.current`, in bytes. Opened without following a symlink: the
/// directory is the agent's, but a cgroup tree may be delegated.
pub fn read_current(path: &Path) -> Result<u64, Error> {
    let mut text = String::new();
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .and_then(|mut f| f.read_to_string(&mut text))
        .map_err(cgroup_error(path))?;
    text.trim().parse().map_err(|_| Error::CgroupFile {
        path: path.to_owned(),
        source: std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not a byte count: {:?}", text.trim()),
        ),
    })
}

fn cgroup_error(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::CgroupFile {
        path: path.to_owned(),
        source,
    }
}

/// Loads and attaches the three programs (the layout is already in `CONFIG`), discovery last so
/// that nothing is learnt before the charges are watched. Any failure leaves the trigger out.
pub(super) fn attach(
    ebpf: &mut Ebpf,
    btf_path: &Path,
    kernel_btf: &KernelBtf,
) -> Result<MemcgTrigger, Error> {
    for (_, function) in names::MEMCG_PROGRAMS {
        if !kernel_btf.has_function(function) {
            return Err(Error::KernelFunction { function });
        }
    }
    let btf = Btf::parse_file(btf_path, Endianness::default()).map_err(|e| Error::Btf {
        path: PathBuf::from(btf_path),
        reason: e.to_string(),
    })?;
    let watch: Array<MapData, MemcgWatch> = take_map(ebpf, names::MEMCG_WATCH)?;
    for (program, function) in names::MEMCG_PROGRAMS {
        let prog: &mut FEntry = program_mut(ebpf, program)?;
        prog.load(function, &btf)
            .map_err(|source| Error::Program { program, source })?;
        prog.attach()
            .map_err(|source| Error::Program { program, source })?;
    }
    Ok(MemcgTrigger {
        watch: Arc::new(Mutex::new(watch)),
    })
}
