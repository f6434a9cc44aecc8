//! The CPU manager's settings: `cpuManagerPolicy` (`none` or `static`), its options
//! (`full-pcpus-only`, `distribute-cpus-across-numa`), `reservedSystemCPUs`,
//! `cpuManagerReconcilePeriod`, and swiftlet's `cpuManagerApply` (when assignments reach the
//! containers: on events, or on the reconcile alone as the kubelet does) and the recovery flag
//! `--cpu-manager-reset-state`.
//!
//! Not here: the policy itself (`cm/cpumanager`). Upstream: the `--cpu-manager-*` and
//! `--reserved-cpus` flags of `cmd/kubelet/app/options`, `NewManager` in
//! `pkg/kubelet/cm/cpumanager/cpu_manager.go` and `policy_options.go`.

use std::{str::FromStr, time::Duration};

use super::{
    RunArgs,
    error::{ConfigError, Origin, invalid},
    fields::Resolver,
    file::FileConfig,
};
use crate::cm::cpumanager::{CpuSet, PolicyOptions};

/// Upstream's default `cpuManagerReconcilePeriod`.
pub const DEFAULT_RECONCILE_PERIOD: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CpuManagerPolicy {
    /// Every container runs on every CPU the pods may use (the kubelet's default).
    #[default]
    None,
    /// Guaranteed containers with a whole number of CPUs get them exclusively.
    Static,
}

impl CpuManagerPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            CpuManagerPolicy::None => "none",
            CpuManagerPolicy::Static => "static",
        }
    }
}

impl FromStr for CpuManagerPolicy {
    type Err = ();

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(CpuManagerPolicy::None),
            "static" => Ok(CpuManagerPolicy::Static),
            _ => Err(()),
        }
    }
}

/// When assignments are written to the containers' cpusets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CpuApply {
    /// At once: the shared pool of every container when an assignment changes it, and a
    /// container's own set at creation and on its start event; the reconcile is the safety net.
    #[default]
    Events,
    /// Only on the periodic reconcile (and at creation), as the kubelet does: containers may
    /// share "exclusive" CPUs for up to one period. For comparison (`cargo xtask bench
    /// cpumanager`).
    Reconcile,
}

impl CpuApply {
    pub fn as_str(self) -> &'static str {
        match self {
            CpuApply::Events => "events",
            CpuApply::Reconcile => "reconcile",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuManagerConfig {
    pub policy: CpuManagerPolicy,
    pub options: PolicyOptions,
    /// `reservedSystemCPUs`: exactly these CPUs are kept from pods' exclusive use. Without it the
    /// static policy reserves ⌈kubeReserved.cpu + systemReserved.cpu⌉ CPUs, chosen by topology.
    pub reserved_system_cpus: Option<CpuSet>,
    pub reconcile_period: Duration,
    pub apply: CpuApply,
    /// `--cpu-manager-reset-state`: a checkpoint that is corrupt or from another policy is moved
    /// aside and the state starts afresh, instead of stopping swiftlet.
    pub reset_state: bool,
}

impl Default for CpuManagerConfig {
    fn default() -> Self {
        CpuManagerConfig {
            policy: CpuManagerPolicy::None,
            options: PolicyOptions::default(),
            reserved_system_cpus: None,
            reconcile_period: DEFAULT_RECONCILE_PERIOD,
            apply: CpuApply::Events,
            reset_state: false,
        }
    }
}

pub(super) fn resolve(
    r: &Resolver,
    args: &RunArgs,
    file: &FileConfig,
) -> Result<CpuManagerConfig, ConfigError> {
    let (policy, policy_origin) = match (&args.cpu_manager_policy, &file.cpu_manager_policy) {
        (Some(s), _) => (s.as_str(), Origin::Flag("--cpu-manager-policy")),
        (None, Some(s)) => (s.as_str(), r.file.clone()),
        (None, None) => ("none", Origin::Default),
    };
    let policy = policy.parse::<CpuManagerPolicy>().map_err(|()| {
        invalid(
            &policy_origin,
            "cpuManagerPolicy",
            "value",
            policy,
            "expected \"none\" or \"static\"",
        )
    })?;
    let options = policy_options(r, args, file, policy)?;
    let reserved_system_cpus = match (&args.reserved_cpus, &file.reserved_system_cpus) {
        (Some(s), _) => cpu_list(&Origin::Flag("--reserved-cpus"), s)?,
        (None, Some(s)) => cpu_list(r.file, s)?,
        (None, None) => None,
    };
    let reconcile_period = r.duration(
        "cpuManagerReconcilePeriod",
        (
            args.cpu_manager_reconcile_period,
            "--cpu-manager-reconcile-period",
        ),
        &file.cpu_manager_reconcile_period,
        DEFAULT_RECONCILE_PERIOD,
    )?;
    let (apply, apply_origin) = match (&args.cpu_manager_apply, &file.cpu_manager_apply) {
        (Some(s), _) => (s.as_str(), Origin::Flag("--cpu-manager-apply")),
        (None, Some(s)) => (s.as_str(), r.file.clone()),
        (None, None) => ("events", Origin::Default),
    };
    let apply = match apply {
        "events" => CpuApply::Events,
        "reconcile" => CpuApply::Reconcile,
        other => {
            return Err(invalid(
                &apply_origin,
                "cpuManagerApply",
                "value",
                other,
                "expected \"events\" or \"reconcile\"",
            ));
        }
    };
    Ok(CpuManagerConfig {
        policy,
        options,
        reserved_system_cpus,
        reconcile_period,
        apply,
        reset_state: args.cpu_manager_reset_state,
    })
}

fn cpu_list(origin: &Origin, text: &str) -> Result<Option<CpuSet>, ConfigError> {
    let set = CpuSet::parse(text.trim()).map_err(|e| {
        invalid(
            origin,
            "reservedSystemCPUs",
            "CPU list",
            text,
            format!("{e}; expected e.g. \"0\" or \"0-1,4\""),
        )
    })?;
    Ok((!set.is_empty()).then_some(set))
}

/// Upstream accepts options only with the static policy, each as a boolean string.
fn policy_options(
    r: &Resolver,
    args: &RunArgs,
    file: &FileConfig,
    policy: CpuManagerPolicy,
) -> Result<PolicyOptions, ConfigError> {
    const FIELD: &str = "cpuManagerPolicyOptions";
    let syntax = "expected <option>=<true|false>, e.g. full-pcpus-only=true";
    let mut out = PolicyOptions::default();
    let Some(map) = r.map_field(
        FIELD,
        "option",
        (
            &args.cpu_manager_policy_options,
            "--cpu-manager-policy-options",
        ),
        &['='],
        syntax,
        &file.cpu_manager_policy_options,
    )?
    else {
        return Ok(out);
    };
    for entry in &map.entries {
        let bad = |reason: String| invalid(&map.origin, FIELD, "option", &entry.shown, reason);
        if policy != CpuManagerPolicy::Static {
            return Err(bad(format!(
                "policy options need cpuManagerPolicy \"static\" (it is {:?})",
                policy.as_str()
            )));
        }
        let value = match entry.value.as_str() {
            "true" => true,
            "false" => false,
            other => return Err(bad(format!("{other:?} is not a boolean: {syntax}"))),
        };
        match entry.key.as_str() {
            "full-pcpus-only" => out.full_pcpus_only = value,
            "distribute-cpus-across-numa" => out.distribute_cpus_across_numa = value,
            other => {
                return Err(bad(format!(
                    "unknown option {other:?}: expected full-pcpus-only or \
                     distribute-cpus-across-numa"
                )));
            }
        }
    }
    Ok(out)
}
