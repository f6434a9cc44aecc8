//! Settings of what keeps the node's disk in check: container log rotation
//! (`containerLogMaxSize`, `containerLogMaxFiles`, `containerLogMonitorInterval`), where pod logs
//! live (`podLogsDir`), the container GC (the kubelet's flags `--minimum-container-ttl-duration`,
//! `--maximum-dead-containers-per-container`, `--maximum-dead-containers`, also accepted in the
//! file under swiftlet's own names) and the image GC (`imageGCHighThresholdPercent`,
//! `imageGCLowThresholdPercent`, `imageMinimumGCAge`).
//!
//! Not here: what is done with them (`logs::rotate`, `kuberuntime::gc`, `kuberuntime::image_gc`).
//! Upstream: `pkg/kubelet/apis/config/validation/validation.go` and `NewContainerLogManager`.

use std::path::PathBuf;

use super::{
    defaults,
    error::{ConfigError, Origin, invalid},
    input::Given,
    settings::Settings,
};
use crate::{
    kuberuntime::{gc::ContainerGcPolicy, image_gc::ImageGcPolicy},
    logs::LogRotatePolicy,
};

/// Container logs: rotation and their directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogsConfig {
    pub rotation: LogRotatePolicy,
    /// `<podLogsDir>/<namespace>_<name>_<uid>/` holds a pod's container logs.
    pub pod_logs_dir: PathBuf,
}

impl Default for LogsConfig {
    fn default() -> Self {
        LogsConfig {
            rotation: LogRotatePolicy::default(),
            pod_logs_dir: PathBuf::from(defaults::POD_LOGS_DIR),
        }
    }
}

/// Garbage collection of dead containers and unused images.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcConfig {
    pub containers: ContainerGcPolicy,
    pub images: ImageGcPolicy,
}

fn percent(value: i64, origin: &Origin, field: &'static str) -> Result<u8, ConfigError> {
    u8::try_from(value)
        .ok()
        .filter(|p| *p <= 100)
        .ok_or_else(|| {
            invalid(
                origin,
                field,
                "percentage",
                value,
                "must be between 0 and 100, inclusive",
            )
        })
}

/// Log rotation and the logs' directory, as the table resolved them.
pub(super) fn logs(settings: &Settings) -> LogsConfig {
    LogsConfig {
        rotation: LogRotatePolicy {
            max_size: settings.container_log_max_size,
            max_files: settings.container_log_max_files,
            monitor_interval: settings.container_log_monitor_interval,
        },
        pod_logs_dir: settings.pod_logs_dir.clone(),
    }
}

