//! The eviction manager's settings in [`Config`](super::Config): thresholds (`evictionHard`,
//! `evictionSoft`) with their grace periods and minimum reclaims, the max pod grace period, the
//! pressure transition period, and swiftlet's monitoring period and kernel wakeups. Each map comes
//! whole from its flag, else the file, else its default; every statement is parsed by
//! `eviction::thresholds` and a bad one is reported with the flag or field and its text.
//!
//! Not here: the statement grammar and the assembly of thresholds (`eviction/thresholds.rs`).
//! Upstream: `cmd/kubelet/app/server.go` (`loadConfigFile`: default and merged `evictionHard`),
//! `pkg/kubelet/eviction/helpers.go` (`ParseThresholdConfig`).
//!
//! One difference: `mergeDefaultEvictionSettings: true` fills the default hard thresholds into
//! `--eviction-hard` too, not only into the file's `evictionHard` (upstream re-applies the flag
//! after merging, losing the defaults again — the very trap the setting exists to avoid).

use std::{collections::BTreeMap, time::Duration};

use super::{
    duration::GoDuration,
    error::{ConfigError, Origin, invalid},
    input::{Given, MapField},
    settings::Settings,
};
use crate::eviction::thresholds::{
    DEFAULT_EVICTION_HARD, EvictionConfig, Operator, Signal, Threshold, ThresholdError,
    ThresholdValue, Wakeups, build_thresholds, parse_min_reclaim, parse_threshold,
};

/// The eviction settings: flags over file over defaults. `enforce_pods` derives the
/// `allocatableMemory.available` thresholds.
pub(super) fn resolve(
    settings: &Settings,
    enforce_pods: bool,
) -> Result<EvictionConfig, ConfigError> {
    let hard = match statements("evictionHard", settings.eviction_hard.as_ref())? {
        None => Statements::defaults(),
        Some(mut hard) => {
            if settings.merge_default_eviction_settings {
                hard.fill_defaults();
            }
            hard
        }
    };
    let soft = statements("evictionSoft", settings.eviction_soft.as_ref())?
        .unwrap_or_else(|| Statements::empty(Origin::Default));
    let grace_periods = grace_periods(settings)?;
    let min_reclaims = min_reclaims(settings)?;
    let thresholds = build_thresholds(
        hard.thresholds(),
        soft.thresholds(),
        &grace_periods,
        &min_reclaims,
        enforce_pods,
    )
    .map_err(|e| {
        let shown = match &e {
            ThresholdError::MissingGracePeriod(signal) => soft.shown(*signal),
            _ => String::new(),
        };
        invalid(
            &soft.origin,
            "evictionSoft",
            "threshold",
            shown,
            e.to_string(),
        )
    })?;

    Ok(EvictionConfig {
        thresholds,
        max_pod_grace_period_secs: settings.eviction_max_pod_grace_period,
        pressure_transition_period: settings.eviction_pressure_transition_period,
        monitoring_period: settings.eviction_monitoring_period,
        wakeups: wakeups(settings)?,
    })
}

/// The statements of one threshold field, by signal; `None` where a statement turns its
/// threshold off (kept, so merging defaults does not turn it back on).
struct Statements {
    origin: Origin,
    by_signal: BTreeMap<Signal, (Option<Threshold>, String)>,
}

impl Statements {
    fn empty(origin: Origin) -> Statements {
        Statements {
            origin,
            by_signal: BTreeMap::new(),
        }
    }

    fn defaults() -> Statements {
        let mut statements = Statements::empty(Origin::Default);
        statements.fill_defaults();
        statements
    }

    /// Upstream `mergeDefaultEvictionSettings`: a default for each signal not written.
    fn fill_defaults(&mut self) {
        for (signal, value) in DEFAULT_EVICTION_HARD {
            self.by_signal.entry(signal).or_insert_with(|| {
                let threshold = parse_threshold(signal, None, value).ok().flatten();
                (threshold, format!("{signal}{}{value}", signal.operator()))
            });
        }
    }

    fn thresholds(&self) -> Vec<Threshold> {
        self.by_signal
            .values()
            .filter_map(|(t, _)| t.clone())
            .collect()
    }

