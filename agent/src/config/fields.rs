//! Resolution of the fields that need more than "flag, else file, else default": positive
//! durations, ports and addresses, the node name (upstream `nodeutil.GetHostname`), the CRI
//! endpoint, the map fields (`evictionHard`, `kubeReserved`, ...) with their flag syntax. Each
//! returns the value or a [`ConfigError`] naming field, origin and value.
//!
//! Not here: the order of resolution and the assembled `Config` (`load.rs`).

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    time::Duration,
};

use super::{
    DEFAULT_HTTP_ADDRESS, RunArgs,
    duration::GoDuration,
    error::{ConfigError, Origin, invalid},
    file::{self, FileConfig},
    load::defaults,
};

/// Where the kernel keeps the node's hostname (what `os.Hostname` returns upstream).
const HOSTNAME_FILE: &str = "/proc/sys/kernel/hostname";

/// Resolves one field at a time against the file's origin.
pub(super) struct Resolver<'a> {
    pub(super) file: &'a Origin,
}

/// A map field (upstream `map[string]string`) as given: the flag's entries or the file's.
pub(super) struct MapField {
    pub(super) origin: Origin,
    pub(super) entries: Vec<MapEntry>,
}

pub(super) struct MapEntry {
    pub(super) key: String,
    /// The separator written in the flag (`<`, `>`, `=`); `None` from the file, where a
    /// threshold's operator is implied by its signal.
    pub(super) separator: Option<char>,
    pub(super) value: String,
    /// The entry as written, for messages: `memory.available<1Gi` or `memory.available: 1Gi`.
    pub(super) shown: String,
}