/// Garbage collection; the image GC's thresholds must leave room between them.
pub(super) fn gc(settings: &Settings) -> Result<GcConfig, ConfigError> {
    let containers = ContainerGcPolicy {
        min_age: settings.minimum_container_ttl_duration,
        // Negative means no limit, as upstream.
        max_per_pod_container: settings.maximum_dead_containers_per_container,
        max_containers: settings.maximum_dead_containers,
    };

    let image_defaults = ImageGcPolicy::default();
    let or_default = |given: &Option<Given<i64>>, default: u8| {
        given.clone().unwrap_or(Given {
            value: i64::from(default),
            origin: Origin::Default,
        })
    };
    let high = or_default(
        &settings.image_gc_high_threshold_percent,
        image_defaults.high_threshold_percent,
    );
    let high = percent(high.value, &high.origin, "imageGCHighThresholdPercent")?;
    let low = or_default(
        &settings.image_gc_low_threshold_percent,
        image_defaults.low_threshold_percent,
    );
    let low_origin = low.origin;
    let low = percent(low.value, &low_origin, "imageGCLowThresholdPercent")?;
    if low >= high {
        return Err(invalid(
            &low_origin,
            "imageGCLowThresholdPercent",
            "percentage",
            low,
            format!("must be less than imageGCHighThresholdPercent ({high})"),
        ));
    }
    let images = ImageGcPolicy {
        high_threshold_percent: high,
        low_threshold_percent: low,
        min_age: settings.image_minimum_gc_age,
        sandbox_image: match &settings.pod_infra_container_image {
            Some(image) if image.is_empty() => None,
            Some(image) => Some(image.clone()),
            None => image_defaults.sandbox_image,
        },
    };
    Ok(GcConfig { containers, images })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::Parser as _;

    use super::*;
    use crate::config::{Args, Command, Config};

    /// Loads `yaml` as the config file with `flags`.
    fn load(yaml: &str, flags: &[&str]) -> Result<Config, String> {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("swiftlet.yaml");
        std::fs::write(&path, yaml).expect("write config");
        let path_arg = path.display().to_string();
        let argv = ["swiftlet", "run", "--config", path_arg.as_str()]
            .into_iter()
            .chain(flags.iter().copied());
        let Command::Run(args) = Args::try_parse_from(argv).expect("flags parse").command else {
            panic!("not run");
        };
        Config::load_with(&args, &|| Ok("node".to_owned()))
            .map_err(|e| e.to_string().replace(&path_arg, "FILE"))
    }

    #[test]
    fn defaults_are_upstreams() {
        let config = load("", &[]).expect("loads");
        assert_eq!(config.logs.rotation.max_size, 10 * 1024 * 1024);
        assert_eq!(config.logs.rotation.max_files, 5);
        assert_eq!(
            config.logs.rotation.monitor_interval,
            Duration::from_secs(10)
        );
        assert_eq!(config.logs.pod_logs_dir, PathBuf::from("/var/log/pods"));
        assert_eq!(config.gc.containers.min_age, Duration::ZERO);
        assert_eq!(config.gc.containers.max_per_pod_container, 1);
        assert_eq!(config.gc.containers.max_containers, -1);
        assert_eq!(config.gc.images.high_threshold_percent, 85);
        assert_eq!(config.gc.images.low_threshold_percent, 80);
        assert_eq!(config.gc.images.min_age, Duration::from_secs(120));
        assert_eq!(
            config.gc.images.sandbox_image.as_deref(),
            Some("registry.k8s.io/pause:3.10")
        );
    }

    #[test]
    fn file_then_flags() {
        let yaml = "containerLogMaxSize: 1Ki\ncontainerLogMaxFiles: 3\n\
                    containerLogMonitorInterval: 5s\npodLogsDir: /tmp/pods\n\
                    imageGCHighThresholdPercent: 90\nimageGCLowThresholdPercent: 50\n\
                    imageMinimumGCAge: 0s\nminimumContainerTTLDuration: 1m\n\
                    maximumDeadContainersPerContainer: 2\nmaximumDeadContainers: 10\n";
        let config = load(yaml, &[]).expect("loads");
        assert_eq!(config.logs.rotation.max_size, 1024);
        assert_eq!(config.logs.rotation.max_files, 3);
        assert_eq!(
            config.logs.rotation.monitor_interval,
            Duration::from_secs(5)
        );
        assert_eq!(config.logs.pod_logs_dir, PathBuf::from("/tmp/pods"));
        assert_eq!(config.gc.images.high_threshold_percent, 90);
        assert_eq!(config.gc.images.low_threshold_percent, 50);
        // In the file, upstream's `0s` is the default (2m); `--minimum-image-ttl-duration=0s` is zero.
        assert_eq!(config.gc.images.min_age, Duration::from_secs(120));
        assert_eq!(config.gc.containers.min_age, Duration::from_secs(60));
        assert_eq!(config.gc.containers.max_per_pod_container, 2);
        assert_eq!(config.gc.containers.max_containers, 10);
        let flags = [
            "--container-log-max-size=-1",
            "--container-log-max-files=2",
            "--image-gc-high-threshold=1",
            "--image-gc-low-threshold=0",
            "--minimum-image-ttl-duration=1s",
            "--minimum-container-ttl-duration=0",
            "--maximum-dead-containers-per-container=-1",
            "--maximum-dead-containers=3",
            "--pod-infra-container-image=localhost/pause:1",
            "--pod-logs-dir=/tmp/other",
        ];
        let config = load(yaml, &flags).expect("loads");
        assert_eq!(config.logs.rotation.max_size, -1);
        assert_eq!(config.logs.rotation.max_files, 2);
        assert_eq!(config.gc.images.high_threshold_percent, 1);
        assert_eq!(config.gc.images.low_threshold_percent, 0);
        assert_eq!(config.gc.images.min_age, Duration::from_secs(1));
        assert_eq!(config.gc.containers.min_age, Duration::ZERO);
        assert_eq!(config.gc.containers.max_per_pod_container, -1);
        assert_eq!(config.gc.containers.max_containers, 3);
        assert_eq!(
            config.gc.images.sandbox_image.as_deref(),
            Some("localhost/pause:1")
        );
    }

    #[test]
    fn errors_name_the_field_and_value() {
        for (yaml, flags, want) in [
            (
                "containerLogMaxFiles: 1\n",
                &[][..],
                "config file FILE: field `containerLogMaxFiles`: invalid value \"1\": must be greater than 1",
            ),
            (
                "",
                &["--container-log-max-files", "0"][..],
                "flag --container-log-max-files: field `containerLogMaxFiles`: invalid value \"0\"",
            ),
            (
                "containerLogMaxSize: ten\n",
                &[][..],
                "config file FILE: field `containerLogMaxSize`: invalid quantity \"ten\"",
            ),
            (
                "containerLogMonitorInterval: 1s\n",
                &[][..],
                "config file FILE: field `containerLogMonitorInterval`: invalid duration \"1s\": must be at least 3s",
            ),
            (
                "podLogsDir: logs\n",
                &[][..],
                "config file FILE: field `podLogsDir`: invalid path \"logs\": must be an absolute path",
            ),
            (
                "imageGCHighThresholdPercent: 101\n",
                &[][..],
                "config file FILE: field `imageGCHighThresholdPercent`: invalid percentage \"101\": must be between 0 and 100",
            ),
            (
                "",
                &["--image-gc-low-threshold", "-1"][..],
                "flag --image-gc-low-threshold: field `imageGCLowThresholdPercent`: invalid percentage \"-1\"",
            ),
            (
                "imageGCHighThresholdPercent: 50\nimageGCLowThresholdPercent: 50\n",
                &[][..],
                "config file FILE: field `imageGCLowThresholdPercent`: invalid percentage \"50\": must be less than imageGCHighThresholdPercent (50)",
            ),
            (
                "imageMinimumGCAge: soon\n",
                &[][..],
                "config file FILE: field `imageMinimumGCAge`: invalid duration \"soon\"",
            ),
        ] {
            let got = load(yaml, flags).expect_err("rejected");
            assert!(
                got.starts_with(want),
                "{got}\nwanted it to start with\n{want}"
            );
        }
    }
}
