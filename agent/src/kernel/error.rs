//! Why the kernel side could not be set up, each with a hint for the person running swiftlet.

use std::{io, path::PathBuf};

use crate::cgroup::LayoutError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("loading eBPF programs needs privileges this process lacks: {missing}")]
    NotPrivileged { missing: String },
    #[error("kernel BTF not found at {}", path.display())]
    NoBtf { path: PathBuf },
    #[error("reading kernel BTF from {}: {reason}", path.display())]
    Btf { path: PathBuf, reason: String },
    #[error("kernel BTF has no member `{member}` in struct {strukt}")]
    BtfMember { strukt: String, member: String },
    #[error("tracefs is not mounted at {} and mounting it failed: {source}", path.display())]
    Tracefs {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("tracepoint {tracepoint} is not available (reading {}: {source})", path.display())]
    Tracepoint {
        tracepoint: String,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("tracepoint {tracepoint} has no field `{field}`")]
    TracepointField { tracepoint: String, field: String },
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error("--cgroup {}: {reason}", path.display())]
    Watch { path: PathBuf, reason: String },
    #[error("{given} cgroup subtrees given, at most {max} can be watched")]
    TooManyWatched { given: usize, max: usize },
    #[error(
        "ring buffer size {bytes} is not a power of two multiple of the page size ({page} bytes)"
    )]
    RingSize { bytes: u32, page: u64 },
    #[error("this kernel lacks {feature}, which swiftlet's programs need (Linux {since} or newer)")]
    KernelFeature {
        feature: &'static str,
        since: &'static str,
    },
    #[error("probing the kernel for {feature}: {reason}")]
    FeatureProbe {
        feature: &'static str,
        reason: String,
    },
    #[error("loading the eBPF object: {0}")]
    Load(#[source] aya::EbpfError),
    #[error("eBPF program `{program}`: {source}")]
    Program {
        program: &'static str,
        #[source]
        source: aya::programs::ProgramError,
    },
    #[error("the eBPF object has no {what} named `{name}` (agent and programs built apart?)")]
    Missing {
        what: &'static str,
        name: &'static str,
    },
    #[error("eBPF map `{map}`: {source}")]
    Map {
        map: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("waiting on the events ring buffer: {0}")]
    Io(#[source] io::Error),
    #[error("the kernel has no function `{function}` that fentry programs can attach to")]
    KernelFunction { function: &'static str },
    #[error("{}: the memory cgroup level program did not learn the cgroup's counter from reading it", path.display())]
    MemcgDiscovery { path: PathBuf },
    #[error("{}: {source}", path.display())]
    CgroupFile {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("CPU {cpu} is beyond the {max} CPUs the scheduler audit covers")]
    CpuOutOfRange { cpu: u32, max: u32 },
    #[error("reading the possible CPUs ({path}): {source}")]
    PossibleCpus {
        path: &'static str,
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// What the person running swiftlet can do about it.
    pub fn hint(&self) -> Option<String> {
        let hint = match self {
            Error::NotPrivileged { .. } => {
                "run as root, e.g. `sudo swiftlet ...` or `cargo xtask run -- ...`".into()
            }
            Error::NoBtf { .. } | Error::Btf { .. } => {
                "swiftlet needs a kernel built with CONFIG_DEBUG_INFO_BTF=y (most distribution \
                 kernels since 5.8 have it)"
                    .into()
            }
            Error::BtfMember { .. } | Error::TracepointField { .. } | Error::Tracepoint { .. } => {
                "this kernel is older or configured differently than swiftlet supports (Linux 6.1 \
                 or newer with BTF); see the README's kernel table"
                    .into()
            }
            Error::Tracefs { .. } => {
                "run as root, or mount it yourself: mount -t tracefs tracefs /sys/kernel/tracing"
                    .into()
            }
            Error::Layout(_) => "mount the cgroup2 hierarchy (e.g. mount -t cgroup2 none \
                                 /sys/fs/cgroup/unified) or boot with cgroup v2"
                .into(),
            Error::Watch { .. } => {
                "give a cgroup directory, absolute or relative to the cgroup2 mount".into()
            }
            Error::TooManyWatched { .. } => "watch a common parent cgroup instead".into(),
            Error::RingSize { .. } => "use e.g. 4096, 262144 or 1048576".into(),
            Error::Load(aya::EbpfError::MapError(aya::maps::MapError::CreateError {
                io_error,
                ..
            })) if io_error.raw_os_error() == Some(libc::EINVAL) => {
                "the kernel may lack BPF ring buffers (Linux 5.8 or newer needed)".into()
            }
            Error::Load(_) | Error::Program { .. } => {
                "run as root on Linux 6.1 or newer; the verifier's log above says what it rejected"
                    .into()
            }
            Error::KernelFeature { .. } => {
                "swiftlet is tested on Linux 6.1, 6.12 and 6.18 (see the README's kernel table); \
                 boot a newer kernel"
                    .into()
            }
            Error::FeatureProbe { .. } => {
                "run as root; the probe loads a two-instruction program, which only fails like \
                 this under a security module or seccomp policy that forbids bpf()"
                    .into()
            }
            Error::Missing { .. } => "rebuild with `cargo xtask build`".into(),
            Error::CpuOutOfRange { .. } => {
                "CPUs numbered 1024 and above cannot be audited; the CPU manager still assigns \
                 them"
                    .into()
            }
            Error::KernelFunction { .. } => {
                "the kernel lacks BTF for it, or ftrace (fentry); the memory level is polled instead"
                    .into()
            }
            Error::MemcgDiscovery { .. } => {
                "the cgroup needs the memory controller on cgroup v2; the memory level is polled \
                 instead"
                    .into()
            }
            Error::Map { .. }
            | Error::Io(_)
            | Error::PossibleCpus { .. }
            | Error::CgroupFile { .. } => return None,
        };
        Some(hint)
    }
}
