//! The kubelet's pod-resources API (`v1.PodResourcesLister`, upstream
//! `pkg/kubelet/apis/podresources/server_v1.go`), on `<rootDir>/pod-resources/kubelet.sock`: which
//! node resources each container of the active pods holds, and which the node can hand out.
//! Monitoring agents (GPU and NUMA exporters, topology-aware schedulers' node agents) read it.
//!
//! What swiftlet fills: the exclusive CPUs the static CPU manager gave each container, and the
//! CPUs it can give (`GetAllocatableResources`: every CPU but the reserved ones; none under the
//! `none` policy, as upstream). There is no device or memory manager yet, so `devices` and
//! `memory` are empty — as upstream's are on a node without device plugins and with the memory
//! manager's `None` policy.
//!
//! The socket is root's alone (`listeners::bind_private_unix`: 0600 in a 0700 directory), and
//! every answer is bounded by the node's pods; calls are rate limited as upstream's are
//! (`podresources/grpc/ratelimit.go`: 100 per second, bursts of 10, beyond which a call fails
//! `ResourceExhausted`), so a looping client cannot make the agent list pods without pause.

use std::{sync::Arc, time::Instant};

use k8s_openapi::api::core::v1::{Container, Pod};
use swiftlet_proto::podresources::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerResources,
    GetPodResourcesRequest, GetPodResourcesResponse, ListPodResourcesRequest,
    ListPodResourcesResponse, PodResources, pod_resources_lister_server::PodResourcesLister,
};
use tonic::{Request, Response, Status};

use crate::{lock::MutexExt as _, pod::spec};

/// Upstream's `DefaultQPS` and `DefaultBurstTokens`.
pub const QPS: f64 = 100.0;
pub const BURST: f64 = 10.0;
/// The feature gate upstream keeps `Get` behind (alpha, off by default).
pub const GET_GATE: &str = "KubeletPodResourcesGet";

/// Where the pods and their CPUs come from.
pub trait Sources: Send + Sync + 'static {
    /// The active pods: admitted and not yet in a terminal phase (upstream lists the pod
    /// manager's active pods, `KubeletPodResourcesListUseActivePods`).
    fn active_pods(&self) -> Vec<Pod>;
    /// The CPUs the container holds exclusively, ascending; empty when it shares the pool.
    fn exclusive_cpus(&self, pod_uid: &str, container: &str) -> Vec<i64>;
    /// The CPUs pods may be given exclusively.
    fn allocatable_cpus(&self) -> Vec<i64>;
}

/// The agent's own sources: the status manager's pods not in a terminal phase, and the CPU
/// manager when the static policy runs.
pub struct NodeSources {
    pub status: Arc<crate::status::StatusManager>,
    pub cpus: Option<Arc<crate::cm::cpumanager::CpuManager>>,
}

impl Sources for NodeSources {
    fn active_pods(&self) -> Vec<Pod> {
        self.status
            .pods()
            .into_iter()
            .map(|p| p.pod)
            .filter(|p| {
                let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
                !matches!(phase, Some("Succeeded" | "Failed"))
            })
            .collect()
    }

    fn exclusive_cpus(&self, pod_uid: &str, container: &str) -> Vec<i64> {
        self.cpus
            .as_ref()
            .map_or_else(Vec::new, |m| ids(&m.exclusive_cpus(pod_uid, container)))
    }

    fn allocatable_cpus(&self) -> Vec<i64> {
        self.cpus
            .as_ref()
            .map_or_else(Vec::new, |m| ids(&m.allocatable_cpus()))
    }
}

fn ids(set: &crate::cm::cpumanager::CpuSet) -> Vec<i64> {
    set.iter().map(i64::from).collect()
}

/// A token bucket of upstream's shape.
struct Bucket {
    tokens: f64,
    at: Instant,
}

pub struct PodResourcesService {
    sources: Arc<dyn Sources>,
    get_enabled: bool,
    bucket: std::sync::Mutex<Bucket>,
}

impl PodResourcesService {
    pub fn new(sources: Arc<dyn Sources>, get_enabled: bool) -> PodResourcesService {
        PodResourcesService {
            sources,
            get_enabled,
            bucket: std::sync::Mutex::new(Bucket {
                tokens: BURST,
                at: Instant::now(),
            }),
        }
    }

    /// Takes a token, or refuses the call as upstream's limiter does.
    fn admit(&self) -> Result<(), Status> {
        self.admit_at(Instant::now())
    }

    fn admit_at(&self, now: Instant) -> Result<(), Status> {
        let mut bucket = self.bucket.lock_unpoisoned();
        let refill = now.saturating_duration_since(bucket.at).as_secs_f64() * QPS;
        bucket.tokens = (bucket.tokens + refill).min(BURST);
        bucket.at = bucket.at.max(now);
        if bucket.tokens < 1.0 {
            return Err(Status::resource_exhausted(
                "rejected by rate limit: too many pod-resources calls",
            ));
        }
        bucket.tokens -= 1.0;
        Ok(())
    }

    /// One pod's entry (upstream `getContainerResources` per container): its sidecars first,
    /// then its regular containers.
    fn pod_resources(&self, pod: &Pod) -> PodResources {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let container = |c: &Container| ContainerResources {
            name: c.name.clone(),
            cpu_ids: self.sources.exclusive_cpus(uid, &c.name),
            ..ContainerResources::default()
        };
        let containers = spec::init_containers(pod)
            .iter()
            .filter(|c| spec::is_sidecar(c))
            .chain(spec::containers(pod))
            .map(container)
            .collect();
        PodResources {
            name: pod.metadata.name.clone().unwrap_or_default(),
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            containers,
        }
    }
}

#[tonic::async_trait]
impl PodResourcesLister for PodResourcesService {
    async fn list(
        &self,
        _: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        self.admit()?;
        let pod_resources = self
            .sources
            .active_pods()
            .iter()
            .map(|p| self.pod_resources(p))
            .collect();
        Ok(Response::new(ListPodResourcesResponse { pod_resources }))
    }

    async fn get_allocatable_resources(
        &self,
        _: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        self.admit()?;
        Ok(Response::new(AllocatableResourcesResponse {
            cpu_ids: self.sources.allocatable_cpus(),
            ..AllocatableResourcesResponse::default()
        }))
    }

    async fn get(
        &self,
        request: Request<GetPodResourcesRequest>,
    ) -> Result<Response<GetPodResourcesResponse>, Status> {
        self.admit()?;
        if !self.get_enabled {
            // Upstream's words, with the gate that lifts it.
            return Err(Status::unimplemented(format!(
                "PodResources API Get method disabled (feature gate {GET_GATE})"
            )));
        }
        let request = request.into_inner();
        let pod = self.sources.active_pods().into_iter().find(|p| {
            p.metadata.name.as_deref() == Some(request.pod_name.as_str())
                && p.metadata.namespace.as_deref() == Some(request.pod_namespace.as_str())
        });
        let Some(pod) = pod else {
            return Err(Status::not_found(format!(
                "pod {} in namespace {} not found",
                request.pod_name, request.pod_namespace
            )));
        };
        Ok(Response::new(GetPodResourcesResponse {
            pod_resources: Some(self.pod_resources(&pod)),
        }))
    }
}

#[cfg(test)]
mod tests;
