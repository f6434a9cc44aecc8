//! What swiftlet's programs need from the kernel, probed before anything is loaded. A kernel
//! without one of these would otherwise fail deep in the loader or the verifier with an errno or
//! a page of verifier log; probed first, the refusal names the feature and the first Linux
//! release that has it. Fields that differ between kernels (tracepoint formats, struct offsets)
//! are not here: they are resolved at load with fallbacks (`loader::program_config`).
//!
//! The probes are aya's (`aya::sys`), libbpf's method: create a minimal map, or load a minimal
//! program calling the helper and read the verifier's diagnosis.

use aya::{
    maps::MapType,
    programs::ProgramType,
    sys::{BpfHelper, is_helper_supported, is_map_supported, is_program_supported},
};

use super::Error;

/// How one feature is probed.
#[derive(Clone, Copy, Debug)]
pub enum Probe {
    Program(ProgramType),
    Map(MapType),
    /// A helper callable from tracepoint programs (all of swiftlet's helper calls are there).
    Helper(BpfHelper),
}

/// One thing the kernel must offer.
#[derive(Clone, Copy, Debug)]
pub struct Feature {
    /// Named as the person reading the refusal would search for it.
    pub name: &'static str,
    /// The first mainline release that has it.
    pub since: &'static str,
    pub probe: Probe,
}

const fn feature(name: &'static str, since: &'static str, probe: Probe) -> Feature {
    Feature { name, since, probe }
}

/// What the event programs (`KernelEvents`) use.
pub const EVENT_PROGRAMS: &[Feature] = &[
    feature(
        "tracepoint programs",
        "4.7",
        Probe::Program(ProgramType::TracePoint),
    ),
    feature("BPF ring buffer maps", "5.8", Probe::Map(MapType::RingBuf)),
    feature(
        "per-CPU array maps",
        "4.6",
        Probe::Map(MapType::PerCpuArray),
    ),
    feature("LRU hash maps", "4.10", Probe::Map(MapType::LruHash)),
    feature(
        "helper bpf_ringbuf_reserve",
        "5.8",
        Probe::Helper(BpfHelper::BPF_FUNC_ringbuf_reserve),
    ),
    feature(
        "helper bpf_get_current_cgroup_id",
        "4.18",
        Probe::Helper(BpfHelper::BPF_FUNC_get_current_cgroup_id),
    ),
    feature(
        "helper bpf_get_current_ancestor_cgroup_id",
        "5.7",
        Probe::Helper(BpfHelper::BPF_FUNC_get_current_ancestor_cgroup_id),
    ),
    feature(
        "helper bpf_probe_read_kernel",
        "5.5",
        Probe::Helper(BpfHelper::BPF_FUNC_probe_read_kernel),
    ),
    feature(
        "helper bpf_probe_read_kernel_str",
        "5.5",
        Probe::Helper(BpfHelper::BPF_FUNC_probe_read_kernel_str),
    ),
    feature(
        "helper bpf_get_current_task",
        "4.8",
        Probe::Helper(BpfHelper::BPF_FUNC_get_current_task),
    ),
];

/// What the scheduler audit (`SchedAudit`) uses besides what it shares with the event programs.
/// Its program type, `tp_btf` (5.5), has no probe of its own: aya's probes it as an fentry
/// program on `bpf_fentry_test1`, which kernels without ftrace lack even where `tp_btf` works
/// (this machine's), so the program's own load says whether it is there.
pub const SCHED_AUDIT: &[Feature] = &[feature(
    "per-CPU hash maps",
    "4.6",
    Probe::Map(MapType::PerCpuHash),
)];

/// Probes each feature in order and refuses at the first one missing.
pub fn require(features: &[Feature]) -> Result<(), Error> {
    for feature in features {
        if !present(feature)? {
            return Err(Error::KernelFeature {
                feature: feature.name,
                since: feature.since,
            });
        }
    }
    Ok(())
}

/// Whether this kernel has `feature`. A probe that cannot decide (an unexpected errno) is an
/// error of its own, not a guess.
pub fn present(feature: &Feature) -> Result<bool, Error> {
    let probe_error = |reason: String| Error::FeatureProbe {
        feature: feature.name,
        reason,
    };
    match feature.probe {
        Probe::Program(program) => {
            is_program_supported(program).map_err(|e| probe_error(e.to_string()))
        }
        Probe::Map(map) => is_map_supported(map).map_err(|e| probe_error(e.to_string())),
        Probe::Helper(helper) => is_helper_supported(ProgramType::TracePoint, helper)
            .map_err(|e| probe_error(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_feature_names_a_release() {
        for feature in EVENT_PROGRAMS.iter().chain(SCHED_AUDIT) {
            let mut parts = feature.since.split('.');
            let major: Option<u32> = parts.next().and_then(|p| p.parse().ok());
            let minor: Option<u32> = parts.next().and_then(|p| p.parse().ok());
            assert!(
                major.is_some() && minor.is_some() && parts.next().is_none(),
                "{}: `{}` is not a MAJOR.MINOR release",
                feature.name,
                feature.since
            );
        }
    }

    #[test]
    fn a_refusal_names_the_feature_and_the_release() {
        let error = Error::KernelFeature {
            feature: "BPF ring buffer maps",
            since: "5.8",
        };
        let text = error.to_string();
        assert!(text.contains("BPF ring buffer maps"), "{text}");
        assert!(text.contains("Linux 5.8"), "{text}");
    }
}
