//! What a DELETE does to an object: upstream's `registry/rest/delete.go` `BeforeDelete` with
//! the pod's `CheckGracefulDelete` (`pkg/registry/core/pod/strategy.go`), as a pure decision the
//! store then carries out. See
//! <https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-termination>.

use serde_json::Value;

use super::{
    meta::{meta_str, parse_rfc3339},
    resources::Resource,
    status::{ApiError, ApiResult},
};

/// The parts of `metav1.DeleteOptions` the server honours.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeleteOptions {
    pub grace_period_seconds: Option<i64>,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
}

impl DeleteOptions {
    /// From a DELETE's JSON body (`DeleteOptions`) and its query (`gracePeriodSeconds`), the
    /// body's values winning as upstream's decoding of both into one struct does.
    pub fn from_request(body: &Value, query_grace: Option<i64>) -> DeleteOptions {
        let preconditions = body.get("preconditions");
        DeleteOptions {
            grace_period_seconds: body
                .get("gracePeriodSeconds")
                .and_then(Value::as_i64)
                .or(query_grace),
            uid: preconditions
                .and_then(|p| p.get("uid"))
                .and_then(Value::as_str)
                .map(str::to_owned),
            resource_version: preconditions
                .and_then(|p| p.get("resourceVersion"))
                .and_then(Value::as_str)
                .map(str::to_owned),
        }
    }
}

/// What to do with the object.
#[derive(Debug, Clone, PartialEq)]
pub enum Deletion {
    /// Remove it now (or, with finalizers left, mark it deleting with grace 0 and remove it
    /// when the last finalizer goes).
    Now,
    /// Set `deletionTimestamp` (seconds since the epoch) and `deletionGracePeriodSeconds`; the
    /// object stays until a DELETE with grace 0 (the kubelet's, once the pod stopped).
    Graceful {
        deletion_timestamp: i64,
        grace_period_seconds: i64,
    },
    /// A graceful deletion is already under way and this DELETE does not shorten it: nothing
    /// changes.
    Pending,
}

/// `terminationGracePeriodSeconds`' API default (`SetDefaults_PodSpec`).
pub const DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS: i64 = 30;

