//! Which cgroup driver the node uses: the container runtime's, when it says (CRI `RuntimeConfig`,
//! KEP-4033), else `cgroupDriver` from the configuration. Asked once at start, before anything
//! names a cgroup: the CRI spec has the runtime keep the answer for the kubelet's lifetime.
//!
//! Upstream: `cmd/kubelet/app/server.go` `getCgroupDriverFromCRI` (feature gate
//! `KubeletCgroupDriverFromCRI`, GA and locked on since v1.34): up to three tries, 2 s apart, for
//! errors that may be transient; Unimplemented is final and keeps the configured driver (logged at
//! info, and `kubelet_cri_losing_support{version="1.38.0"}` set to 1); an answer without `linux`
//! keeps it too; `SYSTEMD`/`CGROUPFS` replace it; any other value is an error. Upstream's newest
//! development branch refuses Unimplemented unless `DisableCgroupDriverFallback` is set false;
//! swiftlet keeps the v1.35 behaviour (containerd 1.6 and 1.7 answer Unimplemented).
//!
//! Not here: whether the chosen driver can work on this node (`cm::systemd::preflight`), and what
//! the app does with the choice.

use std::{future::Future, time::Duration};

use k8s_cri::v1 as cri;

use crate::{
    cgroup::pods::CgroupDriver,
    cri::{Error as CriError, RuntimeService},
};

/// How many times a failing `RuntimeConfig` is asked, as upstream.
pub const ATTEMPTS: u32 = 3;
/// The pause between two tries, as upstream (the runtime may still be starting).
pub const RETRY_PAUSE: Duration = Duration::from_secs(2);

/// Where the driver in effect came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The runtime named it.
    Runtime,
    /// The runtime does not implement `RuntimeConfig`: the configuration's.
    Unimplemented,
    /// The runtime answered without a Linux configuration: the configuration's.
    NoLinuxConfig,
}

/// The driver to use and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Choice {
    pub driver: CgroupDriver,
    pub source: Source,
}

#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error(
        "cgroupDriver: asking the container runtime for its cgroup driver (CRI RuntimeConfig) \
         failed {attempts} times: {source}"
    )]
    Query {
        attempts: u32,
        #[source]
        source: CriError,
    },
    #[error(
        "cgroupDriver: the container runtime reported an unknown cgroup driver {value} (CRI \
         RuntimeConfig); expected SYSTEMD (0) or CGROUPFS (1)"
    )]
    Unknown { value: i32 },
}

/// Asks `runtime` for its cgroup driver and decides the one to use over `configured`. `pause`
/// waits between tries (the app sleeps [`RETRY_PAUSE`]; tests pass a no-op).
pub async fn choose<P, F>(
    runtime: &dyn RuntimeService,
    configured: CgroupDriver,
    mut pause: P,
) -> Result<Choice, DriverError>
where
    P: FnMut() -> F,
    F: Future<Output = ()>,
{
    let mut attempt = 1;
    let response = loop {
        match runtime.runtime_config().await {
            Ok(response) => break response,
            Err(e) if e.code() == tonic::Code::Unimplemented => {
                // Final: asking again would get the same answer.
                return Ok(Choice {
                    driver: configured,
                    source: Source::Unimplemented,
                });
            }
            Err(source) if attempt >= ATTEMPTS => {
                return Err(DriverError::Query {
                    attempts: attempt,
                    source,
                });
            }
            Err(error) => {
                tracing::debug!(%error, attempt, "RuntimeConfig failed; asking again");
                pause().await;
                attempt += 1;
            }
        }
    };
    decide(&response, configured)
}

