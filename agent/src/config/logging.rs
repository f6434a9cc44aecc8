//! The file's `logging` block (upstream `LoggingConfiguration` of
//! `k8s.io/component-base/logs/api/v1`) and what it resolves to: the line format and a verbosity,
//! which `telemetry.rs` turns into a level. The global flags `--log-format` and `--log-level`, when
//! given, win over the file (upstream: command-line flags over the file), and `RUST_LOG` over both.
//!
//! Verbosity follows the Kubernetes logging conventions (sig-instrumentation `logging.md`: V(0)–V(3)
//! operator-relevant information, V(4) debug, V(5) and more trace): 0–3 → `info`, 4 → `debug`,
//! 5 and more → `trace`.
//!
//! `flushFrequency` is accepted (a duration or an integer of nanoseconds, as upstream) and needs no
//! warning: swiftlet writes each line to stderr unbuffered, so there is nothing to flush.
//! `vmodule` (klog file patterns, which name Go files), `options.*.splitStream` and a non-zero
//! `options.*.infoBufferSize` have no effect and are warned about.
//!
//! Not here: installing the subscriber (`telemetry.rs`). Upstream: `logs/api/v1/types.go` and
//! `options.go` (`ValidateAndApply`).

use serde::Deserialize;

use super::{
    cli::LogFormat,
    duration::GoDuration,
    error::{ConfigError, Origin, invalid},
    no_effect::{NoEffect, Quantity},
};

/// `logging` as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FileLogging {
    pub format: Option<String>,
    pub flush_frequency: Option<FlushFrequency>,
    pub verbosity: Option<u32>,
    pub vmodule: Option<Vec<VModuleItem>>,
    pub options: Option<FormatOptions>,
}

/// Upstream `TimeOrMetaDuration`: a Go duration string or an integer of nanoseconds.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum FlushFrequency {
    Nanos(u64),
    Text(String),
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct VModuleItem {
    pub file_pattern: String,
    pub verbosity: u32,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FormatOptions {
    pub text: Option<OutputRouting>,
    pub json: Option<OutputRouting>,
}

/// Upstream `OutputRoutingOptions` (inlined in `TextOptions` and `JSONOptions`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct OutputRouting {
    pub split_stream: Option<bool>,
    pub info_buffer_size: Option<Quantity>,
}

/// The file's logging settings swiftlet acts on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoggingConfig {
    /// `logging.format`, if written.
    pub format: Option<LogFormat>,
    /// `logging.verbosity`, if written.
    pub verbosity: Option<u32>,
}

impl LoggingConfig {
    /// The `tracing` filter the verbosity stands for, if one was written.
    pub fn level(&self) -> Option<&'static str> {
        self.verbosity.map(verbosity_level)
    }
}

/// klog's `-v` as a `tracing` level (see the module's header).
pub fn verbosity_level(verbosity: u32) -> &'static str {
    match verbosity {
        0..=3 => "info",
        4 => "debug",
        _ => "trace",
    }
}

