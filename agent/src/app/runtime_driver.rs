//! The node's cgroup driver at start: the container runtime is asked once
//! (`kuberuntime::cgroup_driver`) after the certificates and before the pods' cgroups and the
//! kernel programs name anything, where upstream's `run` asks it (`cmd/kubelet/app/server.go`:
//! after `PreInitRuntimeService`, before `NewContainerManager`). A driver the runtime names
//! replaces `cgroupDriver`, as upstream; when it is not the configured one the change is logged
//! and the new driver goes through the same start check as a configured one
//! (`cm::systemd::preflight`), a refusal naming both. Unimplemented keeps the configured driver,
//! logged once at info, with upstream's `kubelet_cri_losing_support` gauge.
//!
//! The question goes over the client the agent runs with (made just before, counted in
//! `kubelet_runtime_operations_total` as `runtime_config`).

use prometheus::{IntGaugeVec, Opts};
use zbus::Connection;

use crate::{
    cgroup::pods::CgroupDriver,
    cm::systemd::preflight::{self, PreflightError},
    config::Config,
    cri::GrpcRuntime,
    kuberuntime::cgroup_driver::{self, Choice, DriverError, RETRY_PAUSE, Source},
    metrics::Metrics,
};

/// The release upstream names as the one that stops accepting a runtime without
/// `RuntimeConfig` (the label of `kubelet_cri_losing_support`).
const LOSING_SUPPORT_IN: &str = "1.38.0";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Query(#[from] DriverError),
    #[error(
        "cgroupDriver: the configuration says {configured} and the container runtime uses \
         {runtime} (CRI RuntimeConfig); swiftlet follows the runtime, as the kubelet does, but \
         {runtime} cannot be used here: {source}"
    )]
    Unusable {
        configured: CgroupDriver,
        runtime: CgroupDriver,
        #[source]
        source: PreflightError,
    },
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

impl Error {
    pub fn hint(&self) -> Option<String> {
        match self {
            Error::Query(_) => Some(
                "the runtime at --runtime-endpoint must answer CRI v1 RuntimeConfig, or say it \
                 does not implement it"
                    .into(),
            ),
            Error::Unusable { .. } => Some(
                "set the runtime's cgroup driver to one this node can use (containerd: \
                 SystemdCgroup in the runc options), and cgroupDriver to the same"
                    .into(),
            ),
            Error::Metrics(_) => None,
        }
    }
}

/// Asks the runtime and sets `config.cgroup_driver` to the driver in effect; returns the
/// connection to systemd's manager the pods' slices are made through (`systemd`, the one the
/// configured driver's start check made, unless the driver changed).
pub async fn resolve(
    config: &mut Config,
    metrics: &Metrics,
    runtime: &GrpcRuntime,
    systemd: Option<Connection>,
) -> Result<Option<Connection>, Error> {
    let configured = config.cgroup_driver;
    let choice =
        cgroup_driver::choose(runtime, configured, || tokio::time::sleep(RETRY_PAUSE)).await?;
    report(configured, choice, metrics)?;
    if choice.driver == configured {
        return Ok(systemd);
    }
    let systemd = preflight::check(choice.driver, &config.cgroup_root, &Default::default())
        .await
        .map_err(|source| Error::Unusable {
            configured,
            runtime: choice.driver,
            source,
        })?;
    config.cgroup_driver = choice.driver;
    Ok(systemd)
}

/// One log line for the choice (upstream's words where it has them), and the gauge for a
/// runtime without `RuntimeConfig`.
fn report(configured: CgroupDriver, choice: Choice, metrics: &Metrics) -> Result<(), Error> {
    match choice.source {
        Source::Unimplemented => {
            tracing::info!(
                cgroup_driver = %configured,
                "the container runtime does not implement CRI RuntimeConfig: using cgroupDriver \
                 from the configuration (the runtime should be updated to support RuntimeConfig)"
            );
            let gauge = IntGaugeVec::new(
                Opts::new(
                    "kubelet_cri_losing_support",
                    "the Kubernetes version that the currently running CRI implementation will \
                     lose support on if not upgraded.",
                ),
                &["version"],
            )?;
            gauge.with_label_values(&[LOSING_SUPPORT_IN]).set(1);
            metrics.registry.register(Box::new(gauge))?;
        }
        Source::NoLinuxConfig => tracing::info!(
            cgroup_driver = %configured,
            "the container runtime's RuntimeConfig has no Linux configuration: using \
             cgroupDriver from the configuration"
        ),
        Source::Runtime if choice.driver == configured => tracing::info!(
            cgroup_driver = %choice.driver,
            "using the cgroup driver setting received from the CRI runtime"
        ),
        Source::Runtime => tracing::warn!(
            configured = %configured,
            cgroup_driver = %choice.driver,
            "cgroupDriver is {configured} but the container runtime uses {}: using the \
             runtime's (CRI RuntimeConfig), as the kubelet does",
            choice.driver
        ),
    }
    Ok(())
}
