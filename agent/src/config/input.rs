//! One setting as given ([`Input`]: its flag's value, its file field's value, their names) and the
//! rules that turn it into a value: the flag's if given, else the file's, else none, checked by
//! kind (positive durations, ports, addresses, integers in a range, lists, maps with their flag
//! syntax, the CRI endpoint, the node name). Each rule returns the value or a [`ConfigError`]
//! naming field, origin and value; the settings table (`settings.rs`) names one rule per setting.
//!
//! Not here: which setting uses which rule and its default (`settings.rs`), or checks that need
//! several settings (the sections, `load.rs`). Upstream: the flag types of
//! `k8s.io/component-base/cli/flag` (`MapStringString`, `LangleSeparatedMapStringString`) and
//! `pkg/kubelet/apis/config/validation/validation.go`.

use std::{
    collections::BTreeMap,
    fmt,
    net::IpAddr,
    ops::RangeInclusive,
    path::{Path, PathBuf},
    str::FromStr,
    time::Duration,
};

use super::{
    duration::GoDuration,
    error::{ConfigError, Origin, invalid},
};

/// Where the kernel keeps the node's hostname (what `os.Hostname` returns upstream).
pub(super) const HOSTNAME_FILE: &str = "/proc/sys/kernel/hostname";

/// One setting as the operator gave it, before any rule ran.
pub(super) struct Input<'a, F, G> {
    /// The file key (or, for a setting only a flag sets, the key it stands for), for messages.
    pub(super) field: &'static str,
    /// The flag's parsed value and its name (`--sync-frequency`); `None` for a setting no flag
    /// sets.
    pub(super) flag: Option<(&'a F, &'static str)>,
    /// The file's value, `None` when the file does not write it (or has no such key).
    pub(super) file: Option<&'a G>,
    /// The configuration file, named in messages about its values.
    pub(super) file_origin: &'a Origin,
}