impl Resolver<'_> {
    pub(super) fn check_header(&self, file: &FileConfig) -> Result<(), ConfigError> {
        if let Some(kind) = &file.kind
            && kind != file::KIND
        {
            return Err(invalid(
                self.file,
                "kind",
                "value",
                kind,
                format!("expected {:?}", file::KIND),
            ));
        }
        if let Some(version) = &file.api_version
            && version != file::API_VERSION
        {
            return Err(invalid(
                self.file,
                "apiVersion",
                "value",
                version,
                format!("expected {:?}", file::API_VERSION),
            ));
        }
        Ok(())
    }

    /// A positive duration: the flag's if given, else the file's, else the default.
    pub(super) fn duration(
        &self,
        field: &'static str,
        (flag, flag_name): (Option<GoDuration>, &'static str),
        file: &Option<String>,
        default: Duration,
    ) -> Result<Duration, ConfigError> {
        // The value as the operator wrote it, for the message.
        let (value, shown, origin) = match (flag, file) {
            (Some(d), _) => (d, d.to_string(), Origin::Flag(flag_name)),
            (None, Some(text)) => {
                let d = text.parse::<GoDuration>().map_err(|e| {
                    invalid(self.file, field, "duration", text, e.reason.to_string())
                })?;
                (d, text.clone(), self.file.clone())
            }
            (None, None) => return Ok(default),
        };
        if value.0.is_zero() {
            return Err(invalid(
                &origin,
                field,
                "duration",
                shown,
                "must be greater than 0",
            ));
        }
        Ok(value.0)
    }

    /// A map field: the flag's entries if the flag was given, else the file's, else `None`. The
    /// flag's syntax is upstream's `MapStringString` (`key=value`) or, with `<` and `>` as
    /// `separators`, `LangleSeparatedMapStringString` (`memory.available<1Gi`): comma-separated
    /// entries, the flag repeatable, a later key replacing an earlier one, and the flag given
    /// with an empty value meaning an empty map. `syntax` says what an entry should look like.
    pub(super) fn map_field(
        &self,
        field: &'static str,
        kind: &'static str,
        (flag, flag_name): (&[String], &'static str),
        separators: &[char],
        syntax: &str,
        file: &Option<BTreeMap<String, String>>,
    ) -> Result<Option<MapField>, ConfigError> {
        if flag.is_empty() {
            return Ok(file.as_ref().map(|map| MapField {
                origin: self.file.clone(),
                entries: map
                    .iter()
                    .map(|(key, value)| MapEntry {
                        key: key.clone(),
                        separator: None,
                        value: value.clone(),
                        shown: format!("{key}: {value}"),
                    })
                    .collect(),
            }));
        }
        let origin = Origin::Flag(flag_name);
        let mut entries: Vec<MapEntry> = Vec::new();
        for piece in flag.iter().flat_map(|v| v.split(',')).map(str::trim) {
            if piece.is_empty() {
                continue;
            }
            let entry = piece
                .find(separators)
                .map(|at| (piece[..at].trim(), &piece[at..]))
                .filter(|(key, _)| !key.is_empty())
                .and_then(|(key, rest)| {
                    let separator = rest.chars().next()?;
                    Some(MapEntry {
                        key: key.to_owned(),
                        separator: Some(separator),
                        value: rest[separator.len_utf8()..].trim().to_owned(),
                        shown: piece.to_owned(),
                    })
                })
                .ok_or_else(|| invalid(&origin, field, kind, piece, syntax))?;
            entries.retain(|e| e.key != entry.key);
            entries.push(entry);
        }
        Ok(Some(MapField { origin, entries }))
    }

    /// A comma-separated list flag (upstream `StringSlice`, repeatable) if given, else the
    /// file's list, else `None`. Empty items are dropped.
    pub(super) fn list_field(
        &self,
        (flag, flag_name): (&[String], &'static str),
        file: &Option<Vec<String>>,
    ) -> Option<(Origin, Vec<String>)> {
        if flag.is_empty() {
            return file.as_ref().map(|list| {
                let items = list.iter().map(|s| s.trim().to_owned());
                (self.file.clone(), items.filter(|s| !s.is_empty()).collect())
            });
        }
        let items = flag.iter().flat_map(|v| v.split(',')).map(str::trim);
        Some((
            Origin::Flag(flag_name),
            items.filter(|s| !s.is_empty()).map(str::to_owned).collect(),
        ))
    }

    pub(super) fn max_pods(&self, origin: &Origin, n: i64) -> Result<u32, ConfigError> {
        u32::try_from(n)
            .ok()
            .filter(|n| (1..=i32::MAX as u32).contains(n))
            .ok_or_else(|| invalid(origin, "maxPods", "value", n, "must be at least 1"))
    }

    pub(super) fn port(&self, field: &'static str, n: i64) -> Result<u16, ConfigError> {
        u16::try_from(n).map_err(|_| {
            invalid(
                self.file,
                field,
                "port",
                n,
                "must be between 0 (off) and 65535",
            )
        })
    }

    pub(super) fn ip(&self, field: &'static str, s: &str) -> Result<IpAddr, ConfigError> {
        s.parse::<IpAddr>().map_err(|_| {
            invalid(
                self.file,
                field,
                "address",
                s,
                "expected an IP address, e.g. 127.0.0.1",
            )
        })
    }

    /// The read-only port's address: `readOnlyAddress` when given; else `address` when both it
    /// and the port were given (the kubelet binds the port to `address`); else loopback. The
    /// port is unauthenticated, so it leaves loopback only when the user names it.
    pub(super) fn read_only_address(
        &self,
        args: &RunArgs,
        file: &FileConfig,
    ) -> Result<Option<SocketAddr>, ConfigError> {
        let port_given = args.read_only_port.is_some() || file.read_only_port.is_some();
        let port = match (args.read_only_port, file.read_only_port) {
            (Some(p), _) => p,
            (None, Some(p)) => self.port("readOnlyPort", p)?,
            (None, None) => defaults::READ_ONLY_PORT,
        };
        let named = match (args.read_only_address, &file.read_only_address) {
            (Some(ip), _) => Some(ip),
            (None, Some(s)) => Some(self.ip("readOnlyAddress", s)?),
            (None, None) => None,
        };
        let address = match (args.address, &file.address) {
            (Some(ip), _) => Some(ip),
            (None, Some(s)) => Some(self.ip("address", s)?),
            (None, None) => None,
        };
        let ip = named
            .or(address.filter(|_| port_given))
            .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
        Ok((port != 0).then_some(SocketAddr::new(ip, port)))
    }

    /// The agent's own `oomScoreAdj` (upstream's range and default).
    pub(super) fn oom_score_adj(
        &self,
        args: &RunArgs,
        file: &FileConfig,
    ) -> Result<i32, ConfigError> {
        let (value, origin) = match (args.oom_score_adj, file.oom_score_adj) {
            (Some(v), _) => (i64::from(v), Origin::Flag("--oom-score-adj")),
            (None, Some(v)) => (v, self.file.clone()),
            (None, None) => return Ok(defaults::OOM_SCORE_ADJ),
        };
        i32::try_from(value)
            .ok()
            .filter(|v| (-1000..=1000).contains(v))
            .ok_or_else(|| {
                invalid(
                    &origin,
                    "oomScoreAdj",
                    "value",
                    value,
                    "must be between -1000 and 1000, inclusive",
                )
            })
    }

    pub(super) fn healthz_address(
        &self,
        args: &RunArgs,
        file: &FileConfig,
    ) -> Result<Option<SocketAddr>, ConfigError> {
        // `--http-address` has a clap default; only a different value overrides the file.
        let flag_given = args.http_address.to_string() != DEFAULT_HTTP_ADDRESS;
        if flag_given || (file.healthz_port.is_none() && file.healthz_bind_address.is_none()) {
            return Ok(Some(args.http_address));
        }
        let port = match file.healthz_port {
            Some(p) => self.port("healthzPort", p)?,
            None => defaults::HEALTHZ_PORT,
        };
        let ip = match &file.healthz_bind_address {
            Some(s) => self.ip("healthzBindAddress", s)?,
            None => IpAddr::V4(Ipv4Addr::LOCALHOST),
        };
        Ok((port != 0).then_some(SocketAddr::new(ip, port)))
    }

    /// Upstream `nodeutil.GetHostname`: the override or the hostname, trimmed and lowercased.
    pub(super) fn node_name(
        &self,
        args: &RunArgs,
        file: &FileConfig,
        hostname: &dyn Fn() -> Result<String, ConfigError>,
    ) -> Result<String, ConfigError> {
        if let (Some(a), Some(b)) = (&file.node_name, &file.hostname_override)
            && a.trim().to_lowercase() != b.trim().to_lowercase()
        {
            return Err(invalid(
                self.file,
                "nodeName",
                "value",
                a,
                format!("conflicts with hostnameOverride {b:?}; set one of them"),
            ));
        }
        let (raw, origin) = match (
            &args.node_name,
            file.node_name.as_ref().or(file.hostname_override.as_ref()),
        ) {
            (Some(n), _) => (n.clone(), Origin::Flag("--node-name")),
            (None, Some(n)) => (n.clone(), self.file.clone()),
            (None, None) => (hostname()?, Origin::Hostname(PathBuf::from(HOSTNAME_FILE))),
        };
        let name = raw.trim().to_lowercase();
        if !is_dns1123_subdomain(&name) {
            return Err(invalid(
                &origin,
                "nodeName",
                "node name",
                raw,
                "must be a DNS subdomain (lowercase letters, digits, '-' and '.'), e.g. node-1",
            ));
        }
        Ok(name)
    }
}

/// `unix:///path`, or a bare absolute path (which the kubelet still accepts, deprecated).
pub(super) fn runtime_endpoint(origin: &Origin, endpoint: &str) -> Result<String, ConfigError> {
    let path = endpoint.strip_prefix("unix://").unwrap_or(endpoint);
    if endpoint.contains("://") && !endpoint.starts_with("unix://") {
        return Err(invalid(
            origin,
            "containerRuntimeEndpoint",
            "endpoint",
            endpoint,
            "only unix sockets are supported, e.g. unix:///run/containerd/containerd.sock",
        ));
    }
    if !Path::new(path).is_absolute() {
        return Err(invalid(
            origin,
            "containerRuntimeEndpoint",
            "endpoint",
            endpoint,
            "expected an absolute socket path, e.g. unix:///run/containerd/containerd.sock",
        ));
    }
    Ok(format!("unix://{path}"))
}

pub(super) fn system_hostname() -> Result<String, ConfigError> {
    std::fs::read_to_string(HOSTNAME_FILE).map_err(|source| ConfigError::Hostname {
        path: PathBuf::from(HOSTNAME_FILE),
        source,
    })
}

/// RFC 1123 subdomain, as Kubernetes validates object and node names.
pub(crate) fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}