    fn shown(&self, signal: Signal) -> String {
        self.by_signal
            .get(&signal)
            .map(|(_, shown)| shown.clone())
            .unwrap_or_default()
    }
}

/// `evictionHard`/`evictionSoft`: the flag's statements, else the file's, else `None`.
fn statements(
    field: &'static str,
    map: Option<&MapField>,
) -> Result<Option<Statements>, ConfigError> {
    let Some(map) = map else {
        return Ok(None);
    };
    let mut statements = Statements::empty(map.origin.clone());
    for entry in &map.entries {
        let parsed = entry
            .key
            .parse::<Signal>()
            .and_then(|signal| {
                let operator = entry.separator.map(|s| {
                    if s == '<' {
                        Operator::LessThan
                    } else {
                        Operator::GreaterThan
                    }
                });
                Ok((signal, parse_threshold(signal, operator, &entry.value)?))
            })
            .map_err(|e| invalid(&map.origin, field, "threshold", &entry.shown, e.to_string()))?;
        let (signal, threshold) = parsed;
        statements
            .by_signal
            .insert(signal, (threshold, entry.shown.clone()));
    }
    Ok(Some(statements))
}

/// Each entry's signal, parsed; errors name the field and quote the entry.
fn signals<'a>(
    map: &'a MapField,
    field: &'static str,
    kind: &'static str,
) -> impl Iterator<Item = Result<(Signal, &'a str, &'a str), ConfigError>> + 'a {
    map.entries.iter().map(move |entry| {
        let signal = entry
            .key
            .parse::<Signal>()
            .map_err(|e| invalid(&map.origin, field, kind, &entry.shown, e.to_string()))?;
        Ok((signal, entry.value.as_str(), entry.shown.as_str()))
    })
}

/// `evictionSoftGracePeriod`: signal → Go duration (non-negative).
fn grace_periods(settings: &Settings) -> Result<BTreeMap<Signal, Duration>, ConfigError> {
    const FIELD: &str = "evictionSoftGracePeriod";
    let mut out = BTreeMap::new();
    if let Some(map) = &settings.eviction_soft_grace_period {
        for item in signals(map, FIELD, "grace period") {
            let (signal, value, shown) = item?;
            let period = value.parse::<GoDuration>().map_err(|e| {
                invalid(
                    &map.origin,
                    FIELD,
                    "grace period",
                    shown,
                    e.reason.to_string(),
                )
            })?;
            out.insert(signal, period.0);
        }
    }
    Ok(out)
}

/// `evictionMinimumReclaim`: signal → quantity or percentage.
fn min_reclaims(settings: &Settings) -> Result<BTreeMap<Signal, ThresholdValue>, ConfigError> {
    const FIELD: &str = "evictionMinimumReclaim";
    let mut out = BTreeMap::new();
    if let Some(map) = &settings.eviction_minimum_reclaim {
        for item in signals(map, FIELD, "minimum reclaim") {
            let (signal, value, shown) = item?;
            let reclaim = parse_min_reclaim(signal, value).map_err(|e| {
                invalid(&map.origin, FIELD, "minimum reclaim", shown, e.to_string())
            })?;
            out.insert(signal, reclaim);
        }
    }
    Ok(out)
}

/// `evictionWakeups`: any of `psi`, `kernel`, `memcg`, `level`, `poll`; empty or `none` for none;
/// default all but `poll`.
fn wakeups(settings: &Settings) -> Result<Wakeups, ConfigError> {
    let Some(Given {
        value: names,
        origin,
    }) = &settings.eviction_wakeups
    else {
        return Ok(Wakeups::ALL);
    };
    let mut wakeups = Wakeups::NONE;
    for name in names {
        let bad = |reason| invalid(origin, "evictionWakeups", "value", name, reason);
        match name.as_str() {
            "psi" => wakeups.psi = true,
            "kernel" => wakeups.kernel = true,
            "memcg" => wakeups.memcg = true,
            "level" => wakeups.level = true,
            "poll" => wakeups.poll = true,
            "none" if names.len() == 1 => {}
            "none" => return Err(bad("\"none\" cannot be combined with other values")),
            _ => {
                return Err(bad(
                    "expected \"psi\", \"kernel\", \"memcg\", \"level\", \"poll\" or \"none\"",
                ));
            }
        }
    }
    Ok(wakeups)
}
