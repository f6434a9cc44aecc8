use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::{
    api::core::v1::{PodSpec, PodStatus},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use tonic::Code;

use super::*;

struct Fake {
    pods: Vec<Pod>,
    cpus: BTreeMap<(String, String), Vec<i64>>,
}

impl Sources for Fake {
    fn active_pods(&self) -> Vec<Pod> {
        self.pods.clone()
    }

    fn exclusive_cpus(&self, pod_uid: &str, container: &str) -> Vec<i64> {
        self.cpus
            .get(&(pod_uid.to_owned(), container.to_owned()))
            .cloned()
            .unwrap_or_default()
    }

    fn allocatable_cpus(&self) -> Vec<i64> {
        vec![1, 2, 3]
    }
}

fn container(name: &str, sidecar: bool) -> Container {
    Container {
        name: name.into(),
        restart_policy: sidecar.then(|| "Always".to_owned()),
        ..Container::default()
    }
}

fn pod(name: &str, uid: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            uid: Some(uid.into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            init_containers: Some(vec![container("init", false), container("proxy", true)]),
            containers: vec![container("app", false), container("log", false)],
            ..PodSpec::default()
        }),
        status: Some(PodStatus::default()),
    }
}

fn service(get_enabled: bool) -> PodResourcesService {
    PodResourcesService::new(
        Arc::new(Fake {
            pods: vec![pod("web", "u1"), pod("db", "u2")],
            cpus: [(("u1".to_owned(), "app".to_owned()), vec![1, 2])].into(),
        }),
        get_enabled,
    )
}

/// Sidecars then regular containers (a plain init container holds nothing once done), each
/// with its exclusive CPUs.
#[tokio::test]
async fn list_gives_each_containers_exclusive_cpus() {
    let listed = service(false)
        .list(Request::new(ListPodResourcesRequest {}))
        .await
        .map(Response::into_inner)
        .expect("list");
    let web = &listed.pod_resources[0];
    assert_eq!(
        (web.name.as_str(), web.namespace.as_str()),
        ("web", "default")
    );
    let containers: Vec<(&str, &[i64])> = web
        .containers
        .iter()
        .map(|c| (c.name.as_str(), c.cpu_ids.as_slice()))
        .collect();
    assert_eq!(
        containers,
        [("proxy", &[][..]), ("app", &[1, 2][..]), ("log", &[][..])]
    );
    assert_eq!(listed.pod_resources.len(), 2);
    assert!(
        web.containers
            .iter()
            .all(|c| c.devices.is_empty() && c.memory.is_empty())
    );
    let allocatable = service(false)
        .get_allocatable_resources(Request::new(AllocatableResourcesRequest {}))
        .await
        .map(Response::into_inner)
        .expect("allocatable");
    assert_eq!(allocatable.cpu_ids, [1, 2, 3]);
}

async fn get(s: &PodResourcesService, name: &str) -> Result<GetPodResourcesResponse, Status> {
    let request = Request::new(GetPodResourcesRequest {
        pod_name: name.into(),
        pod_namespace: "default".into(),
    });
    s.get(request).await.map(Response::into_inner)
}

/// `Get` answers only with its gate on, and names a pod it does not have.
#[tokio::test]
async fn get_needs_its_gate_and_names_a_missing_pod() {
    let off = get(&service(false), "web").await.expect_err("gated");
    assert_eq!(off.code(), Code::Unimplemented);
    assert!(off.message().contains(GET_GATE), "{}", off.message());
    let on = service(true);
    let web = get(&on, "web").await.expect("found");
    assert_eq!(web.pod_resources.map(|p| p.containers.len()), Some(3));
    let missing = get(&on, "nope").await.expect_err("not found");
    assert_eq!(missing.code(), Code::NotFound);
    assert_eq!(missing.message(), "pod nope in namespace default not found");
}

/// Upstream's limiter: a burst of 10, then 100 calls a second; the clock is the test's.
#[test]
fn a_looping_client_is_held_to_the_rate_limit() {
    let s = service(false);
    let start = Instant::now() + Duration::from_secs(1);
    for _ in 0..10 {
        assert!(s.admit_at(start).is_ok());
    }
    let refused = s.admit_at(start).expect_err("beyond the burst");
    assert_eq!(refused.code(), Code::ResourceExhausted);
    // 10 ms later one token is back, and only one.
    let later = start + Duration::from_millis(10);
    assert!(s.admit_at(later).is_ok());
    assert!(s.admit_at(later).is_err());
    // A clock that seems to go back gives nothing.
    assert!(s.admit_at(start).is_err());
}

/// A pod that finished holds nothing: only the active pods are listed.
#[test]
fn finished_pods_are_not_listed() {
    let status = Arc::new(crate::status::StatusManager::default());
    for (name, uid, phase) in [
        ("web", "u1", "Running"),
        ("job", "u2", "Succeeded"),
        ("bad", "u3", "Failed"),
    ] {
        status.set_pod_status(
            &Arc::new(pod(name, uid)),
            PodStatus {
                phase: Some(phase.into()),
                ..PodStatus::default()
            },
        );
    }
    let sources = NodeSources { status, cpus: None };
    let names: Vec<Option<String>> = sources
        .active_pods()
        .into_iter()
        .map(|p| p.metadata.name)
        .collect();
    assert_eq!(names, [Some("web".to_owned())]);
    assert!(
        sources.allocatable_cpus().is_empty(),
        "no static policy: nothing to hand out"
    );
}
