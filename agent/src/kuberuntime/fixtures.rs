//! Test builders for the runtime manager and probe results; the pod and runtime-status builders
//! are `pod::fixtures` (re-exported here), shared with the `status` and `cm` tables.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use super::{
    ContainerProbeResults, ProbeOutcome,
    manager::{KubeRuntimeManager, RuntimeManagerConfig},
    security_context::SecurityOptions,
};
pub use crate::pod::fixtures::*;
use crate::{
    container::{ContainerId, PodStatus},
    cri::fake::FakeRuntime,
    status::ReasonCache,
};

/// A runtime manager over `fake` as the manager tables drive it: a 2-CPU, 1 GiB node without
/// CAP_SYS_RESOURCE, pod logs under the temporary directory `log_dir`, the fake's clock.
pub fn runtime_manager(
    fake: &Arc<FakeRuntime>,
    log_dir: &str,
    seccomp_default: bool,
) -> (KubeRuntimeManager, Arc<Mutex<ReasonCache>>) {
    runtime_manager_with(
        fake,
        log_dir,
        seccomp_default,
        super::container_config::ResourceOptions::default(),
    )
}

/// [`runtime_manager`] on a node with `resources` (CFS settings, huge page sizes).
pub fn runtime_manager_with(
    fake: &Arc<FakeRuntime>,
    log_dir: &str,
    seccomp_default: bool,
    resources: super::container_config::ResourceOptions,
) -> (KubeRuntimeManager, Arc<Mutex<ReasonCache>>) {
    let reasons = Arc::new(Mutex::new(ReasonCache::new()));
    let manager = KubeRuntimeManager::new(
        fake.clone(),
        fake.clone(),
        reasons.clone(),
        RuntimeManagerConfig {
            node_name: "node".into(),
            log_root: std::env::temp_dir().join(log_dir),
            memory_capacity: 1 << 30,
            cpu_capacity_millis: 2000,
            has_cap_sys_resource: false,
            dns: super::dns::DnsSettings::default(),
            host_ip: Some("10.0.0.1".into()),
            runtime_handler: String::new(),
            security: SecurityOptions::new(
                std::path::Path::new("/var/lib/swiftlet"),
                seccomp_default,
            ),
            resources,
        },
    );
    let clock = fake.clone();
    (manager.with_clock(Arc::new(move || clock.now())), reasons)
}

/// Probe results set per container name (for the newest instance of that name).
#[derive(Default)]
pub struct FakeProbes {
    liveness: HashMap<ContainerId, ProbeOutcome>,
    startup: HashMap<ContainerId, ProbeOutcome>,
}

impl FakeProbes {
    pub fn liveness(mut self, status: &PodStatus, name: &str, outcome: ProbeOutcome) -> Self {
        self.liveness.insert(latest_id(status, name), outcome);
        self
    }

    pub fn startup(mut self, status: &PodStatus, name: &str, outcome: ProbeOutcome) -> Self {
        self.startup.insert(latest_id(status, name), outcome);
        self
    }
}

fn latest_id(status: &PodStatus, name: &str) -> ContainerId {
    status.latest(name).map(|c| c.id.clone()).unwrap()
}

impl ContainerProbeResults for FakeProbes {
    fn liveness(&self, id: &ContainerId) -> Option<ProbeOutcome> {
        self.liveness.get(id).copied()
    }

    fn startup(&self, id: &ContainerId) -> Option<ProbeOutcome> {
        self.startup.get(id).copied()
    }
}
