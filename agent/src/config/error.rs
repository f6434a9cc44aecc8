//! Configuration errors: each names where the value came from (the file or a flag), the field and
//! the bad value, so an operator can fix it from the message alone.
//!
//! Not here: the checks themselves (`input.rs`, `rules.rs`, the sections). Upstream: the kubelet reports
//! `invalid configuration: ...` from `validation.ValidateKubeletConfiguration`.

use std::{fmt, io, path::PathBuf};

/// Where a value came from, for error messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    File(PathBuf),
    Flag(&'static str),
    /// The node's hostname, read from this file.
    Hostname(PathBuf),
    Default,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::File(path) => write!(f, "config file {}", path.display()),
            Origin::Flag(flag) => write!(f, "flag {flag}"),
            Origin::Hostname(path) => write!(f, "hostname ({})", path.display()),
            Origin::Default => f.write_str("built-in default"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {}: cannot read it: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },
    /// Syntax errors, unknown fields and wrong types, as serde reports them (field and position).
    #[error("config file {}: {source}", path.display())]
    Parse {
        path: PathBuf,
        source: serde_yaml_ng::Error,
    },
    #[error("{origin}: field `{field}`: invalid {kind} {value:?}: {reason}")]
    Invalid {
        origin: Origin,
        field: &'static str,
        /// What the value should have been: "duration", "address", "value", ...
        kind: &'static str,
        value: String,
        reason: String,
    },
    /// A `featureGates` entry that is not a bool.
    #[error(
        "{origin}: field `featureGates.{gate}`: invalid value {value:?}: expected true or false"
    )]
    FeatureGate {
        origin: Origin,
        gate: String,
        value: String,
    },
    #[error("cannot read the node's hostname from {}: {source}; set --node-name", path.display())]
    Hostname { path: PathBuf, source: io::Error },
}

pub(super) fn invalid(
    origin: &Origin,
    field: &'static str,
    kind: &'static str,
    value: impl fmt::Display,
    reason: impl Into<String>,
) -> ConfigError {
    ConfigError::Invalid {
        origin: origin.clone(),
        field,
        kind,
        value: value.to_string(),
        reason: reason.into(),
    }
}
