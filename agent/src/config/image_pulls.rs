//! The image pull limits: `serializeImagePulls`, `maxParallelImagePulls`, `registryPullQPS` and
//! `registryBurst`, checked together and defaulted as upstream does
//! (`SetDefaults_KubeletConfiguration`: serial unless `maxParallelImagePulls` is 2 or more;
//! `validation.go`: no negative QPS or burst, `maxParallelImagePulls` at least 1 and above 1 only
//! without serial pulls).
//!
//! One check beyond upstream's: a burst of 0 with a QPS above 0 (only a flag can give it; the
//! file's 0 is upstream's default 10) is refused, because upstream's token bucket then refuses
//! every pull with "pull QPS exceeded.".
//!
//! Not here: the limits at work (`kuberuntime::image_pulls`).

use std::num::NonZeroU32;

use super::{
    error::{ConfigError, Origin, invalid},
    input::Given,
    settings::Settings,
};
use crate::kuberuntime::image_pulls::PullLimits;

fn given_or(given: &Option<Given<i64>>, default: u32) -> Given<i64> {
    given.clone().unwrap_or(Given {
        value: i64::from(default),
        origin: Origin::Default,
    })
}

fn non_negative(given: &Given<i64>, field: &'static str) -> Result<u32, ConfigError> {
    u32::try_from(given.value)
        .ok()
        .filter(|v| i32::try_from(*v).is_ok())
        .ok_or_else(|| {
            invalid(
                &given.origin,
                field,
                "value",
                given.value,
                "must not be a negative number",
            )
        })
}

/// The pull limits, as the table resolved their settings.
pub(super) fn resolve(settings: &Settings) -> Result<PullLimits, ConfigError> {
    let defaults = PullLimits::default();
    let max_parallel = match &settings.max_parallel_image_pulls {
        None => None,
        Some(given) => Some(
            u32::try_from(given.value)
                .ok()
                .and_then(NonZeroU32::new)
                .filter(|n| i32::try_from(n.get()).is_ok())
                .ok_or_else(|| {
                    invalid(
                        &given.origin,
                        "maxParallelImagePulls",
                        "value",
                        given.value,
                        "must be a positive number",
                    )
                })?,
        ),
    };
    let serialize = match &settings.serialize_image_pulls {
        Some(given) => given.value,
        None => max_parallel.is_none_or(|n| n.get() < 2),
    };
    if let Some(n) = max_parallel
        && serialize
        && n.get() > 1
    {
        let origin = settings
            .max_parallel_image_pulls
            .as_ref()
            .map_or(Origin::Default, |g| g.origin.clone());
        return Err(invalid(
            &origin,
            "maxParallelImagePulls",
            "value",
            n,
            "cannot be larger than 1 unless serializeImagePulls (--serialize-image-pulls) is \
             set to false",
        ));
    }
    let qps_given = given_or(&settings.registry_pull_qps, defaults.qps);
    let qps = non_negative(&qps_given, "registryPullQPS")?;
    let burst_given = given_or(&settings.registry_burst, defaults.burst);
    let burst = non_negative(&burst_given, "registryBurst")?;
    if qps > 0 && burst == 0 {
        return Err(invalid(
            &burst_given.origin,
            "registryBurst",
            "value",
            burst,
            format!(
                "must be at least 1 while registryPullQPS is {qps}: with 0 every image pull \
                 would fail"
            ),
        ));
    }
    Ok(PullLimits {
        serialize,
        max_parallel,
        qps,
        burst,
    })
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;
    use crate::config::{Args, Command, Config};

    /// The pull limits of `yaml` as the config file with `flags`.
    fn load(flags: &[&str], yaml: &str) -> Result<PullLimits, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let path = dir.path().join("swiftlet.yaml");
        std::fs::write(&path, yaml).map_err(|e| e.to_string())?;
        let path_arg = path.display().to_string();
        let argv = ["swiftlet", "run", "--config", path_arg.as_str()]
            .into_iter()
            .chain(flags.iter().copied());
        let Command::Run(args) = Args::try_parse_from(argv)
            .map_err(|e| e.to_string())?
            .command
        else {
            return Err("not run".to_owned());
        };
        Config::load_with(&args, &|| Ok("node".to_owned()))
            .map(|c| c.image_pulls)
            .map_err(|e| e.to_string().replace(&path_arg, "FILE"))
    }

    fn limits(serialize: bool, max_parallel: Option<u32>, qps: u32, burst: u32) -> PullLimits {
        PullLimits {
            serialize,
            max_parallel: max_parallel.and_then(NonZeroU32::new),
            qps,
            burst,
        }
    }

    #[test]
    fn defaults_and_given_values_resolve_as_upstreams() {
        let cases: [(&[&str], &str, PullLimits); 8] = [
            (&[], "{}", limits(true, None, 5, 10)),
            // The file's zero burst is upstream's default; its zero QPS is no limit.
            (
                &[],
                "registryBurst: 0\nregistryPullQPS: 0",
                limits(true, None, 0, 10),
            ),
            (
                &[],
                "maxParallelImagePulls: 1",
                limits(true, Some(1), 5, 10),
            ),
            // Parallel pulls asked for: serial is off unless written.
            (
                &[],
                "maxParallelImagePulls: 3",
                limits(false, Some(3), 5, 10),
            ),
            (
                &[],
                "serializeImagePulls: false",
                limits(false, None, 5, 10),
            ),
            (
                &["--serialize-image-pulls=false"],
                "serializeImagePulls: true\nmaxParallelImagePulls: 2",
                limits(false, Some(2), 5, 10),
            ),
            (
                &["--registry-qps", "1", "--registry-burst", "1"],
                "{}",
                limits(true, None, 1, 1),
            ),
            (
                &["--registry-qps", "0", "--registry-burst", "0"],
                "{}",
                limits(true, None, 0, 0),
            ),
        ];
        for (flags, yaml, want) in cases {
            assert_eq!(load(flags, yaml), Ok(want), "{flags:?} {yaml}");
        }
    }

    #[test]
    fn bad_values_are_refused_naming_the_field() {
        let cases: [(&[&str], &str, &str); 5] = [
            (
                &[],
                "maxParallelImagePulls: 0",
                "config file FILE: field `maxParallelImagePulls`: invalid value \"0\": must be a \
                 positive number",
            ),
            (
                &[],
                "serializeImagePulls: true\nmaxParallelImagePulls: 3",
                "config file FILE: field `maxParallelImagePulls`: invalid value \"3\": cannot be \
                 larger than 1 unless serializeImagePulls (--serialize-image-pulls) is set to \
                 false",
            ),
            (
                &[],
                "registryPullQPS: -1",
                "config file FILE: field `registryPullQPS`: invalid value \"-1\": must not be a \
                 negative number",
            ),
            (
                &["--registry-burst", "-2"],
                "{}",
                "flag --registry-burst: field `registryBurst`: invalid value \"-2\": must not be a negative number",
            ),
            (
                &["--registry-burst", "0"],
                "{}",
                "flag --registry-burst: field `registryBurst`: invalid value \"0\": must be at least 1 while \
                 registryPullQPS is 5: with 0 every image pull would fail",
            ),
        ];
        for (flags, yaml, want) in cases {
            assert_eq!(load(flags, yaml), Err(want.to_owned()), "{flags:?} {yaml}");
        }
    }
}
