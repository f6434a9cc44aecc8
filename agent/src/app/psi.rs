//! The per-pod and per-container pressure metrics (`container_pressure_*`, KEP-4205): the pod
//! cgroups found on the cgroup2 mount, named by the status manager (namespace and name as the
//! pod source gave them) and the PLEG cache (which runtime id is which container), read at each
//! scrape.

use std::{collections::HashMap, sync::Arc};

use prometheus::Registry;

use crate::{
    cm::{
        pod_cgroups::PodCgroups,
        pressure_targets::{self, PodNames},
    },
    container::PodUid,
    metrics::PsiCollector,
    pleg::cache::PodCache,
    status::StatusManager,
};

/// Registers the collector of the pods' and containers' pressure in `registry`.
pub fn register_psi_metrics(
    registry: &Registry,
    cgroups: &Arc<PodCgroups>,
    cache: Arc<PodCache>,
    status: &Arc<StatusManager>,
) -> Result<(), prometheus::Error> {
    let (cgroups, status) = (cgroups.clone(), status.clone());
    let lister = move || {
        let dirs = cgroups.cgroup2_pod_dirs();
        if dirs.is_empty() {
            return Vec::new();
        }
        let pods: HashMap<PodUid, (String, String)> = status
            .pods()
            .into_iter()
            .filter_map(|p| {
                let meta = p.pod.metadata;
                Some((
                    PodUid(meta.uid?),
                    (meta.namespace.unwrap_or_default(), meta.name?),
                ))
            })
            .collect();
        pressure_targets::label(dirs, |uid| {
            let cached = cache.get(uid).status;
            // A pod the status manager has forgotten while its cgroup lingers is still named
            // by its sandbox, as the runtime reports it.
            let (namespace, name) = pods.get(uid).cloned().or_else(|| {
                cached
                    .as_ref()
                    .filter(|s| !s.name.is_empty())
                    .map(|s| (s.namespace.clone(), s.name.clone()))
            })?;
            let containers = cached
                .map(|s| {
                    s.containers
                        .into_iter()
                        .map(|c| (c.id.id, c.name))
                        .collect()
                })
                .unwrap_or_default();
            Some(PodNames {
                namespace,
                name,
                containers,
            })
        })
    };
    registry.register(Box::new(PsiCollector::new(Box::new(lister))?))
}