/// The driver a `RuntimeConfig` answer gives.
pub fn decide(
    response: &cri::RuntimeConfigResponse,
    configured: CgroupDriver,
) -> Result<Choice, DriverError> {
    // A missing `linux` must not read as the enum's zero value (SYSTEMD), as upstream notes.
    let Some(linux) = &response.linux else {
        return Ok(Choice {
            driver: configured,
            source: Source::NoLinuxConfig,
        });
    };
    let driver = match cri::CgroupDriver::try_from(linux.cgroup_driver) {
        Ok(cri::CgroupDriver::Systemd) => CgroupDriver::Systemd,
        Ok(cri::CgroupDriver::Cgroupfs) => CgroupDriver::Cgroupfs,
        Err(_) => {
            return Err(DriverError::Unknown {
                value: linux.cgroup_driver,
            });
        }
    };
    Ok(Choice {
        driver,
        source: Source::Runtime,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;
    use crate::cri::{Operation, fake::FakeRuntime};

    fn answer(driver: Option<i32>) -> cri::RuntimeConfigResponse {
        cri::RuntimeConfigResponse {
            linux: driver.map(|cgroup_driver| cri::LinuxRuntimeConfiguration { cgroup_driver }),
        }
    }

    #[test]
    fn an_answer_decides_over_the_configuration() {
        use CgroupDriver::{Cgroupfs, Systemd};
        let systemd = cri::CgroupDriver::Systemd as i32;
        let cgroupfs = cri::CgroupDriver::Cgroupfs as i32;
        for (linux, configured, want) in [
            (Some(systemd), Cgroupfs, (Systemd, Source::Runtime)),
            (Some(cgroupfs), Systemd, (Cgroupfs, Source::Runtime)),
            (Some(cgroupfs), Cgroupfs, (Cgroupfs, Source::Runtime)),
            (None, Cgroupfs, (Cgroupfs, Source::NoLinuxConfig)),
            (None, Systemd, (Systemd, Source::NoLinuxConfig)),
        ] {
            let choice = decide(&answer(linux), configured).expect("known driver");
            assert_eq!(
                (choice.driver, choice.source),
                want,
                "{linux:?} over {configured}"
            );
        }
        let error = decide(&answer(Some(7)), Cgroupfs).expect_err("unknown");
        assert!(matches!(error, DriverError::Unknown { value: 7 }));
        assert!(error.to_string().starts_with("cgroupDriver: "), "{error}");
    }

    #[tokio::test]
    async fn unimplemented_keeps_the_configured_driver_without_asking_again() {
        let runtime = FakeRuntime::new();
        let pauses = AtomicU32::new(0);
        let choice = choose(&runtime, CgroupDriver::Systemd, || async {
            pauses.fetch_add(1, Ordering::SeqCst);
        })
        .await
        .expect("falls back");
        assert_eq!(
            choice,
            Choice {
                driver: CgroupDriver::Systemd,
                source: Source::Unimplemented
            }
        );
        let asked = runtime
            .calls()
            .iter()
            .filter(|c| c.operation() == Operation::RuntimeConfig)
            .count();
        assert_eq!((asked, pauses.load(Ordering::SeqCst)), (1, 0));
    }

    #[tokio::test]
    async fn a_transient_failure_is_asked_again_and_three_fail() {
        let runtime = FakeRuntime::new();
        runtime.set_runtime_config(Some(answer(Some(cri::CgroupDriver::Systemd as i32))));
        runtime.fail_next(Operation::RuntimeConfig, tonic::Code::Unavailable);
        let pauses = AtomicU32::new(0);
        let pause = || async {
            pauses.fetch_add(1, Ordering::SeqCst);
        };
        let choice = choose(&runtime, CgroupDriver::Cgroupfs, pause)
            .await
            .expect("second try answers");
        assert_eq!(choice.driver, CgroupDriver::Systemd);
        assert_eq!(pauses.load(Ordering::SeqCst), 1);

        runtime.take_calls();
        runtime.fail_always(Operation::RuntimeConfig, tonic::Code::Internal);
        let error = choose(&runtime, CgroupDriver::Cgroupfs, pause)
            .await
            .expect_err("three failures");
        assert!(
            matches!(error, DriverError::Query { attempts: 3, .. }),
            "{error:?}"
        );
        assert_eq!(runtime.calls().len(), 3);
        assert_eq!(pauses.load(Ordering::SeqCst), 3);
        assert!(
            error
                .to_string()
                .starts_with("cgroupDriver: asking the container runtime"),
            "{error}"
        );
    }
}