/// Checks `logging` and lists its parts without effect.
pub(super) fn resolve(
    written: Option<&FileLogging>,
    origin: &Origin,
) -> Result<(LoggingConfig, Vec<NoEffect>), ConfigError> {
    let Some(written) = written else {
        return Ok((LoggingConfig::default(), Vec::new()));
    };
    let format = match written.format.as_deref() {
        None | Some("") => None,
        Some("text") => Some(LogFormat::Text),
        Some("json") => Some(LogFormat::Json),
        Some(other) => {
            return Err(invalid(
                origin,
                "logging.format",
                "value",
                other,
                "expected text or json",
            ));
        }
    };
    if let Some(FlushFrequency::Text(text)) = &written.flush_frequency {
        text.parse::<GoDuration>().map_err(|e| {
            invalid(
                origin,
                "logging.flushFrequency",
                "duration",
                text,
                e.reason.to_string(),
            )
        })?;
    }
    let mut no_effect = Vec::new();
    if written.vmodule.as_ref().is_some_and(|v| !v.is_empty()) {
        no_effect.push(NoEffect {
            field: "logging.vmodule".to_owned(),
            why: "klog's per-file verbosity names Go files; use RUST_LOG's per-module filters",
        });
    }
    let options = written.options.clone().unwrap_or_default();
    for (name, routing) in [("text", &options.text), ("json", &options.json)] {
        let Some(routing) = routing else { continue };
        if routing.split_stream == Some(true) {
            no_effect.push(NoEffect {
                field: format!("logging.options.{name}.splitStream"),
                why: "every line goes to stderr",
            });
        }
        if routing.info_buffer_size.as_ref().is_some_and(nonzero) {
            no_effect.push(NoEffect {
                field: format!("logging.options.{name}.infoBufferSize"),
                why: "lines are written unbuffered",
            });
        }
    }
    Ok((
        LoggingConfig {
            format,
            verbosity: written.verbosity,
        },
        no_effect,
    ))
}

fn nonzero(q: &Quantity) -> bool {
    match q {
        Quantity::Text(s) => !matches!(s.trim(), "" | "0"),
        Quantity::Integer(n) => *n != 0,
        Quantity::Decimal(f) => *f != 0.0,
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn resolve_yaml(yaml: &str) -> Result<(LoggingConfig, Vec<NoEffect>), ConfigError> {
        let written: FileLogging = serde_yaml_ng::from_str(yaml).expect("yaml");
        resolve(Some(&written), &Origin::File(PathBuf::from("c.yaml")))
    }

    #[test]
    fn verbosity_maps_to_levels() {
        let cases = [
            (0, "info"),
            (2, "info"),
            (3, "info"),
            (4, "debug"),
            (5, "trace"),
            (10, "trace"),
        ];
        for (v, level) in cases {
            assert_eq!(verbosity_level(v), level, "{v}");
        }
    }

    #[test]
    fn kubeadm_and_seed_blocks_resolve_quietly() {
        let (kubeadm, quiet) = resolve_yaml(
            "flushFrequency: 0\noptions:\n  json:\n    infoBufferSize: \"0\"\n  text:\n    infoBufferSize: \"0\"\nverbosity: 0\n",
        )
        .expect("kubeadm's");
        assert_eq!(kubeadm.format, None);
        assert_eq!(kubeadm.level(), Some("info"));
        assert!(quiet.is_empty(), "{quiet:?}");
        let (seed, quiet) = resolve_yaml(
            "format: json\nflushFrequency: 5s\nverbosity: 4\noptions:\n  text:\n    splitStream: false\n",
        )
        .expect("seed's");
        assert_eq!(seed.format, Some(LogFormat::Json));
        assert_eq!(seed.level(), Some("debug"));
        assert!(quiet.is_empty(), "{quiet:?}");
    }

    #[test]
    fn parts_without_effect_are_listed() {
        let (_, no_effect) = resolve_yaml(
            "vmodule:\n- filePattern: pod*\n  verbosity: 5\noptions:\n  json:\n    splitStream: true\n    infoBufferSize: 1Mi\n",
        )
        .expect("parses");
        let fields: Vec<&str> = no_effect.iter().map(|n| n.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "logging.vmodule",
                "logging.options.json.splitStream",
                "logging.options.json.infoBufferSize",
            ]
        );
    }

    #[test]
    fn bad_values_name_the_field() {
        let format = resolve_yaml("format: xml\n").err().map(|e| e.to_string());
        assert_eq!(
            format.as_deref(),
            Some(
                "config file c.yaml: field `logging.format`: invalid value \"xml\": expected text or json"
            )
        );
        let flush = resolve_yaml("flushFrequency: soon\n")
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            flush.as_deref(),
            Some(
                "config file c.yaml: field `logging.flushFrequency`: invalid duration \"soon\": expected e.g. 1m30s"
            )
        );
    }
}
