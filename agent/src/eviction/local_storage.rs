//! Local storage limits of pods (upstream `localStorageEviction` and `emptyDirLimitEviction` in
//! `eviction_manager.go`): a pod whose emptyDir holds more than its `sizeLimit` is evicted at
//! once, before any threshold is looked at, with upstream's message.
//!
//! Not here: measuring (the volume manager does, handed in as [`EmptyDirUsageFn`]), and the
//! containers' `ephemeral-storage` limits.

use k8s_openapi::api::core::v1::Pod;

use crate::cm::quantity;

/// The bytes each set-up emptyDir of a pod holds, by volume name.
pub type EmptyDirUsageFn = Box<dyn Fn(&Pod) -> Vec<(String, u64)> + Send + Sync>;

/// Whether `pod` has an emptyDir with a positive `sizeLimit` (only those are measured).
pub fn has_size_limits(pod: &Pod) -> bool {
    !size_limits(pod).is_empty()
}

/// (volume, limit as written, limit in bytes) of the pod's emptyDirs with a positive limit.
fn size_limits(pod: &Pod) -> Vec<(String, String, u64)> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| {
            let limit = v.empty_dir.as_ref()?.size_limit.as_ref()?;
            let bytes = quantity::memory_bytes(&limit.0).ok()?;
            (bytes > 0).then(|| (v.name.clone(), limit.0.clone(), bytes.unsigned_abs()))
        })
        .collect()
}

/// The eviction message when one of the pod's emptyDirs holds more than its limit (upstream
/// `emptyDirMessageFmt`).
pub fn empty_dir_violation(pod: &Pod, usage: &[(String, u64)]) -> Option<String> {
    size_limits(pod)
        .into_iter()
        .find_map(|(name, text, limit)| {
            let used = usage.iter().find(|(v, _)| *v == name)?.1;
            (used > limit)
                .then(|| format!("Usage of EmptyDir volume {name:?} exceeds the limit {text:?}. "))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::{
        api::core::v1::{EmptyDirVolumeSource, Volume},
        apimachinery::pkg::api::resource::Quantity,
    };

    fn pod(limits: &[(&str, Option<&str>)]) -> Pod {
        crate::testing::pod()
            .volumes(
                limits
                    .iter()
                    .map(|(name, limit)| Volume {
                        name: (*name).into(),
                        empty_dir: Some(EmptyDirVolumeSource {
                            size_limit: limit.map(|l| Quantity(l.into())),
                            ..Default::default()
                        }),
                        ..Default::default()
                    })
                    .collect(),
            )
            .build()
    }

    #[test]
    fn only_usage_over_a_positive_limit_violates() {
        let p = pod(&[("free", None), ("zero", Some("0")), ("small", Some("1Mi"))]);
        assert!(has_size_limits(&p));
        assert!(!has_size_limits(&pod(&[("free", None)])));
        let usage = |small| {
            vec![
                ("free".to_owned(), 1u64 << 40),
                ("zero".to_owned(), 1 << 40),
                ("small".to_owned(), small),
            ]
        };
        assert_eq!(empty_dir_violation(&p, &usage(1 << 20)), None);
        assert_eq!(
            empty_dir_violation(&p, &usage((1 << 20) + 1)).as_deref(),
            Some("Usage of EmptyDir volume \"small\" exceeds the limit \"1Mi\". ")
        );
        // Not measured (not set up): nothing to say.
        assert_eq!(empty_dir_violation(&p, &[]), None);
    }
}
