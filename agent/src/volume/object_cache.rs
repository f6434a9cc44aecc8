//! ConfigMaps and Secrets read through a time-limited cache (upstream
//! `pkg/kubelet/util/manager/cache_based_manager.go`, the `Cache` change-detection strategy): a
//! read older than the TTL, or made before a pod newly referenced the object, is made again with
//! a GET; otherwise the cached answer is served. Only objects some registered pod references are
//! cached, one answer each, of at most [`MAX_OBJECT_BYTES`].
//!
//! Deviation: upstream takes the TTL from the Node's `node.alpha.kubernetes.io/ttl` annotation
//! (set by the TTL controller, 0 s in clusters of up to 100 nodes), defaulting to a minute;
//! swiftlet uses the minute.

use crate::lock::MutexExt as _;
use std::{
    collections::{BTreeSet, HashMap},
    sync::Mutex,
    time::Duration,
};

use super::{
    api_objects::{
        IssuedToken, KubeObjects, MAX_OBJECT_BYTES, ObjectData, ObjectRef, ObjectSource, TokenSpec,
        object_bytes,
    },
    spec::ObjectKind,
};
use crate::{clock::Clock, container::PodUid};

/// Upstream `defaultTTL`.
pub const DEFAULT_TTL: Duration = Duration::from_secs(60);

type Answer = Result<Option<ObjectData>, String>;

#[derive(Default)]
struct Entry {
    refs: usize,
    /// When it was read, and what the API server answered; `None` until the next read.
    read: Option<(std::time::SystemTime, Answer)>,
}

#[derive(Default)]
struct Registry {
    entries: HashMap<ObjectRef, Entry>,
    pods: HashMap<PodUid, BTreeSet<ObjectRef>>,
}

pub struct CachedObjects {
    direct: KubeObjects,
    registry: Mutex<Registry>,
    ttl: Duration,
    clock: Clock,
}

impl CachedObjects {
    pub fn new(client: kube::Client, ttl: Duration, clock: Clock) -> Self {
        CachedObjects {
            direct: KubeObjects(client),
            registry: Mutex::new(Registry::default()),
            ttl,
            clock,
        }
    }

    fn fresh(&self, key: &ObjectRef) -> Option<Answer> {
        let registry = self.registry.lock_unpoisoned();
        let (at, answer) = registry.entries.get(key)?.read.as_ref()?;
        let age = (self.clock)().duration_since(*at).unwrap_or(Duration::MAX);
        (age <= self.ttl).then(|| answer.clone())
    }
}

#[tonic::async_trait]
impl ObjectSource for CachedObjects {
    async fn get(&self, kind: ObjectKind, namespace: &str, name: &str) -> Answer {
        let key = ObjectRef {
            kind,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        };
        if let Some(answer) = self.fresh(&key) {
            return answer;
        }
        let mut answer = self.direct.get(kind, namespace, name).await;
        if let Ok(Some(data)) = &answer {
            let bytes = object_bytes(data);
            if bytes > MAX_OBJECT_BYTES {
                answer = Err(format!(
                    "{name:?} holds {bytes} bytes, more than the {MAX_OBJECT_BYTES} the node keeps"
                ));
            }
        }
        let now = (self.clock)();
        if let Some(entry) = self.registry.lock_unpoisoned().entries.get_mut(&key) {
            entry.read = Some((now, answer.clone()));
        }
        answer
    }

    async fn token(&self, spec: &TokenSpec) -> Result<IssuedToken, String> {
        self.direct.token(spec).await
    }

    /// Upstream's `AddReference`: a new reference makes the next read go to the API server.
    fn register_pod(&self, pod: &PodUid, objects: &BTreeSet<ObjectRef>) {
        if objects.is_empty() {
            return self.unregister_pod(pod);
        }
        let mut registry = self.registry.lock_unpoisoned();
        if registry.pods.get(pod) == Some(objects) {
            return;
        }
        for key in objects {
            let entry = registry.entries.entry(key.clone()).or_default();
            entry.refs += 1;
            entry.read = None;
        }
        if let Some(previous) = registry.pods.insert(pod.clone(), objects.clone()) {
            for key in &previous {
                release(&mut registry, key);
            }
        }
    }

    fn unregister_pod(&self, pod: &PodUid) {
        let mut registry = self.registry.lock_unpoisoned();
        if let Some(previous) = registry.pods.remove(pod) {
            for key in &previous {
                release(&mut registry, key);
            }
        }
    }
}

fn release(registry: &mut Registry, key: &ObjectRef) {
    let gone = registry.entries.get_mut(key).is_some_and(|e| {
        e.refs = e.refs.saturating_sub(1);
        e.refs == 0
    });
    if gone {
        registry.entries.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::fake_api::fake_api;
    use http::Method;
    use serde_json::json;
    use std::{
        sync::{
            Arc,
            atomic::{AtomicU64, Ordering},
        },
        time::SystemTime,
    };

    #[tokio::test(start_paused = true)]
    async fn served_from_the_cache_within_the_ttl_and_after_a_new_reference_read_again() {
        let (client, mut api) = fake_api();
        let now = Arc::new(AtomicU64::new(0));
        let clock_now = now.clone();
        let clock: Clock = Arc::new(move || {
            SystemTime::UNIX_EPOCH + Duration::from_secs(clock_now.load(Ordering::SeqCst))
        });
        let objects = CachedObjects::new(client, DEFAULT_TTL, clock);
        let web: BTreeSet<ObjectRef> = [ObjectRef {
            kind: ObjectKind::Secret,
            namespace: "prod".into(),
            name: "db".into(),
        }]
        .into();
        objects.register_pod(&PodUid::from("u1"), &web);
        let read = || async {
            objects
                .get(ObjectKind::Secret, "prod", "db")
                .await
                .map(|d| d.and_then(|d| d.get("k").cloned()))
        };
        async fn serve(api: &mut crate::testing::fake_api::FakeApi, value: &str) {
            api.expect(Method::GET, "/api/v1/namespaces/prod/secrets/db")
                .await
                .reply(
                    200,
                    &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db", "namespace": "prod"}, "stringData": {"k": value}}),
                );
        }
        let (_, first) = tokio::join!(serve(&mut api, "a"), read());
        assert_eq!(first, Ok(Some(b"a".to_vec())));
        now.store(60, Ordering::SeqCst);
        assert_eq!(read().await, Ok(Some(b"a".to_vec())), "within the TTL");
        now.store(61, Ordering::SeqCst);
        let (_, expired) = tokio::join!(serve(&mut api, "b"), read());
        assert_eq!(expired, Ok(Some(b"b".to_vec())));
        // Another pod referencing it: read again at once.
        objects.register_pod(&PodUid::from("u2"), &web);
        let (_, renewed) = tokio::join!(serve(&mut api, "c"), read());
        assert_eq!(renewed, Ok(Some(b"c".to_vec())));
        assert_eq!(read().await, Ok(Some(b"c".to_vec())));
        api.assert_no_request(Duration::from_secs(1)).await;
    }
}
