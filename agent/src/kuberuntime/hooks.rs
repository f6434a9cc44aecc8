//! Lifecycle hooks (upstream `pkg/kubelet/lifecycle/handlers.go`): `postStart` runs right after
//! a container starts and a failure gets the container killed (`FailedPostStartHook`); `preStop`
//! runs before the stop signal, within the grace period, which shrinks by the time it took.
//! Handlers: `exec` (CRI ExecSync, no timeout of its own), `httpGet` (only a request that gets no
//! answer fails, as upstream), `sleep`.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Pod};

use crate::{
    cri::RuntimeService,
    prober::{
        http,
        probe::{Target, http_request},
    },
};

/// Runs `handler` for the container instance `container_id`; the error is the message upstream
/// puts in the `FailedPostStartHook`/`FailedPreStopHook` event.
pub async fn run(
    runtime: &dyn RuntimeService,
    handler: &LifecycleHandler,
    pod: &Pod,
    container: &Container,
    container_id: &str,
    pod_ip: Option<&str>,
) -> Result<(), String> {
    let pod_name = format!(
        "{}_{}({})",
        pod.metadata.name.as_deref().unwrap_or_default(),
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.uid.as_deref().unwrap_or_default()
    );
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
                Err(format!(
                    "Exec lifecycle hook ({command:?}) for Container {:?} in Pod {pod_name:?} \
                     failed - error: command {command:?} exited with {}, message: {output:?}",
                    container.name, response.exit_code
                ))
            }
            Err(e) => Err(format!(
                "Exec lifecycle hook ({command:?}) for Container {:?} in Pod {pod_name:?} failed \
                 - error: {e}, message: \"\"",
                container.name
            )),
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
        let fail = |e: String| {
            format!(
                "HTTP lifecycle hook ({path}) for Container {:?} in Pod {pod_name:?} failed - \
                 error: {e}",
                container.name
            )
        };
        let request = http_request(get, &target).map_err(|e| fail(e.to_string()))?;
        // No timeout of its own: the caller bounds a preStop by the grace period.
        return http::get_unbounded(&request)
            .await
            .map(drop)
            .map_err(|e| fail(e.to_string()));
    }
    if let Some(sleep) = &handler.sleep {
        tokio::time::sleep(Duration::from_secs(
            u64::try_from(sleep.seconds).unwrap_or(0),
        ))
        .await;
        return Ok(());
    }
    Err(format!(
        "Lifecycle hook for Container {:?} in Pod {pod_name:?} failed - error: invalid handler: \
         none of exec, httpGet or sleep is set",
        container.name
    ))
}
