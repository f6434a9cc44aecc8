//! Durations written as Go writes them (`time.ParseDuration` / `Duration.String`): `1m30s`,
//! `500ms`, `1.5h`, `0`. The kubelet's configuration file uses this syntax (`metav1.Duration`), so
//! swiftlet accepts exactly it, in the file and on the command line.
//!
//! Not here: which durations must be positive (that is the loader's validation). Upstream:
//! Go `time/format.go`, `ParseDuration` and `Duration.String`.

use std::{fmt, str::FromStr, time::Duration};

/// A duration parsed from, and printed in, Go syntax.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GoDuration(pub Duration);

/// Why a duration did not parse. The message matches the config loader's style:
/// `invalid duration "1x": expected e.g. 1m30s`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {input:?}: {reason}")]
pub struct DurationError {
    pub input: String,
    pub reason: DurationErrorReason,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DurationErrorReason {
    #[error("expected e.g. 1m30s")]
    Syntax,
    #[error("must not be negative")]
    Negative,
    #[error("too large (at most 2562047h47m16s)")]
    Overflow,
}

const NANOS_PER_MICRO: u128 = 1_000;
const NANOS_PER_MILLI: u128 = 1_000_000;
const NANOS_PER_SECOND: u128 = 1_000_000_000;
const NANOS_PER_MINUTE: u128 = 60 * NANOS_PER_SECOND;
const NANOS_PER_HOUR: u128 = 60 * NANOS_PER_MINUTE;
/// Go's `time.Duration` is an `int64` of nanoseconds; accepting more would print differently.
const MAX_NANOS: u128 = i64::MAX as u128;
/// Fraction digits past this cannot change an `int64` of nanoseconds; Go drops them too.
const MAX_FRACTION_DIGITS: u32 = 20;

impl GoDuration {
    pub fn as_duration(self) -> Duration {
        self.0
    }
}

impl From<Duration> for GoDuration {
    fn from(d: Duration) -> Self {
        GoDuration(d)
    }
}

impl FromStr for GoDuration {
    type Err = DurationError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        parse_nanos(input)
            .map(|nanos| GoDuration(nanos_to_duration(nanos)))
            .map_err(|reason| DurationError {
                input: input.to_owned(),
                reason,
            })
    }
}

fn nanos_to_duration(nanos: u128) -> Duration {
    // Both parts fit: nanos <= i64::MAX, so seconds < 2^63 and the remainder < 10^9.
    let secs = u64::try_from(nanos / NANOS_PER_SECOND).unwrap_or(u64::MAX);
    let sub = u32::try_from(nanos % NANOS_PER_SECOND).unwrap_or(0);
    Duration::new(secs, sub)
}

fn parse_nanos(input: &str) -> Result<u128, DurationErrorReason> {
    let mut rest = input;
    let negative = if let Some(r) = rest.strip_prefix('-') {
        rest = r;
        true
    } else {
        rest = rest.strip_prefix('+').unwrap_or(rest);
        false
    };
    // Go accepts a bare zero without a unit, and only that.
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err(DurationErrorReason::Syntax);
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let (component, tail) = parse_component(rest)?;
        total = total
            .checked_add(component)
            .filter(|t| *t <= MAX_NANOS)
            .ok_or(DurationErrorReason::Overflow)?;
        rest = tail;
    }
    if negative && total != 0 {
        return Err(DurationErrorReason::Negative);
    }
    Ok(total)
}

/// One `<number><unit>` component; returns its nanoseconds and the rest of the input.
fn parse_component(input: &str) -> Result<(u128, &str), DurationErrorReason> {
    let int_len = input.bytes().take_while(u8::is_ascii_digit).count();
    let (int_digits, rest) = input.split_at(int_len);
    let (frac_digits, rest) = match rest.strip_prefix('.') {
        Some(after_dot) => {
            let len = after_dot.bytes().take_while(u8::is_ascii_digit).count();
            after_dot.split_at(len)
        }
        None => ("", rest),
    };
    if int_digits.is_empty() && frac_digits.is_empty() {
        return Err(DurationErrorReason::Syntax);
    }
    let unit_len = rest
        .char_indices()
        .find(|(_, c)| c.is_ascii_digit() || *c == '.')
        .map_or(rest.len(), |(i, _)| i);
    let (unit, rest) = rest.split_at(unit_len);
    let unit_nanos = match unit {
        "ns" => 1,
        // U+00B5 (micro sign) and U+03BC (Greek mu), as Go accepts both.
        "us" | "\u{b5}s" | "\u{3bc}s" => NANOS_PER_MICRO,
        "ms" => NANOS_PER_MILLI,
        "s" => NANOS_PER_SECOND,
        "m" => NANOS_PER_MINUTE,
        "h" => NANOS_PER_HOUR,
        _ => return Err(DurationErrorReason::Syntax),
    };
    let int: u128 = if int_digits.is_empty() {
        0
    } else {
        int_digits
            .parse()
            .map_err(|_| DurationErrorReason::Overflow)?
    };
    let mut nanos = int
        .checked_mul(unit_nanos)
        .ok_or(DurationErrorReason::Overflow)?;
    let kept = &frac_digits[..frac_digits.len().min(MAX_FRACTION_DIGITS as usize)];
    if !kept.is_empty() {
        let frac: u128 = kept.parse().map_err(|_| DurationErrorReason::Syntax)?;
        let scale = 10u128.pow(u32::try_from(kept.len()).unwrap_or(MAX_FRACTION_DIGITS));
        // Truncates below a nanosecond, as Go does.
        nanos = nanos
            .checked_add(frac.saturating_mul(unit_nanos) / scale)
            .ok_or(DurationErrorReason::Overflow)?;
    }
    Ok((nanos, rest))
}

