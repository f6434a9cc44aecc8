//! The systemd cgroup driver's half of `cm` (`cgroupDriver: systemd`): the pods' slices made,
//! limited and stopped through systemd's D-Bus API (`org.freedesktop.systemd1.Manager`
//! `StartTransientUnit`, `SetUnitProperties`, `StopUnit`), each call waited on until systemd's
//! job for it has ended (its `JobRemoved` signal), and the start-up check that systemd can serve
//! it (`preflight`). The API is reached on the system bus.
//!
//! Upstream counterpart: the kubelet's `cgroupManagerImpl` with `libcontainerCgroupManagerType`
//! systemd (`pkg/kubelet/cm/cgroup_manager_linux.go`, `updateSystemdCgroupInfo`) over runc's
//! `libcontainer/cgroups/systemd` (`startUnit`, `genV1ResourcesProperties`,
//! `genV2ResourcesProperties`, `addCpuQuota`). A slice's parent is a `Wants=` dependency (runc
//! sets `Slice=` and `Delegate=` only for scopes, which the runtime makes for containers);
//! accounting is on and `DefaultDependencies=false` as runc has them. Where the slices are and
//! what they are named is `cgroup::pods`; the pod-level limits are computed as for cgroupfs
//! (`pod_cgroups::PodLimits`). Not here: the container scopes (the runtime's).

pub mod preflight;
#[cfg(test)]
mod tests;

use std::time::Duration;

use futures::StreamExt as _;
use zbus::{
    Connection, MatchRule, MessageStream,
    message::Type,
    zvariant::{OwnedObjectPath, Value},
};

use super::helpers::{CPU_PERIOD_US, shares_to_weight};

/// How long a job may take before it is given up on (runc's `startUnit`/`stopUnit` wait 30s).
const JOB_TIMEOUT: Duration = Duration::from_secs(30);

/// `JobRemoved` signals queued for one waiting call before older ones are dropped: other
/// clients' jobs end on a busy node too, and a dropped one of ours only means the wait ends
/// at [`JOB_TIMEOUT`].
const JOB_SIGNALS_QUEUED: usize = 256;

