//! Lifecycle hooks (upstream `pkg/kubelet/lifecycle/handlers.go`): `postStart` runs right after
//! a container starts and a failure gets the container killed (`FailedPostStartHook`); `preStop`
//! runs before the stop signal, within the grace period, which shrinks by the time it took.
//! Handlers: `exec` (CRI ExecSync, no timeout of its own), `httpGet` (only a request that gets no
//! answer fails, as upstream; the body read is bounded), `sleep`.
//!
//! What bounds them is the caller's, as upstream: a `preStop` runs within the grace period
//! (`manager::kill_container`), a `postStart` until the pod's termination cancels the sync that
//! runs it (`manager::start_container`). Either way the hook's future is dropped, which cancels
//! the runtime's `ExecSync` (containerd then kills the command) or the HTTP request.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Pod};

use crate::{
    cri::RuntimeService,
    pod::format_pod,
    prober::{
        http::{self, HttpError},
        probe::{ProbeError, Target, http_request},
    },
};

/// Why a hook failed; its text is the message upstream puts in the
/// `FailedPostStartHook`/`FailedPreStopHook` event. `pod` is `name_namespace(uid)`.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error(
        "Exec lifecycle hook ({command:?}) for Container {container:?} in Pod {pod:?} failed - \
         error: command {command:?} exited with {exit_code}, message: {output:?}"
    )]
    ExecExited {
        command: Vec<String>,
        container: String,
        pod: String,
        exit_code: i32,
        output: String,
    },
    #[error(
        "Exec lifecycle hook ({command:?}) for Container {container:?} in Pod {pod:?} failed - \
         error: {source}, message: \"\""
    )]
    Exec {
        command: Vec<String>,
        container: String,
        pod: String,
        #[source]
        source: crate::cri::Error,
    },
    #[error(
        "HTTP lifecycle hook ({path}) for Container {container:?} in Pod {pod:?} failed - error: \
         {source}"
    )]
    HttpRequest {
        path: String,
        container: String,
        pod: String,
        #[source]
        source: ProbeError,
    },
    #[error(
        "HTTP lifecycle hook ({path}) for Container {container:?} in Pod {pod:?} failed - error: \
         {source}"
    )]
    Http {
        path: String,
        container: String,
        pod: String,
        #[source]
        source: HttpError,
    },
    #[error(
        "Lifecycle hook for Container {container:?} in Pod {pod:?} failed - error: invalid \
         handler: none of exec, httpGet or sleep is set"
    )]
    NoHandler { container: String, pod: String },
}

/// Runs `handler` for the container instance `container_id`.
pub async fn run(
    runtime: &dyn RuntimeService,
    handler: &LifecycleHandler,
    pod: &Pod,
    container: &Container,
    container_id: &str,
    pod_ip: Option<&str>,
) -> Result<(), HookError> {
    let pod_name = format_pod(pod);
    if let Some(exec) = &handler.exec {
        let command = exec.command.clone().unwrap_or_default();
        return match runtime
            .exec_sync(container_id, command.clone(), Duration::ZERO)
            .await
        {
            Ok(response) if response.exit_code == 0 => Ok(()),
            Ok(response) => {
                let mut output = String::from_utf8_lossy(&response.stdout).into_owned();
                output.push_str(&String::from_utf8_lossy(&response.stderr));
                Err(HookError::ExecExited {
                    command,
                    container: container.name.clone(),
                    pod: pod_name,
                    exit_code: response.exit_code,
                    output,
                })
            }
            Err(source) => Err(HookError::Exec {
                command,
                container: container.name.clone(),
                pod: pod_name,
                source,
            }),
        };
    }
    if let Some(get) = &handler.http_get {
        let target = Target {
            runtime,
            container,
            container_id,
            pod_ip,
            name: &container.name,
        };
        let path = get.path.clone().unwrap_or_default();
        let request = match http_request(get, &target) {
            Ok(request) => request,
            Err(source) => {
                return Err(HookError::HttpRequest {
                    path,
                    container: container.name.clone(),
                    pod: pod_name,
                    source,
                });
            }
        };
        // No timeout of its own: the caller bounds a preStop by the grace period.
        return http::get_unbounded(&request)
            .await
            .map(drop)
            .map_err(|source| HookError::Http {
                path,
                container: container.name.clone(),
                pod: pod_name,
                source,
            });
    }
    if let Some(sleep) = &handler.sleep {
        tokio::time::sleep(Duration::from_secs(
            u64::try_from(sleep.seconds).unwrap_or(0),
        ))
        .await;
        return Ok(());
    }
    Err(HookError::NoHandler {
        container: container.name.clone(),
        pod: pod_name,
    })
}

#[cfg(test)]
mod tests {
    use k8s_cri::v1 as cri;
    use k8s_openapi::api::core::v1::{ExecAction, SleepAction};

    use super::*;
    use crate::cri::fake::FakeRuntime;

    fn pod() -> Pod {
        crate::testing::pod().named("prod", "web", "u1").build()
    }

    fn app() -> Container {
        Container {
            name: "app".into(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn exec_hooks_fail_on_a_non_zero_exit_with_the_output() {
        let fake = FakeRuntime::new();
        let (_, ids) = fake
            .start_pod("u1", "web", "prod", &["app"])
            .await
            .unwrap_or_default();
        let id = ids.first().cloned().unwrap_or_default();
        let handler = LifecycleHandler {
            exec: Some(ExecAction {
                command: Some(vec!["flush".into()]),
            }),
            ..Default::default()
        };
        assert_eq!(
            run(&fake, &handler, &pod(), &app(), &id, None)
                .await
                .map_err(|e| e.to_string()),
            Ok(())
        );
        fake.set_exec_result(
            &id,
            cri::ExecSyncResponse {
                stdout: b"disk full".to_vec(),
                stderr: Vec::new(),
                exit_code: 2,
            },
        );
        let err = run(&fake, &handler, &pod(), &app(), &id, None)
            .await
            .map_err(|e| e.to_string());
        assert_eq!(
            err,
            Err(
                "Exec lifecycle hook ([\"flush\"]) for Container \"app\" in Pod \
                 \"web_prod(u1)\" failed - error: command [\"flush\"] exited with 2, message: \
                 \"disk full\""
                    .into()
            )
        );
    }

    #[tokio::test(start_paused = true)]
    async fn sleep_hooks_sleep_and_empty_ones_are_refused() {
        let fake = FakeRuntime::new();
        let sleep = LifecycleHandler {
            sleep: Some(SleepAction { seconds: 5 }),
            ..Default::default()
        };
        // Counted in ticks of a 1 s interval running beside it (paused time): the hook ends only
        // after its 5 s have gone by.
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
        let (p, c) = (pod(), app());
        let hook = run(&fake, &sleep, &p, &c, "c1", None);
        tokio::pin!(hook);
        let mut ticks = 0;
        let done = loop {
            tokio::select! {
                done = &mut hook => break done,
                _ = tick.tick() => ticks += 1,
            }
        };
        assert!(done.is_ok());
        assert!(ticks >= 5, "the hook ended after {ticks} ticks");
        let empty = LifecycleHandler::default();
        let err = run(&fake, &empty, &pod(), &app(), "c1", None).await;
        assert!(err.is_err_and(|e| e.to_string().contains("invalid handler")));
    }
}
