//! Eviction signals and thresholds as an operator writes them (`memory.available<100Mi`,
//! `nodefs.available<10%`, and swiftlet's PSI extension `memory.pressure.some.avg10>40`), and the
//! settings that go with them (grace periods, minimum reclaim, max pod grace period, transition
//! period). Parsed and validated once at start; every error quotes the offending text.
//!
//! Not here: how thresholds are evaluated against observations (`logic.rs`), where the values
//! come from (config: flags over file over [`DEFAULT_EVICTION_HARD`]). Upstream:
//! `pkg/kubelet/eviction/api/types.go`, `helpers.go` (`ParseThresholdConfig`,
//! `parseThresholdStatement`, `parseMinimumReclaims`), `defaults_linux.go`.
//!
//! As upstream: a percentage of exactly 0 or 100 turns its threshold off (nothing is ever below
//! 0% or above 100%); a quantity must be positive; a soft threshold needs a grace period; a grace
//! period or minimum reclaim for a signal without threshold is ignored; enforcing node
//! allocatable on pods copies each hard `memory.available` threshold to
//! `allocatableMemory.available`. Differences, each for a reason:
//! - `0.0%` and `100.0%` are off too, not only the exact texts `0%` and `100%`.
//! - The copy to `allocatableMemory.available` is skipped when the operator set a hard one: two
//!   thresholds of one signal would only make the stricter one matter.
//! - A minimum reclaim of `0%` is accepted (it means none, as `0Mi` does upstream), one above
//!   100% is rejected, and pressure signals take none: a PSI average is not reclaimed by an amount.

use std::{collections::BTreeMap, fmt, str::FromStr, time::Duration};

use crate::cm::quantity::{Quantity, QuantityErrorKind};

/// What is measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Signal {
    /// `memory.available`: node capacity minus the working set of the root cgroup.
    MemoryAvailable,
    /// `allocatableMemory.available`: allocatable minus the working set of the pods' cgroup.
    AllocatableMemoryAvailable,
    /// `nodefs.available`: free bytes of the filesystem holding the root dir and logs.
    NodeFsAvailable,
    /// `nodefs.inodesFree`.
    NodeFsInodesFree,
    /// `imagefs.available`: free bytes of the runtime's image filesystem.
    ImageFsAvailable,
    /// `imagefs.inodesFree`.
    ImageFsInodesFree,
    /// `pid.available`: the node's pid limit minus the processes running.
    PidAvailable,
    /// swiftlet's extension: a PSI average of the pods' cgroup, e.g. `memory.pressure.some.avg10`.
    Pressure(PsiSignal),
}

/// Which PSI figure a [`Signal::Pressure`] threshold watches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PsiSignal {
    pub resource: PsiSignalResource,
    /// `full` (all tasks stalled) rather than `some`.
    pub full: bool,
    pub window: PsiWindow,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PsiSignalResource {
    Memory,
    Io,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PsiWindow {
    Avg10,
    Avg60,
    Avg300,
}

/// `<` for the kubelet's signals, `>` for PSI.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operator {
    LessThan,
    GreaterThan,
}

/// A threshold's value: an absolute amount (bytes, inodes, pids) or a fraction of capacity.
/// For PSI thresholds the value is the average as a fraction (40 → 0.40).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ThresholdValue {
    Quantity(i64),
    /// 0.0 ..= 1.0.
    Percentage(f64),
}

/// One threshold: hard (grace period zero) or soft.
#[derive(Clone, Debug, PartialEq)]
pub struct Threshold {
    pub signal: Signal,
    pub operator: Operator,
    pub value: ThresholdValue,
    /// Zero for a hard threshold.
    pub grace_period: Duration,
    /// `evictionMinimumReclaim` for this signal: once met, the threshold stays met until this
    /// much more than the threshold is available again.
    pub min_reclaim: Option<ThresholdValue>,
    /// As the operator wrote it, for messages (e.g. `memory.available<100Mi`).
    pub text: String,
}