/// Upstream `BeforeDelete`: preconditions first (409 Conflict), then, for pods (the one
/// resource with a graceful delete strategy here), the grace period.
pub fn decide(
    resource: &Resource,
    object: &Value,
    options: &DeleteOptions,
    now: i64,
) -> ApiResult<Deletion> {
    let name = meta_str(object, "name").unwrap_or_default();
    let uid = meta_str(object, "uid").unwrap_or_default();
    if let Some(want) = &options.uid
        && want != uid
    {
        return Err(ApiError::conflict(
            resource,
            name,
            &format!(
                "the UID in the precondition ({want}) does not match the UID in record ({uid}). \
                 The object might have been deleted and then recreated"
            ),
        ));
    }
    let version = meta_str(object, "resourceVersion").unwrap_or_default();
    if let Some(want) = &options.resource_version
        && want != version
    {
        return Err(ApiError::conflict(
            resource,
            name,
            &format!(
                "the ResourceVersion in the precondition ({want}) does not match the \
                 ResourceVersion in record ({version}). The object might have been modified"
            ),
        ));
    }
    if !(resource.kind == "Pod" && resource.group.is_empty()) {
        return Ok(Deletion::Now);
    }
    // Negative grace periods count as 1 s on the delete path.
    let requested = options
        .grace_period_seconds
        .map(|g| if g < 0 { 1 } else { g });
    let metadata = object.get("metadata");
    let deleting_since = metadata
        .and_then(|m| m.get("deletionTimestamp"))
        .and_then(Value::as_str)
        .and_then(parse_rfc3339);
    if let Some(timestamp) = deleting_since {
        let current = metadata
            .and_then(|m| m.get("deletionGracePeriodSeconds"))
            .and_then(Value::as_i64)
            .unwrap_or(0);
        // Already deleting with grace 0 (or none recorded): finish it now.
        if current <= 0 {
            return Ok(Deletion::Now);
        }
        // Only a shorter grace period may be given; the deadline moves by the difference.
        return Ok(match requested {
            Some(period) if period < current => {
                if period == 0 {
                    Deletion::Now
                } else {
                    Deletion::Graceful {
                        deletion_timestamp: timestamp - current + period,
                        grace_period_seconds: period,
                    }
                }
            }
            _ => Deletion::Pending,
        });
    }
    let spec = object.get("spec");
    let mut period = requested.unwrap_or_else(|| {
        spec.and_then(|s| s.get("terminationGracePeriodSeconds"))
            .and_then(Value::as_i64)
            .unwrap_or(DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS)
    });
    // An unscheduled pod has nothing to stop: it goes at once.
    if spec
        .and_then(|s| s.get("nodeName"))
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        period = 0;
    }
    // A pod in a terminal phase has nothing running: it goes at once.
    let phase = object
        .get("status")
        .and_then(|s| s.get("phase"))
        .and_then(Value::as_str);
    if matches!(phase, Some("Failed" | "Succeeded")) {
        period = 0;
    }
    if period < 0 {
        period = 1;
    }
    if period == 0 {
        return Ok(Deletion::Now);
    }
    Ok(Deletion::Graceful {
        deletion_timestamp: now + period,
        grace_period_seconds: period,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::apiserver::resources::find;

    fn pods() -> &'static Resource {
        find("", "v1", "pods").expect("pods")
    }

    fn grace(g: i64) -> DeleteOptions {
        DeleteOptions {
            grace_period_seconds: Some(g),
            ..DeleteOptions::default()
        }
    }

    const NOW: i64 = 1_700_000_000;

    #[test]
    fn pod_deletion_follows_check_graceful_delete() {
        let bound = json!({"metadata": {"name": "p", "uid": "u"}, "spec": {"nodeName": "n", "terminationGracePeriodSeconds": 45}});
        let unset = json!({"metadata": {"name": "p", "uid": "u"}, "spec": {"nodeName": "n"}});
        let unbound = json!({"metadata": {"name": "p", "uid": "u"}, "spec": {"terminationGracePeriodSeconds": 45}});
        let done = json!({"metadata": {"name": "p", "uid": "u"}, "spec": {"nodeName": "n"}, "status": {"phase": "Succeeded"}});
        let graceful = |g| Deletion::Graceful {
            deletion_timestamp: NOW + g,
            grace_period_seconds: g,
        };
        let cases = [
            (
                "spec default",
                &bound,
                DeleteOptions::default(),
                graceful(45),
            ),
            (
                "API default",
                &unset,
                DeleteOptions::default(),
                graceful(30),
            ),
            ("given", &bound, grace(5), graceful(5)),
            ("negative is 1", &bound, grace(-3), graceful(1)),
            ("zero", &bound, grace(0), Deletion::Now),
            ("unbound", &unbound, DeleteOptions::default(), Deletion::Now),
            ("terminal", &done, grace(20), Deletion::Now),
        ];
        for (what, pod, options, want) in cases {
            assert_eq!(decide(pods(), pod, &options, NOW), Ok(want), "{what}");
        }
    }

    #[test]
    fn a_later_delete_may_only_shorten_the_grace_period() {
        let deleting = json!({"metadata": {
            "name": "p", "uid": "u",
            "deletionTimestamp": "2023-11-14T22:13:50Z",
            "deletionGracePeriodSeconds": 30,
        }, "spec": {"nodeName": "n"}});
        assert_eq!(
            decide(pods(), &deleting, &DeleteOptions::default(), NOW),
            Ok(Deletion::Pending)
        );
        assert_eq!(
            decide(pods(), &deleting, &grace(60), NOW),
            Ok(Deletion::Pending)
        );
        assert_eq!(
            decide(pods(), &deleting, &grace(10), NOW),
            Ok(Deletion::Graceful {
                deletion_timestamp: NOW + 10,
                grace_period_seconds: 10
            })
        );
        assert_eq!(decide(pods(), &deleting, &grace(0), NOW), Ok(Deletion::Now));
    }

    #[test]
    fn preconditions_conflict() {
        let pod =
            json!({"metadata": {"name": "p", "uid": "u", "resourceVersion": "7"}, "spec": {}});
        let wrong_uid = DeleteOptions {
            uid: Some("other".into()),
            ..DeleteOptions::default()
        };
        let error = decide(pods(), &pod, &wrong_uid, NOW).expect_err("conflict");
        assert_eq!((error.code, error.reason), (409, "Conflict"));
        let wrong_version = DeleteOptions {
            resource_version: Some("6".into()),
            ..DeleteOptions::default()
        };
        assert_eq!(
            decide(pods(), &pod, &wrong_version, NOW).map_err(|e| e.code),
            Err(409)
        );
        let right = DeleteOptions {
            uid: Some("u".into()),
            resource_version: Some("7".into()),
            ..DeleteOptions::default()
        };
        assert_eq!(decide(pods(), &pod, &right, NOW), Ok(Deletion::Now));
    }

    #[test]
    fn other_resources_delete_at_once() {
        let configmaps = find("", "v1", "configmaps").expect("configmaps");
        let object = json!({"metadata": {"name": "c", "uid": "u"}});
        assert_eq!(
            decide(configmaps, &object, &grace(30), NOW),
            Ok(Deletion::Now)
        );
    }
}
