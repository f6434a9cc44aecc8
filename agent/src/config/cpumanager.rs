//! The CPU manager's settings: `cpuManagerPolicy` (`none` or `static`), its options
//! (`full-pcpus-only`, `distribute-cpus-across-numa`), `reservedSystemCPUs`,
//! `cpuManagerReconcilePeriod`, and swiftlet's `cpuManagerApply` (when assignments reach the
//! containers: on events, or on the reconcile alone as the kubelet does) and the recovery flag
//! `--cpu-manager-reset-state`.
//!
//! Not here: the policy itself (`cm/cpumanager`). Upstream: the `--cpu-manager-*` and
//! `--reserved-cpus` flags of `cmd/kubelet/app/options`, `NewManager` in
//! `pkg/kubelet/cm/cpumanager/cpu_manager.go` and `policy_options.go`.

use std::time::Duration;

use super::{
    defaults,
    error::{ConfigError, invalid},
    settings::Settings,
    types::{CpuApply, CpuManagerPolicy},
};
use crate::cm::cpumanager::{CpuSet, PolicyOptions};

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
            reconcile_period: defaults::CPU_MANAGER_RECONCILE_PERIOD,
            apply: CpuApply::Events,
            reset_state: false,
        }
    }
}

pub(super) fn resolve(settings: &Settings) -> Result<CpuManagerConfig, ConfigError> {
    Ok(CpuManagerConfig {
        policy: settings.cpu_manager_policy,
        options: policy_options(settings)?,
        reserved_system_cpus: settings.reserved_system_cpus.clone(),
        reconcile_period: settings.cpu_manager_reconcile_period,
        apply: settings.cpu_manager_apply,
        reset_state: settings.cpu_manager_reset_state,
    })
}

/// Upstream accepts options only with the static policy, each as a boolean string.
fn policy_options(settings: &Settings) -> Result<PolicyOptions, ConfigError> {
    const FIELD: &str = "cpuManagerPolicyOptions";
    let syntax = "expected <option>=<true|false>, e.g. full-pcpus-only=true";
    let policy = settings.cpu_manager_policy;
    let mut out = PolicyOptions::default();
    let Some(map) = &settings.cpu_manager_policy_options else {
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