impl Threshold {
    pub fn is_hard(&self) -> bool {
        self.grace_period.is_zero()
    }
}

/// Which kernel signals wake the eviction manager besides its periodic check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wakeups {
    /// PSI triggers on the pods' cgroup and the node.
    pub psi: bool,
    /// OOM kills and reclaim from the eBPF programs.
    pub kernel: bool,
    /// Memory cgroup notifications: v1 usage thresholds, v2 `memory.events`.
    pub memcg: bool,
    /// cgroup v2: the pods' cgroup reaching the memory level a threshold means, seen by the
    /// kernel programs in the charge itself; where they cannot run, by polling `memory.current`.
    pub level: bool,
    /// cgroup v2: polling `memory.current` for that level every 10 ms, also where the kernel
    /// programs run (to compare the two).
    pub poll: bool,
}

impl Wakeups {
    /// The default: everything but the poll, which `level` falls back to by itself.
    pub const ALL: Wakeups = Wakeups {
        psi: true,
        kernel: true,
        memcg: true,
        level: true,
        poll: false,
    };
    pub const NONE: Wakeups = Wakeups {
        psi: false,
        kernel: false,
        memcg: false,
        level: false,
        poll: false,
    };
}

/// Everything the eviction manager is configured with.
#[derive(Clone, Debug, PartialEq)]
pub struct EvictionConfig {
    /// Hard and soft thresholds, including the `allocatableMemory.available` one derived when
    /// node allocatable is enforced on pods.
    pub thresholds: Vec<Threshold>,
    /// `evictionMaxPodGracePeriod` (seconds): the most a soft eviction grants a pod.
    pub max_pod_grace_period_secs: i64,
    /// `evictionPressureTransitionPeriod`: how long a pressure condition stays after its
    /// threshold stops being met.
    pub pressure_transition_period: Duration,
    /// The periodic safety-net check (upstream's fixed 10 s monitoring period).
    pub monitoring_period: Duration,
    pub wakeups: Wakeups,
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Signal::MemoryAvailable => f.write_str("memory.available"),
            Signal::AllocatableMemoryAvailable => f.write_str("allocatableMemory.available"),
            Signal::NodeFsAvailable => f.write_str("nodefs.available"),
            Signal::NodeFsInodesFree => f.write_str("nodefs.inodesFree"),
            Signal::ImageFsAvailable => f.write_str("imagefs.available"),
            Signal::ImageFsInodesFree => f.write_str("imagefs.inodesFree"),
            Signal::PidAvailable => f.write_str("pid.available"),
            Signal::Pressure(p) => write!(
                f,
                "{}.pressure.{}.{}",
                match p.resource {
                    PsiSignalResource::Memory => "memory",
                    PsiSignalResource::Io => "io",
                },
                if p.full { "full" } else { "some" },
                match p.window {
                    PsiWindow::Avg10 => "avg10",
                    PsiWindow::Avg60 => "avg60",
                    PsiWindow::Avg300 => "avg300",
                }
            ),
        }
    }
}

impl fmt::Display for Operator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Operator::LessThan => "<",
            Operator::GreaterThan => ">",
        })
    }
}

/// The kubelet's hard thresholds when `evictionHard` is not set at all, and what
/// `mergeDefaultEvictionSettings` fills in for the signals a set `evictionHard` leaves out
/// (upstream `DefaultEvictionHard`, `pkg/kubelet/eviction/defaults_linux.go`).
pub const DEFAULT_EVICTION_HARD: [(Signal, &str); 5] = [
    (Signal::MemoryAvailable, "100Mi"),
    (Signal::NodeFsAvailable, "10%"),
    (Signal::NodeFsInodesFree, "5%"),
    (Signal::ImageFsAvailable, "15%"),
    (Signal::ImageFsInodesFree, "5%"),
];

