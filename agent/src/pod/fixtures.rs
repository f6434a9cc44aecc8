//! Test builders for pods and runtime statuses, shared by the `kuberuntime`, `status` and `cm`
//! tables (so that none of them imports another's tests).

use std::{
    collections::BTreeMap,
    time::{Duration, SystemTime},
};

use k8s_openapi::api::core::v1::{Container, Pod, Probe};

use crate::container::{
    ContainerId, ContainerState, ContainerStatus, PodStatus, PodUid, SandboxState, SandboxStatus,
    container_hash,
};

pub const UID: &str = "uid-1";

/// A fixed point in time plus `secs`.
pub fn t(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
}

pub fn container(name: &str) -> Container {
    Container {
        name: name.into(),
        image: Some(format!("registry.example/{name}:1")),
        ..Container::default()
    }
}

pub fn sidecar(name: &str) -> Container {
    Container {
        restart_policy: Some("Always".into()),
        ..container(name)
    }
}

pub fn with_startup_probe(mut c: Container) -> Container {
    c.startup_probe = Some(Probe::default());
    c
}

pub fn with_liveness_probe(mut c: Container) -> Container {
    c.liveness_probe = Some(Probe::default());
    c
}

pub fn pod(restart_policy: &str, inits: Vec<Container>, containers: Vec<Container>) -> Pod {
    crate::testing::pod()
        .named("default", "web", UID)
        .restart_policy(restart_policy)
        .init_containers(inits)
        .containers(containers)
        .build()
}

/// Builds a runtime status; call the methods oldest first, each instance is newer than the last.
pub struct Runtime {
    status: PodStatus,
    clock: u64,
}

pub fn runtime() -> Runtime {
    Runtime {
        status: PodStatus::empty(PodUid::from(UID), "web", "default"),
        clock: 0,
    }
}

impl Runtime {
    pub fn sandbox(mut self, state: SandboxState, attempt: u32) -> Self {
        self.clock += 10;
        self.status.sandboxes.insert(
            0,
            SandboxStatus {
                id: format!("sandbox-{attempt}"),
                state,
                created_at: t(self.clock),
                attempt,
                ips: vec!["10.0.0.5".into()],
                host_network: false,
                labels: BTreeMap::new(),
                annotations: BTreeMap::new(),
            },
        );
        self
    }

    pub fn ready_sandbox(self) -> Self {
        self.sandbox(SandboxState::Ready, 0)
    }

    /// Changes the newest sandbox.
    pub fn map_sandbox(mut self, f: impl FnOnce(&mut SandboxStatus)) -> Self {
        if let Some(s) = self.status.sandboxes.first_mut() {
            f(s);
        }
        self
    }

    pub fn running(self, spec: &Container) -> Self {
        self.instance(spec, ContainerState::Running, None)
    }

    pub fn created(self, spec: &Container) -> Self {
        self.instance(spec, ContainerState::Created, None)
    }

    pub fn unknown(self, spec: &Container) -> Self {
        self.instance(spec, ContainerState::Unknown, None)
    }

    pub fn exited(self, spec: &Container, code: i32) -> Self {
        self.instance(spec, ContainerState::Exited, Some(code))
    }

    /// Changes the newest container instance.
    pub fn map_latest(mut self, f: impl FnOnce(&mut ContainerStatus)) -> Self {
        if let Some(c) = self.status.containers.first_mut() {
            f(c);
        }
        self
    }

    fn instance(mut self, spec: &Container, state: ContainerState, code: Option<i32>) -> Self {
        self.clock += 10;
        let restart_count = u32::try_from(self.status.instances(&spec.name).count()).unwrap();
        let started = (state != ContainerState::Created).then(|| t(self.clock + 1));
        let finished = (state == ContainerState::Exited).then(|| t(self.clock + 5));
        let reason = match code {
            Some(0) => "Completed",
            Some(_) => "Error",
            None => "",
        };
        self.status.containers.insert(
            0,
            ContainerStatus {
                id: ContainerId::new("containerd", &format!("{}-{}", spec.name, self.clock)),
                name: spec.name.clone(),
                state,
                created_at: Some(t(self.clock)),
                started_at: started,
                finished_at: finished,
                exit_code: code,
                reason: reason.into(),
                message: String::new(),
                image: spec.image.clone().unwrap_or_default(),
                image_ref: format!("sha256:{}", spec.name),
                restart_count,
                hash: container_hash(spec),
                sandbox_id: self
                    .status
                    .sandboxes
                    .first()
                    .map(|s| s.id.clone())
                    .unwrap_or_default(),
                labels: BTreeMap::new(),
                annotations: BTreeMap::new(),
            },
        );
        self
    }

    pub fn build(self) -> PodStatus {
        self.status
    }
}