/// A value with where it came from, for checks made after the table's (a pair of settings that
/// must agree, the entries of a list).
#[derive(Clone, Debug)]
pub(super) struct Given<T> {
    pub(super) value: T,
    pub(super) origin: Origin,
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

type Resolved<T> = Result<Option<T>, ConfigError>;

impl<'a, T, G> Input<'a, Option<T>, G> {
    /// The flag's value if it was given.
    fn flag_value(&self) -> Option<(&'a T, &'static str)> {
        self.flag
            .and_then(|(value, name)| value.as_ref().map(|v| (v, name)))
    }
}

/// The flag's value, else the file's, as is.
pub(super) fn plain<T: Clone>(input: Input<Option<T>, T>) -> Resolved<T> {
    Ok(input
        .flag_value()
        .map(|(v, _)| v.clone())
        .or_else(|| input.file.cloned()))
}

/// [`plain`], remembering where the value came from.
pub(super) fn given<F: Clone + Into<G>, G: Clone>(
    input: Input<Option<F>, G>,
) -> Resolved<Given<G>> {
    Ok(match (input.flag_value(), input.file) {
        (Some((v, name)), _) => Some(Given {
            value: v.clone().into(),
            origin: Origin::Flag(name),
        }),
        (None, Some(v)) => Some(Given {
            value: v.clone(),
            origin: input.file_origin.clone(),
        }),
        (None, None) => None,
    })
}

/// A flag that is always set (a plain switch).
pub(super) fn flag<T: Clone>(input: Input<T, T>) -> Resolved<T> {
    Ok(input.flag.map(|(v, _)| v.clone()))
}

/// A flag with a clap default that only counts when it differs from that default (its file
/// fields are resolved apart).
pub(super) fn changed_flag<T: Clone + ToString>(
    input: Input<T, T>,
    clap_default: &str,
) -> Resolved<T> {
    Ok(input
        .flag
        .filter(|(v, _)| v.to_string() != clap_default)
        .map(|(v, _)| v.clone()))
}

/// A flag with a clap default, which counts as "not given" at that default so the file wins.
pub(super) fn flag_over_file<T: Clone + PartialEq>(
    input: Input<T, T>,
    clap_default: &T,
) -> Resolved<T> {
    Ok(match (input.flag, input.file) {
        (Some((v, _)), Some(file)) if v == clap_default => Some(file.clone()),
        (Some((v, _)), _) => Some(v.clone()),
        (None, file) => file.cloned(),
    })
}

/// A path; an empty one means none.
pub(super) fn optional_path(input: Input<Option<PathBuf>, PathBuf>) -> Resolved<PathBuf> {
    Ok(plain(input)?.filter(|p| !p.as_os_str().is_empty()))
}

/// A Go duration that may be zero.
pub(super) fn duration(input: Input<Option<GoDuration>, String>) -> Resolved<Duration> {
    if let Some((d, _)) = input.flag_value() {
        return Ok(Some(d.0));
    }
    input
        .file
        .map(|text| {
            text.parse::<GoDuration>().map(|d| d.0).map_err(|e| {
                invalid(
                    input.file_origin,
                    input.field,
                    "duration",
                    text,
                    e.reason.to_string(),
                )
            })
        })
        .transpose()
}

/// A positive Go duration.
pub(super) fn positive_duration(input: Input<Option<GoDuration>, String>) -> Resolved<Duration> {
    // The value as the operator wrote it, for the message.
    let (value, shown, origin) = match (input.flag_value(), input.file) {
        (Some((d, name)), _) => (*d, d.to_string(), Origin::Flag(name)),
        (None, Some(text)) => {
            let d = text.parse::<GoDuration>().map_err(|e| {
                invalid(
                    input.file_origin,
                    input.field,
                    "duration",
                    text,
                    e.reason.to_string(),
                )
            })?;
            (d, text.clone(), input.file_origin.clone())
        }
        (None, None) => return Ok(None),
    };
    if value.0.is_zero() {
        return Err(invalid(
            &origin,
            input.field,
            "duration",
            shown,
            "must be greater than 0",
        ));
    }
    Ok(Some(value.0))
}

/// A port; 0 turns its listener off.
pub(super) fn port(input: Input<Option<u16>, i64>) -> Resolved<u16> {
    match (input.flag_value(), input.file) {
        (Some((p, _)), _) => Ok(Some(*p)),
        (None, Some(n)) => u16::try_from(*n).map(Some).map_err(|_| {
            invalid(
                input.file_origin,
                input.field,
                "port",
                n,
                "must be between 0 (off) and 65535",
            )
        }),
        (None, None) => Ok(None),
    }
}

/// An IP address (the flag's is parsed by clap).
pub(super) fn ip(input: Input<Option<IpAddr>, String>) -> Resolved<IpAddr> {
    match (input.flag_value(), input.file) {
        (Some((ip, _)), _) => Ok(Some(*ip)),
        (None, Some(s)) => s.parse::<IpAddr>().map(Some).map_err(|_| {
            invalid(
                input.file_origin,
                input.field,
                "address",
                s,
                "expected an IP address, e.g. 127.0.0.1",
            )
        }),
        (None, None) => Ok(None),
    }
}

/// An integer in `range`, converted to `T`; `reason` says what the range is.
pub(super) fn int<F: Copy + Into<i64>, T: TryFrom<i64>>(
    input: Input<Option<F>, i64>,
    range: RangeInclusive<i64>,
    reason: &str,
) -> Resolved<T> {
    let (value, origin) = match (input.flag_value(), input.file) {
        (Some((v, name)), _) => ((*v).into(), Origin::Flag(name)),
        (None, Some(v)) => (*v, input.file_origin.clone()),
        (None, None) => return Ok(None),
    };
    Some(value)
        .filter(|v| range.contains(v))
        .and_then(|v| T::try_from(v).ok())
        .map(Some)
        .ok_or_else(|| invalid(&origin, input.field, "value", value, reason))
}

/// A value parsed from text by `T::from_str`, whose error says what was expected.
pub(super) fn parsed<T>(input: Input<Option<String>, String>) -> Resolved<T>
where
    T: FromStr,
    T::Err: fmt::Display,
{
    let Some(Given { value, origin }) = given(input_of(&input))? else {
        return Ok(None);
    };
    value
        .parse::<T>()
        .map(Some)
        .map_err(|why| invalid(&origin, input.field, "value", &value, why.to_string()))
}

/// The same input, borrowed again (rules that build on other rules).
fn input_of<'a, F, G>(input: &Input<'a, F, G>) -> Input<'a, F, G> {
    Input {
        field: input.field,
        flag: input.flag,
        file: input.file,
        file_origin: input.file_origin,
    }
}