/// Why a threshold, minimum reclaim or signal name was rejected; the caller names the field and
/// quotes the statement.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ThresholdError {
    #[error(
        "expected <signal><operator><value>, e.g. memory.available<100Mi or \
         memory.pressure.some.avg10>40"
    )]
    Syntax,
    #[error(
        "unknown eviction signal {0:?}: expected memory.available, allocatableMemory.available, \
         nodefs.available, nodefs.inodesFree, imagefs.available, imagefs.inodesFree, \
         pid.available, or <memory|io>.pressure.<some|full>.<avg10|avg60|avg300>"
    )]
    UnknownSignal(String),
    #[error("cpu pressure is not an eviction signal: CPU is compressible")]
    CpuPressure,
    #[error("{signal} takes the operator \"{expected}\"")]
    WrongOperator { signal: Signal, expected: Operator },
    #[error("expected a quantity (e.g. 100Mi) or a percentage (e.g. 10%): {0}")]
    Quantity(QuantityErrorKind),
    #[error("expected a percentage, e.g. 10% or 7.5%")]
    Percentage,
    #[error("a percentage must be between 0% and 100%")]
    PercentageRange,
    #[error("a pressure threshold is a percentage between 0 and 100, e.g. 40 or 25.5%")]
    PressureValue,
    #[error("must be positive (to turn a threshold off, leave it out or write 0%)")]
    NotPositive,
    #[error("must not be negative")]
    Negative,
    #[error("a pressure signal takes no minimum reclaim")]
    PressureReclaim,
    #[error("grace period must be specified for the soft eviction threshold {0}")]
    MissingGracePeriod(Signal),
}

impl Signal {
    /// The operator of a threshold on this signal: `<` (too little left) for the kubelet's
    /// signals, `>` (too much stall) for PSI.
    pub fn operator(self) -> Operator {
        match self {
            Signal::Pressure(_) => Operator::GreaterThan,
            _ => Operator::LessThan,
        }
    }

    pub fn is_pressure(self) -> bool {
        matches!(self, Signal::Pressure(_))
    }
}

impl FromStr for Signal {
    type Err = ThresholdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "memory.available" => Signal::MemoryAvailable,
            "allocatableMemory.available" => Signal::AllocatableMemoryAvailable,
            "nodefs.available" => Signal::NodeFsAvailable,
            "nodefs.inodesFree" => Signal::NodeFsInodesFree,
            "imagefs.available" => Signal::ImageFsAvailable,
            "imagefs.inodesFree" => Signal::ImageFsInodesFree,
            "pid.available" => Signal::PidAvailable,
            _ => return pressure_signal(s).map(Signal::Pressure),
        })
    }
}

/// `<memory|io>.pressure.<some|full>.<avg10|avg60|avg300>`.
fn pressure_signal(s: &str) -> Result<PsiSignal, ThresholdError> {
    let unknown = || ThresholdError::UnknownSignal(s.to_owned());
    let parts: Vec<&str> = s.split('.').collect();
    let [resource, "pressure", kind, window] = parts[..] else {
        return Err(unknown());
    };
    let resource = match resource {
        "memory" => PsiSignalResource::Memory,
        "io" => PsiSignalResource::Io,
        "cpu" => return Err(ThresholdError::CpuPressure),
        _ => return Err(unknown()),
    };
    let full = match kind {
        "some" => false,
        "full" => true,
        _ => return Err(unknown()),
    };
    let window = match window {
        "avg10" => PsiWindow::Avg10,
        "avg60" => PsiWindow::Avg60,
        "avg300" => PsiWindow::Avg300,
        _ => return Err(unknown()),
    };
    Ok(PsiSignal {
        resource,
        full,
        window,
    })
}

/// Splits the flag form `memory.available<100Mi` / `io.pressure.full.avg60>25` at its first
/// operator into (signal, operator, value), trimmed.
pub fn split_statement(text: &str) -> Result<(&str, Operator, &str), ThresholdError> {
    let at = text.find(['<', '>']).ok_or(ThresholdError::Syntax)?;
    let operator = if text[at..].starts_with('<') {
        Operator::LessThan
    } else {
        Operator::GreaterThan
    };
    let (signal, value) = (text[..at].trim(), text[at + 1..].trim());
    if signal.is_empty() {
        return Err(ThresholdError::Syntax);
    }
    Ok((signal, operator, value))
}