/// As upstream's `metav1.Duration` in a file: a string in Go syntax (a bare number is not one).
impl<'de> serde::Deserialize<'de> for GoDuration {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for GoDuration {
    /// Go's `Duration.String`: `0s`, `1.5ms`, `1m0s`, `2h0m0s`, `1h2m3.5s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nanos = self.0.as_nanos();
        if nanos == 0 {
            return f.write_str("0s");
        }
        if nanos < NANOS_PER_SECOND {
            let (unit, per) = if nanos < NANOS_PER_MICRO {
                ("ns", 1)
            } else if nanos < NANOS_PER_MILLI {
                ("\u{b5}s", NANOS_PER_MICRO)
            } else {
                ("ms", NANOS_PER_MILLI)
            };
            write_decimal(f, nanos / per, nanos % per, per)?;
            return f.write_str(unit);
        }
        let hours = nanos / NANOS_PER_HOUR;
        let minutes = (nanos % NANOS_PER_HOUR) / NANOS_PER_MINUTE;
        let secs = nanos % NANOS_PER_MINUTE;
        if hours > 0 {
            write!(f, "{hours}h")?;
        }
        if hours > 0 || minutes > 0 {
            write!(f, "{minutes}m")?;
        }
        write_decimal(
            f,
            secs / NANOS_PER_SECOND,
            secs % NANOS_PER_SECOND,
            NANOS_PER_SECOND,
        )?;
        f.write_str("s")
    }
}

/// `whole.fraction` with the fraction's trailing zeros (and a bare dot) removed.
fn write_decimal(f: &mut fmt::Formatter<'_>, whole: u128, frac: u128, per: u128) -> fmt::Result {
    write!(f, "{whole}")?;
    if frac == 0 {
        return Ok(());
    }
    let width = per.ilog10() as usize;
    let digits = format!("{frac:0width$}");
    write!(f, ".{}", digits.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Duration, DurationErrorReason> {
        s.parse::<GoDuration>().map(|d| d.0).map_err(|e| e.reason)
    }

    #[test]
    fn parses_go_syntax() {
        let cases = [
            ("0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("-0", Duration::ZERO),
            ("1m", Duration::from_secs(60)),
            ("1m30s", Duration::from_secs(90)),
            ("2h", Duration::from_secs(7200)),
            ("500ms", Duration::from_millis(500)),
            ("1.5h", Duration::from_secs(5400)),
            (".5s", Duration::from_millis(500)),
            ("1.s", Duration::from_secs(1)),
            ("+20s", Duration::from_secs(20)),
            ("300us", Duration::from_micros(300)),
            ("300\u{b5}s", Duration::from_micros(300)),
            ("300\u{3bc}s", Duration::from_micros(300)),
            ("7ns", Duration::from_nanos(7)),
            ("1h1m1s1ms", Duration::from_millis(3_661_001)),
            ("1.0000000001s", Duration::from_secs(1)),
        ];
        for (input, want) in cases {
            assert_eq!(parse(input), Ok(want), "{input}");
        }
    }

    #[test]
    fn rejects_bad_input() {
        let cases = [
            ("", DurationErrorReason::Syntax),
            ("1x", DurationErrorReason::Syntax),
            ("1", DurationErrorReason::Syntax),
            ("s", DurationErrorReason::Syntax),
            (".s", DurationErrorReason::Syntax),
            ("1m 30s", DurationErrorReason::Syntax),
            ("1M", DurationErrorReason::Syntax),
            ("-1s", DurationErrorReason::Negative),
            ("3000000h", DurationErrorReason::Overflow),
        ];
        for (input, want) in cases {
            assert_eq!(parse(input), Err(want), "{input}");
        }
    }

    #[test]
    fn error_names_the_input_and_an_example() {
        let err = "1x".parse::<GoDuration>().err().map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("invalid duration \"1x\": expected e.g. 1m30s")
        );
    }

    #[test]
    fn prints_like_go() {
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(7), "7ns"),
            (Duration::from_micros(300), "300\u{b5}s"),
            (Duration::from_micros(1500), "1.5ms"),
            (Duration::from_millis(500), "500ms"),
            (Duration::from_secs(1), "1s"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::from_secs(60), "1m0s"),
            (Duration::from_secs(90), "1m30s"),
            (Duration::from_secs(7200), "2h0m0s"),
            (Duration::from_millis(3_723_500), "1h2m3.5s"),
        ];
        for (d, want) in cases {
            assert_eq!(GoDuration(d).to_string(), want);
            // What Go prints, Go parses back to the same value.
            assert_eq!(parse(want), Ok(d), "{want}");
        }
    }
}
