//! The kernel matrix's deliberately unsupportable program (`ebpf/src/canary.rs`): it needs cgroup
//! local storage, which Linux 6.2 introduced. Loading it the agent's way (features probed first)
//! must refuse on older kernels with the feature and the release named; loading it blindly shows
//! what the kernel itself says. Built only with the `kernel-canary` feature (the system tests).

use aya::{Ebpf, EbpfLoader, maps::MapType, programs::TracePoint, sys::BpfHelper};

use super::{
    Error,
    features::{Feature, Probe, require},
    loader::{check_privileges, program_mut},
};

static OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/swiftlet-ebpf-canary"));

/// What the canary needs beyond any tracepoint program.
pub const FEATURES: &[Feature] = &[
    Feature {
        name: "cgroup local storage maps (BPF_MAP_TYPE_CGRP_STORAGE)",
        since: "6.2",
        probe: Probe::Map(MapType::CgrpStorage),
    },
    Feature {
        name: "helper bpf_cgrp_storage_get",
        since: "6.2",
        probe: Probe::Helper(BpfHelper::BPF_FUNC_cgrp_storage_get),
    },
];

const PROGRAM: &str = "canary_exec";

/// The canary, loaded and attached to `sched:sched_process_exec`; dropping it detaches it.
pub struct Canary {
    _ebpf: Ebpf,
}

/// As the agent loads its own programs: privileges and features checked first.
pub fn load() -> Result<Canary, Error> {
    check_privileges()?;
    require(FEATURES)?;
    load_unchecked()
}

/// Straight to the kernel, as a loader without feature probes would: whatever fails says so in
/// the kernel's words (an errno from map creation, or the verifier's log).
pub fn load_unchecked() -> Result<Canary, Error> {
    let mut ebpf = EbpfLoader::new().load(OBJECT).map_err(Error::Load)?;
    let program: &mut TracePoint = program_mut(&mut ebpf, PROGRAM)?;
    program.load().map_err(|source| Error::Program {
        program: PROGRAM,
        source,
    })?;
    program
        .attach("sched", "sched_process_exec")
        .map_err(|source| Error::Program {
            program: PROGRAM,
            source,
        })?;
    Ok(Canary { _ebpf: ebpf })
}