/// One threshold on `signal` (upstream `parseThresholdStatement`). `operator` is the one written,
/// or `None` where it is implied (the file's maps); `value` is a quantity (`100Mi`, positive) or
/// a percentage (`10%`, `7.5%`), and for pressure signals a percentage with or without `%`.
/// `Ok(None)`: the statement turns the threshold off (0% or 100%). The result is hard; the
/// caller gives soft ones their grace period.
pub fn parse_threshold(
    signal: Signal,
    operator: Option<Operator>,
    value: &str,
) -> Result<Option<Threshold>, ThresholdError> {
    let expected = signal.operator();
    if operator.is_some_and(|op| op != expected) {
        return Err(ThresholdError::WrongOperator { signal, expected });
    }
    let parsed = if signal.is_pressure() {
        let number = value.strip_suffix('%').unwrap_or(value);
        fraction(number).map_err(|_| ThresholdError::PressureValue)?
    } else if let Some(number) = value.strip_suffix('%') {
        fraction(number)?
    } else {
        let quantity = Quantity::parse(value).map_err(|e| ThresholdError::Quantity(e.kind))?;
        if quantity.nanos() <= 0 {
            return Err(ThresholdError::NotPositive);
        }
        ThresholdValue::Quantity(quantity.value())
    };
    if matches!(parsed, ThresholdValue::Percentage(f) if f == 0.0 || f == 1.0) {
        return Ok(None);
    }
    Ok(Some(Threshold {
        signal,
        operator: expected,
        value: parsed,
        grace_period: Duration::ZERO,
        min_reclaim: None,
        text: format!("{signal}{expected}{value}"),
    }))
}

/// The flag form of [`parse_threshold`]: `memory.available<100Mi`, `memory.pressure.some.avg10>40`.
pub fn parse_threshold_statement(text: &str) -> Result<Option<Threshold>, ThresholdError> {
    let (signal, operator, value) = split_statement(text)?;
    parse_threshold(signal.parse()?, Some(operator), value)
}

/// One `evictionMinimumReclaim` value (upstream `parseMinimumReclaims`): a non-negative quantity
/// or a percentage up to 100%.
pub fn parse_min_reclaim(signal: Signal, value: &str) -> Result<ThresholdValue, ThresholdError> {
    if signal.is_pressure() {
        return Err(ThresholdError::PressureReclaim);
    }
    if let Some(number) = value.strip_suffix('%') {
        return fraction(number);
    }
    let quantity = Quantity::parse(value).map_err(|e| ThresholdError::Quantity(e.kind))?;
    if quantity.nanos() < 0 {
        return Err(ThresholdError::Negative);
    }
    Ok(ThresholdValue::Quantity(quantity.value()))
}

/// A percentage's number (`7.5` of `7.5%`) as a fraction in 0..=1.
fn fraction(number: &str) -> Result<ThresholdValue, ThresholdError> {
    let percent: f64 = number
        .parse()
        .ok()
        .filter(|p: &f64| p.is_finite())
        .ok_or(ThresholdError::Percentage)?;
    if !(0.0..=100.0).contains(&percent) {
        return Err(ThresholdError::PercentageRange);
    }
    Ok(ThresholdValue::Percentage(percent / 100.0))
}