#[derive(Debug, thiserror::Error)]
pub enum SystemdError {
    #[error("systemd's D-Bus API on the system bus: {0}")]
    Connect(#[source] Box<zbus::Error>),
    #[error("systemd {method} {unit}: {source}")]
    Call {
        method: &'static str,
        unit: String,
        #[source]
        source: Box<zbus::Error>,
    },
    #[error("{dir:?} is not a slice's directory")]
    NotASlice { dir: String },
    #[error("systemd {method} {unit}: its job ended with {result:?}, not \"done\"")]
    JobFailed {
        method: &'static str,
        unit: String,
        result: String,
    },
    #[error("systemd {method} {unit}: its job did not end within {timeout:?}")]
    JobTimeout {
        method: &'static str,
        unit: String,
        timeout: Duration,
    },
}

#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Manager",
    default_service = "org.freedesktop.systemd1",
    default_path = "/org/freedesktop/systemd1",
    gen_blocking = false
)]
trait Manager {
    /// `StartTransientUnit(in s name, in s mode, in a(sv) properties, in a(sa(sv)) aux,
    /// out o job)`.
    fn start_transient_unit(
        &self,
        name: &str,
        mode: &str,
        properties: &[(&str, Value<'_>)],
        aux: &[(&str, &[(&str, Value<'_>)])],
    ) -> zbus::Result<OwnedObjectPath>;

    /// `SetUnitProperties(in s name, in b runtime, in a(sv) properties)`.
    fn set_unit_properties(
        &self,
        name: &str,
        runtime: bool,
        properties: &[(&str, Value<'_>)],
    ) -> zbus::Result<()>;

    /// `StopUnit(in s name, in s mode, out o job)`.
    fn stop_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;
}

/// Limits of one slice; `None` leaves a resource as systemd has it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SliceResources {
    pub cpu_shares: Option<u64>,
    /// CPU quota per period, in µs; -1 for none.
    pub cpu_quota_us: Option<i64>,
    /// The CFS period in µs (`cpuCFSQuotaPeriod`); `None` leaves systemd's (100ms).
    pub cpu_period_us: Option<u64>,
    pub memory_bytes: Option<i64>,
    pub pids_max: Option<i64>,
}

/// The pods' slices through systemd's manager object.
pub struct SystemdSlices {
    manager: ManagerProxy<'static>,
    /// cgroup v2 (`CPUWeight`, `MemoryMax`) rather than v1 (`CPUShares`, `MemoryLimit`)
    /// properties: the unified layout.
    unified: bool,
    /// [`JOB_TIMEOUT`]; shorter in tests.
    job_timeout: Duration,
}

/// A connection to systemd's manager on the system bus.
///
/// Not its private socket (`/run/systemd/private`), which go-systemd falls back to for root:
/// systemd sends on its direct connections with `Sender=org.freedesktop.systemd1`, not a
/// unique name, and zbus' reader task panics on such a message, leaving every call waiting.
/// A node whose dbus-daemon does not run gets the error instead.
pub async fn connect() -> Result<Connection, SystemdError> {
    Connection::system()
        .await
        .map_err(|e| SystemdError::Connect(Box::new(e)))
}

impl SystemdSlices {
    /// On the system bus ([`connect`]).
    pub async fn connect(unified: bool) -> Result<Self, SystemdError> {
        SystemdSlices::on(&connect().await?, unified).await
    }

    /// On an established connection (the system bus, or a peer in tests).
    pub async fn on(connection: &Connection, unified: bool) -> Result<Self, SystemdError> {
        let manager = ManagerProxy::new(connection)
            .await
            .map_err(|e| SystemdError::Connect(Box::new(e)))?;
        Ok(SystemdSlices {
            manager,
            unified,
            job_timeout: JOB_TIMEOUT,
        })
    }

    #[cfg(test)]
    fn with_job_timeout(self, job_timeout: Duration) -> Self {
        SystemdSlices {
            job_timeout,
            ..self
        }
    }

    /// Makes the slice whose expanded directory is `dir` (relative to the cgroup root, as
    /// `cgroup::pods` names it) with `resources`, or sets them on it if it exists (runc's
    /// `startUnit` takes `UnitExists` as success; its `Set` is `SetUnitProperties`). Returns
    /// once systemd's job for the start has ended, so the slice's cgroup exists for the
    /// runtime's scopes; a job that ends other than `done` is an error, as in runc.
    pub async fn ensure_slice(
        &self,
        dir: &str,
        resources: &SliceResources,
    ) -> Result<(), SystemdError> {
        let (unit, parent) = unit_and_parent(dir)?;
        let properties = slice_properties(unit, parent, resources, self.unified);
        let call = |method, source| SystemdError::Call {
            method,
            unit: unit.to_owned(),
            source: Box::new(source),
        };
        let mut jobs = self
            .job_removals()
            .await
            .map_err(|e| call("StartTransientUnit", e))?;
        match self
            .manager
            .start_transient_unit(unit, "replace", &properties, &[])
            .await
        {
            Ok(job) => match wait_for(&mut jobs, &job, self.job_timeout).await {
                Some(result) if result == "done" => Ok(()),
                Some(result) => Err(SystemdError::JobFailed {
                    method: "StartTransientUnit",
                    unit: unit.to_owned(),
                    result,
                }),
                None => Err(SystemdError::JobTimeout {
                    method: "StartTransientUnit",
                    unit: unit.to_owned(),
                    timeout: self.job_timeout,
                }),
            },
            Err(e) if is_error(&e, "org.freedesktop.systemd1.UnitExists") => {
                let resources = resource_properties(resources, self.unified);
                self.manager
                    .set_unit_properties(unit, true, &resources)
                    .await
                    .map_err(|e| call("SetUnitProperties", e))
            }
            Err(e) => Err(call("StartTransientUnit", e)),
        }
    }

    /// Stops the slice of `dir`; one systemd does not know is gone already. Waits for the stop
    /// job as runc's `stopUnit` does; one that does not end in time is logged, not an error
    /// (the caller removes what is left of the directories).
    pub async fn stop_slice(&self, dir: &str) -> Result<(), SystemdError> {
        let (unit, _) = unit_and_parent(dir)?;
        let call = |source| SystemdError::Call {
            method: "StopUnit",
            unit: unit.to_owned(),
            source: Box::new(source),
        };
        let mut jobs = self.job_removals().await.map_err(call)?;
        match self.manager.stop_unit(unit, "replace").await {
            Ok(job) => {
                match wait_for(&mut jobs, &job, self.job_timeout).await {
                    Some(result) if result == "done" => {}
                    Some(result) => {
                        tracing::warn!(unit, result, "systemd's stop job for a pod slice failed");
                    }
                    None => tracing::warn!(
                        unit,
                        timeout = ?self.job_timeout,
                        "systemd's stop job for a pod slice did not end in time"
                    ),
                }
                Ok(())
            }
            Err(e) if is_error(&e, "org.freedesktop.systemd1.NoSuchUnit") => Ok(()),
            Err(source) => Err(call(source)),
        }
    }

    /// The manager's `JobRemoved` signals from now on: subscribed before a call, so a job that
    /// ends before its path is known is not missed. A plain match rule rather than the proxy's
    /// signal stream, which would first ask the bus for the name's owner.
    async fn job_removals(&self) -> Result<MessageStream, zbus::Error> {
        let rule = MatchRule::builder()
            .msg_type(Type::Signal)
            .path("/org/freedesktop/systemd1")?
            .interface("org.freedesktop.systemd1.Manager")?
            .member("JobRemoved")?
            .build();
        MessageStream::for_match_rule(
            rule,
            self.manager.inner().connection(),
            Some(JOB_SIGNALS_QUEUED),
        )
        .await
    }
}

/// The result of `job` (`done`, `canceled`, `timeout`, `failed`, `dependency`, `skipped`) from
/// its `JobRemoved(u id, o job, s unit, s result)`; `None` if it does not come in time.
async fn wait_for(
    jobs: &mut MessageStream,
    job: &OwnedObjectPath,
    timeout: Duration,
) -> Option<String> {
    let wait = async {
        while let Some(message) = jobs.next().await {
            let Ok(message) = message else { continue };
            let Ok((_, path, _, result)) = message
                .body()
                .deserialize::<(u32, OwnedObjectPath, String, String)>()
            else {
                continue;
            };
            if path == *job {
                return Some(result);
            }
        }
        None
    };
    tokio::time::timeout(timeout, wait).await.ok().flatten()
}

/// The slice's unit name and its parent's (upstream `updateSystemdCgroupInfo`: `-.slice` for
/// the root).
fn unit_and_parent(dir: &str) -> Result<(&str, &str), SystemdError> {
    let dir = dir.trim_matches('/');
    let (parent, unit) = dir.rsplit_once('/').unwrap_or(("-.slice", dir));
    let parent = parent.rsplit('/').next().unwrap_or(parent);
    if unit.len() <= ".slice".len() || !unit.ends_with(".slice") {
        return Err(SystemdError::NotASlice {
            dir: dir.to_owned(),
        });
    }
    Ok((unit, parent))
}

fn is_error(error: &zbus::Error, name: &str) -> bool {
    matches!(error, zbus::Error::MethodError(error_name, _, _) if error_name.as_str() == name)
}

/// runc's `startUnit` properties for a slice: description, the parent as `Wants=`, accounting
/// on, no default dependencies, then the resources.
fn slice_properties(
    unit: &str,
    parent: &str,
    resources: &SliceResources,
    unified: bool,
) -> Vec<(&'static str, Value<'static>)> {
    let mut properties = vec![
        (
            "Description",
            Value::from(format!("libcontainer container {unit}")),
        ),
        ("Wants", Value::from(vec![parent.to_owned()])),
        ("MemoryAccounting", Value::from(true)),
        ("CPUAccounting", Value::from(true)),
        (
            if unified {
                "IOAccounting"
            } else {
                "BlockIOAccounting"
            },
            Value::from(true),
        ),
        ("TasksAccounting", Value::from(true)),
        ("DefaultDependencies", Value::from(false)),
    ];
    properties.extend(resource_properties(resources, unified));
    properties
}

/// runc's `genV1ResourcesProperties` / `genV2ResourcesProperties` for what pod cgroups set.
fn resource_properties(
    resources: &SliceResources,
    unified: bool,
) -> Vec<(&'static str, Value<'static>)> {
    let mut properties = Vec::new();
    if let Some(shares) = resources.cpu_shares {
        properties.push(if unified {
            ("CPUWeight", Value::from(shares_to_weight(shares)))
        } else {
            ("CPUShares", Value::from(shares))
        });
    }
    if let Some(period) = resources.cpu_period_us {
        properties.push(("CPUQuotaPeriodUSec", Value::from(period)));
    }
    if let Some(quota) = resources.cpu_quota_us {
        let period = resources.cpu_period_us.unwrap_or(CPU_PERIOD_US as u64);
        properties.push((
            "CPUQuotaPerSecUSec",
            Value::from(quota_per_sec(quota, period)),
        ));
    }
    if let Some(memory) = resources.memory_bytes {
        let limit = u64::try_from(memory).unwrap_or(u64::MAX);
        properties.push(if unified {
            ("MemoryMax", Value::from(limit))
        } else {
            ("MemoryLimit", Value::from(limit))
        });
    }
    if let Some(pids) = resources.pids_max {
        properties.push((
            "TasksMax",
            Value::from(u64::try_from(pids).unwrap_or(u64::MAX)),
        ));
    }
    properties
}

/// runc's `addCpuQuota`: the quota per second of a quota per `period_us`, rounded up to whole
/// 10ms as systemd keeps it; none (`-1`, or 0) is infinity.
fn quota_per_sec(quota_us: i64, period_us: u64) -> u64 {
    let quota = match u64::try_from(quota_us) {
        Ok(quota) if quota > 0 => quota,
        _ => return u64::MAX,
    };
    let per_sec = quota.saturating_mul(1_000_000) / period_us.max(1);
    per_sec.div_ceil(10_000) * 10_000
}