/// A comma-separated list flag (upstream `StringSlice`, repeatable) if given, else the file's
/// list, else `None`. Empty items are dropped.
pub(super) fn list(input: Input<Vec<String>, Vec<String>>) -> Resolved<Given<Vec<String>>> {
    let trimmed = |items: &mut dyn Iterator<Item = &str>| -> Vec<String> {
        items
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    };
    Ok(match input.flag {
        Some((flag, name)) if !flag.is_empty() => Some(Given {
            value: trimmed(&mut flag.iter().flat_map(|v| v.split(','))),
            origin: Origin::Flag(name),
        }),
        _ => input.file.map(|list| Given {
            value: trimmed(&mut list.iter().map(String::as_str)),
            origin: input.file_origin.clone(),
        }),
    })
}

/// A map field: the flag's entries if the flag was given, else the file's, else `None`. The
/// flag's syntax is upstream's `MapStringString` (`key=value`) or, with `<` and `>` as
/// `separators`, `LangleSeparatedMapStringString` (`memory.available<1Gi`): comma-separated
/// entries, the flag repeatable, a later key replacing an earlier one, and the flag given
/// with an empty value meaning an empty map. `kind` names an entry in messages; `syntax` says
/// what one should look like.
pub(super) fn map(
    input: Input<Vec<String>, BTreeMap<String, String>>,
    kind: &'static str,
    separators: &[char],
    syntax: &str,
) -> Resolved<MapField> {
    let flag = match input.flag {
        Some((flag, name)) if !flag.is_empty() => (flag, name),
        _ => {
            return Ok(input.file.map(|map| MapField {
                origin: input.file_origin.clone(),
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
    };
    let origin = Origin::Flag(flag.1);
    let mut entries: Vec<MapEntry> = Vec::new();
    for piece in flag.0.iter().flat_map(|v| v.split(',')).map(str::trim) {
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
            .ok_or_else(|| invalid(&origin, input.field, kind, piece, syntax))?;
        entries.retain(|e| e.key != entry.key);
        entries.push(entry);
    }
    Ok(Some(MapField { origin, entries }))
}

/// `unix:///path`, or a bare absolute path (which the kubelet still accepts, deprecated).
pub(super) fn runtime_endpoint(input: Input<Option<String>, String>) -> Resolved<String> {
    let Some(Given {
        value: endpoint,
        origin,
    }) = given(input_of(&input))?
    else {
        return Ok(None);
    };
    let path = endpoint.strip_prefix("unix://").unwrap_or(&endpoint);
    let bad = |reason| invalid(&origin, input.field, "endpoint", &endpoint, reason);
    if endpoint.contains("://") && !endpoint.starts_with("unix://") {
        return Err(bad(
            "only unix sockets are supported, e.g. unix:///run/containerd/containerd.sock",
        ));
    }
    if !Path::new(path).is_absolute() {
        return Err(bad(
            "expected an absolute socket path, e.g. unix:///run/containerd/containerd.sock",
        ));
    }
    Ok(Some(format!("unix://{path}")))
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