/// The rest of upstream `ParseThresholdConfig`, once each statement is parsed: soft thresholds
/// take their grace period (one is required), every threshold of a signal takes its minimum
/// reclaim, and with `enforce_pods` each hard `memory.available` threshold is copied (operator,
/// value, minimum reclaim) to `allocatableMemory.available` unless one is set. Hard first, then
/// soft, then the copies.
pub fn build_thresholds(
    hard: Vec<Threshold>,
    soft: Vec<Threshold>,
    grace_periods: &BTreeMap<Signal, Duration>,
    min_reclaims: &BTreeMap<Signal, ThresholdValue>,
    enforce_pods: bool,
) -> Result<Vec<Threshold>, ThresholdError> {
    let mut thresholds = hard;
    for mut threshold in soft {
        threshold.grace_period = *grace_periods
            .get(&threshold.signal)
            .ok_or(ThresholdError::MissingGracePeriod(threshold.signal))?;
        thresholds.push(threshold);
    }
    for threshold in &mut thresholds {
        threshold.min_reclaim = min_reclaims.get(&threshold.signal).copied();
    }
    let allocatable_set = thresholds
        .iter()
        .any(|t| t.signal == Signal::AllocatableMemoryAvailable && t.is_hard());
    if enforce_pods && !allocatable_set {
        let copies: Vec<Threshold> = thresholds
            .iter()
            .filter(|t| t.signal == Signal::MemoryAvailable && t.is_hard())
            .map(|t| Threshold {
                signal: Signal::AllocatableMemoryAvailable,
                text: t
                    .text
                    .replacen("memory.available", "allocatableMemory.available", 1),
                ..t.clone()
            })
            .collect();
        thresholds.extend(copies);
    }
    Ok(thresholds)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MI: i64 = 1 << 20;

    fn statement(text: &str) -> Result<Option<Threshold>, ThresholdError> {
        parse_threshold_statement(text)
    }

    fn value(text: &str) -> ThresholdValue {
        match statement(text) {
            Ok(Some(t)) => t.value,
            other => panic!("{text}: {other:?}"),
        }
    }

    #[test]
    fn signal_names_round_trip() {
        for name in [
            "memory.available",
            "allocatableMemory.available",
            "nodefs.available",
            "nodefs.inodesFree",
            "imagefs.available",
            "imagefs.inodesFree",
            "pid.available",
            "memory.pressure.some.avg10",
            "memory.pressure.full.avg300",
            "io.pressure.some.avg60",
            "io.pressure.full.avg10",
        ] {
            let signal: Signal = name.parse().expect(name);
            assert_eq!(signal.to_string(), name);
        }
    }

    #[test]
    fn kubelet_statements() {
        let t = statement("memory.available<100Mi")
            .expect("parses")
            .expect("on");
        assert_eq!(
            t,
            Threshold {
                signal: Signal::MemoryAvailable,
                operator: Operator::LessThan,
                value: ThresholdValue::Quantity(100 * MI),
                grace_period: Duration::ZERO,
                min_reclaim: None,
                text: "memory.available<100Mi".to_owned(),
            }
        );
        assert!(t.is_hard());
        assert_eq!(
            value("nodefs.available<10%"),
            ThresholdValue::Percentage(0.1)
        );
        assert_eq!(
            value("imagefs.available < 7.5%"),
            ThresholdValue::Percentage(0.075)
        );
        assert_eq!(
            value("nodefs.inodesFree<1k"),
            ThresholdValue::Quantity(1000)
        );
        assert_eq!(value("pid.available<500"), ThresholdValue::Quantity(500));
        // Fractions of a unit round up, as upstream's Value().
        assert_eq!(value("memory.available<0.5"), ThresholdValue::Quantity(1));
    }

    #[test]
    fn pressure_statements() {
        let t = statement("memory.pressure.some.avg10>40")
            .expect("parses")
            .expect("on");
        assert_eq!(
            t.signal,
            Signal::Pressure(PsiSignal {
                resource: PsiSignalResource::Memory,
                full: false,
                window: PsiWindow::Avg10,
            })
        );
        assert_eq!(t.operator, Operator::GreaterThan);
        assert_eq!(t.value, ThresholdValue::Percentage(0.4));
        assert_eq!(t.text, "memory.pressure.some.avg10>40");
        assert_eq!(
            value("io.pressure.full.avg60>25.5%"),
            ThresholdValue::Percentage(0.255)
        );
        // The file's form: the operator is implied.
        let signal: Signal = "io.pressure.some.avg300".parse().expect("signal");
        let t = parse_threshold(signal, None, "40")
            .expect("parses")
            .expect("on");
        assert_eq!(t.text, "io.pressure.some.avg300>40");
    }

    #[test]
    fn zero_and_full_percentages_turn_a_threshold_off() {
        for text in [
            "memory.available<0%",
            "nodefs.available<100%",
            "nodefs.available<100.0%",
            "memory.pressure.some.avg10>0",
            "memory.pressure.some.avg10>100%",
        ] {
            assert_eq!(statement(text), Ok(None), "{text}");
        }
    }

    #[test]
    fn bad_statements_say_why() {
        let cases: &[(&str, ThresholdError)] = &[
            ("memory.available", ThresholdError::Syntax),
            ("<100Mi", ThresholdError::Syntax),
            (
                "memory.availble<100Mi",
                ThresholdError::UnknownSignal("memory.availble".to_owned()),
            ),
            (
                "memory.pressure.some.avg20>40",
                ThresholdError::UnknownSignal("memory.pressure.some.avg20".to_owned()),
            ),
            (
                "memory.pressure.most.avg10>40",
                ThresholdError::UnknownSignal("memory.pressure.most.avg10".to_owned()),
            ),
            ("cpu.pressure.some.avg10>40", ThresholdError::CpuPressure),
            (
                "memory.available>100Mi",
                ThresholdError::WrongOperator {
                    signal: Signal::MemoryAvailable,
                    expected: Operator::LessThan,
                },
            ),
            (
                "io.pressure.full.avg60<25",
                ThresholdError::WrongOperator {
                    signal: "io.pressure.full.avg60".parse().expect("signal"),
                    expected: Operator::GreaterThan,
                },
            ),
            (
                "memory.available<abc",
                ThresholdError::Quantity(QuantityErrorKind::NoDigits),
            ),
            (
                "memory.available<100Mb",
                ThresholdError::Quantity(QuantityErrorKind::UnknownSuffix("Mb".to_owned())),
            ),
            (
                "memory.available<",
                ThresholdError::Quantity(QuantityErrorKind::Empty),
            ),
            ("memory.available<0", ThresholdError::NotPositive),
            ("memory.available<-1Gi", ThresholdError::NotPositive),
            ("nodefs.available<-5%", ThresholdError::PercentageRange),
            ("nodefs.available<101%", ThresholdError::PercentageRange),
            ("nodefs.available<ten%", ThresholdError::Percentage),
            ("nodefs.available<NaN%", ThresholdError::Percentage),
            ("nodefs.available<inf%", ThresholdError::Percentage),
            (
                "memory.pressure.some.avg10>150",
                ThresholdError::PressureValue,
            ),
            (
                "memory.pressure.some.avg10>-1",
                ThresholdError::PressureValue,
            ),
            (
                "memory.pressure.some.avg10>1Gi",
                ThresholdError::PressureValue,
            ),
        ];
        for (text, want) in cases {
            assert_eq!(statement(text).as_ref(), Err(want), "{text}");
        }
        assert_eq!(
            ThresholdError::WrongOperator {
                signal: Signal::MemoryAvailable,
                expected: Operator::LessThan
            }
            .to_string(),
            "memory.available takes the operator \"<\""
        );
        assert_eq!(
            ThresholdError::Quantity(QuantityErrorKind::NoDigits).to_string(),
            "expected a quantity (e.g. 100Mi) or a percentage (e.g. 10%): no digits"
        );
    }

    #[test]
    fn minimum_reclaims() {
        let memory = Signal::MemoryAvailable;
        assert_eq!(
            parse_min_reclaim(memory, "0Mi"),
            Ok(ThresholdValue::Quantity(0))
        );
        assert_eq!(
            parse_min_reclaim(memory, "500Mi"),
            Ok(ThresholdValue::Quantity(500 * MI))
        );
        assert_eq!(
            parse_min_reclaim(memory, "5%"),
            Ok(ThresholdValue::Percentage(0.05))
        );
        assert_eq!(
            parse_min_reclaim(memory, "0%"),
            Ok(ThresholdValue::Percentage(0.0))
        );
        assert_eq!(
            parse_min_reclaim(memory, "-1Mi"),
            Err(ThresholdError::Negative)
        );
        assert_eq!(
            parse_min_reclaim(memory, "150%"),
            Err(ThresholdError::PercentageRange)
        );
        assert_eq!(
            parse_min_reclaim(memory, "lots"),
            Err(ThresholdError::Quantity(QuantityErrorKind::NoDigits))
        );
        let psi: Signal = "memory.pressure.some.avg10".parse().expect("signal");
        assert_eq!(
            parse_min_reclaim(psi, "10"),
            Err(ThresholdError::PressureReclaim)
        );
    }

    fn hard(text: &str) -> Threshold {
        statement(text).expect("parses").expect("on")
    }

    #[test]
    fn soft_thresholds_take_their_grace_period_and_all_their_min_reclaim() {
        let grace = BTreeMap::from([(Signal::MemoryAvailable, Duration::from_secs(90))]);
        let reclaim = BTreeMap::from([(Signal::MemoryAvailable, ThresholdValue::Quantity(MI))]);
        let thresholds = build_thresholds(
            vec![hard("memory.available<100Mi")],
            vec![hard("memory.available<1Gi")],
            &grace,
            &reclaim,
            false,
        )
        .expect("builds");
        assert_eq!(thresholds.len(), 2);
        assert!(thresholds[0].is_hard());
        assert_eq!(thresholds[1].grace_period, Duration::from_secs(90));
        assert!(
            thresholds
                .iter()
                .all(|t| t.min_reclaim == Some(ThresholdValue::Quantity(MI)))
        );
    }

    #[test]
    fn a_soft_threshold_without_grace_period_is_an_error() {
        let err = build_thresholds(
            vec![],
            vec![hard("nodefs.available<15%")],
            &BTreeMap::from([(Signal::MemoryAvailable, Duration::from_secs(1))]),
            &BTreeMap::new(),
            false,
        )
        .expect_err("rejected");
        assert_eq!(
            err.to_string(),
            "grace period must be specified for the soft eviction threshold nodefs.available"
        );
    }

    #[test]
    fn enforcing_pods_copies_hard_memory_thresholds_to_allocatable() {
        let reclaim = BTreeMap::from([(Signal::MemoryAvailable, ThresholdValue::Quantity(MI))]);
        let grace = BTreeMap::from([(Signal::MemoryAvailable, Duration::from_secs(60))]);
        let thresholds = build_thresholds(
            vec![hard("memory.available<100Mi"), hard("nodefs.available<10%")],
            vec![hard("memory.available<1Gi")],
            &grace,
            &reclaim,
            true,
        )
        .expect("builds");
        let copies: Vec<&Threshold> = thresholds
            .iter()
            .filter(|t| t.signal == Signal::AllocatableMemoryAvailable)
            .collect();
        // Only the hard one is copied, with its value and minimum reclaim.
        assert_eq!(copies.len(), 1);
        assert_eq!(copies[0].value, ThresholdValue::Quantity(100 * MI));
        assert_eq!(copies[0].min_reclaim, Some(ThresholdValue::Quantity(MI)));
        assert_eq!(copies[0].text, "allocatableMemory.available<100Mi");
        assert!(copies[0].is_hard());

        // Not without enforcement, nor over one the operator set.
        let none = build_thresholds(
            vec![hard("memory.available<100Mi")],
            vec![],
            &BTreeMap::new(),
            &BTreeMap::new(),
            false,
        )
        .expect("builds");
        assert_eq!(none.len(), 1);
        let own = build_thresholds(
            vec![
                hard("memory.available<100Mi"),
                hard("allocatableMemory.available<1Gi"),
            ],
            vec![],
            &BTreeMap::new(),
            &BTreeMap::new(),
            true,
        )
        .expect("builds");
        assert_eq!(own.len(), 2);
    }

    #[test]
    fn defaults_parse() {
        for (signal, value) in DEFAULT_EVICTION_HARD {
            assert!(matches!(parse_threshold(signal, None, value), Ok(Some(_))));
        }
    }
}
