//! Kubernetes resource quantities (`"100m"`, `"1"`, `"128Mi"`, `"1G"`, `"1e3"`), parsed exactly
//! to nano-units (upstream `k8s.io/apimachinery/pkg/api/resource.Quantity`, whose finest scale is
//! also nano). k8s-openapi's `Quantity` is only the string; this gives it a value.
//!
//! Grammar, as upstream: `[+-]<digits>[.<digits>]` then one suffix: binary (`Ki` `Mi` `Gi` `Ti`
//! `Pi` `Ei`), decimal (`n` `u` `m` `` `k` `M` `G` `T` `P` `E`) or a decimal exponent (`e3`,
//! `E-2`). Digits finer than a nano-unit round up (away from zero), as upstream rounds up.

use std::fmt;

/// Why a quantity string was rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuantityErrorKind {
    #[error("empty")]
    Empty,
    #[error("no digits")]
    NoDigits,
    #[error("unknown suffix {0:?}")]
    UnknownSuffix(String),
    #[error("out of range")]
    OutOfRange,
}

/// A quantity that could not be parsed, naming the value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid quantity {value:?}: {kind}")]
pub struct QuantityError {
    pub value: String,
    pub kind: QuantityErrorKind,
}

/// A parsed quantity, exact to 10⁻⁹ units.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Quantity {
    nanos: i128,
}

const NANO: i128 = 1_000_000_000;

impl Quantity {
    /// Parses a quantity string such as `"250m"` or `"1.5Gi"`.
    pub fn parse(s: &str) -> Result<Self, QuantityError> {
        parse_nanos(s)
            .map(|nanos| Quantity { nanos })
            .map_err(|kind| QuantityError {
                value: s.to_owned(),
                kind,
            })
    }

    /// The value in nano-units.
    pub fn nanos(&self) -> i128 {
        self.nanos
    }

    pub fn is_zero(&self) -> bool {
        self.nanos == 0
    }

    /// Whole units, rounded up (upstream `Value()`: bytes for memory), saturating at `i64`.
    pub fn value(&self) -> i64 {
        saturate(div_ceil(self.nanos, NANO))
    }

    /// Thousandths, rounded up (upstream `MilliValue()`: millicores for CPU).
    pub fn milli_value(&self) -> i64 {
        saturate(div_ceil(self.nanos, NANO / 1000))
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (units, frac) = (self.nanos / NANO, (self.nanos % NANO).abs());
        if frac == 0 {
            write!(f, "{units}")
        } else {
            let sign = if self.nanos < 0 && units == 0 {
                "-"
            } else {
                ""
            };
            let digits = format!("{frac:09}");
            write!(f, "{sign}{units}.{}", digits.trim_end_matches('0'))
        }
    }
}

/// CPU in millicores from a quantity string (`"100m"` → 100, `"1"` → 1000).
pub fn cpu_millis(s: &str) -> Result<i64, QuantityError> {
    Quantity::parse(s).map(|q| q.milli_value())
}

/// Memory in bytes from a quantity string (`"128Mi"` → 134217728, `"1G"` → 10⁹).
pub fn memory_bytes(s: &str) -> Result<i64, QuantityError> {
    Quantity::parse(s).map(|q| q.value())
}

fn parse_nanos(s: &str) -> Result<i128, QuantityErrorKind> {
    if s.is_empty() {
        return Err(QuantityErrorKind::Empty);
    }
    let (negative, rest) = match s.as_bytes()[0] {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let number_len = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(number_len);
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && frac.is_empty() || frac.contains('.') {
        return Err(QuantityErrorKind::NoDigits);
    }
    // The digits as one integer, scaled down by 10^frac_digits below.
    let mut mantissa: i128 = 0;
    for d in whole.bytes().chain(frac.bytes()) {
        mantissa = mantissa
            .checked_mul(10)
            .and_then(|m| m.checked_add(i128::from(d - b'0')))
            .ok_or(QuantityErrorKind::OutOfRange)?;
    }
    let frac_digits = i32::try_from(frac.len()).map_err(|_| QuantityErrorKind::OutOfRange)?;
    let (factor, exp10) = scale(suffix)?;
    // value = mantissa * factor * 10^(exp10 - frac_digits), in nanos: one more 10^9.
    let scaled = mantissa
        .checked_mul(factor)
        .ok_or(QuantityErrorKind::OutOfRange)?;
    let nanos = shift10(scaled, exp10 - frac_digits + 9)?;
    Ok(if negative { -nanos } else { nanos })
}

/// The suffix as (binary factor, decimal exponent).
fn scale(suffix: &str) -> Result<(i128, i32), QuantityErrorKind> {
    let binary = |power: u32| Ok((1_i128 << power, 0));
    match suffix {
        "Ki" => binary(10),
        "Mi" => binary(20),
        "Gi" => binary(30),
        "Ti" => binary(40),
        "Pi" => binary(50),
        "Ei" => binary(60),
        "n" => Ok((1, -9)),
        "u" => Ok((1, -6)),
        "m" => Ok((1, -3)),
        "" => Ok((1, 0)),
        "k" => Ok((1, 3)),
        "M" => Ok((1, 6)),
        "G" => Ok((1, 9)),
        "T" => Ok((1, 12)),
        "P" => Ok((1, 15)),
        "E" => Ok((1, 18)),
        _ => {
            let exponent = suffix
                .strip_prefix(['e', 'E'])
                .filter(|e| !e.is_empty())
                .and_then(|e| e.parse::<i32>().ok())
                .ok_or_else(|| QuantityErrorKind::UnknownSuffix(suffix.to_owned()))?;
            Ok((1, exponent))
        }
    }
}

/// `value * 10^exp`, rounding up in magnitude when `exp` is negative.
fn shift10(value: i128, exp: i32) -> Result<i128, QuantityErrorKind> {
    if exp >= 0 {
        let factor = 10_i128
            .checked_pow(exp.unsigned_abs())
            .ok_or(QuantityErrorKind::OutOfRange)?;
        value
            .checked_mul(factor)
            .ok_or(QuantityErrorKind::OutOfRange)
    } else {
        Ok(match 10_i128.checked_pow(exp.unsigned_abs()) {
            Some(divisor) => div_ceil(value, divisor),
            // Smaller than any representable amount: one nano-unit if anything at all.
            None => i128::from(value != 0),
        })
    }
}

/// Division rounding up in magnitude (the values here are non-negative until the sign is applied).
fn div_ceil(value: i128, divisor: i128) -> i128 {
    let q = value / divisor;
    if value % divisor == 0 {
        q
    } else {
        q + value.signum()
    }
}

fn saturate(v: i128) -> i64 {
    i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_like_the_api_server() {
        let cases: &[(&str, i64, i64)] = &[
            // (quantity, value rounded up, milli value)
            ("0", 0, 0),
            ("1", 1, 1000),
            ("100m", 1, 100),
            ("1500m", 2, 1500),
            ("0.5", 1, 500),
            ("2.25", 3, 2250),
            (".5", 1, 500),
            ("1.", 1, 1000),
            ("+3", 3, 3000),
            ("1k", 1000, 1_000_000),
            ("1G", 1_000_000_000, 1_000_000_000_000),
            ("1Ki", 1024, 1_024_000),
            ("128Mi", 134_217_728, 134_217_728_000),
            ("1.5Gi", 1_610_612_736, 1_610_612_736_000),
            ("1Ei", 1 << 60, i64::MAX),
            ("1e3", 1000, 1_000_000),
            ("1E3", 1000, 1_000_000),
            ("1E", 1_000_000_000_000_000_000, i64::MAX),
            ("5e-3", 1, 5),
            ("1n", 1, 1),
            ("250u", 1, 1),
            ("1e-12", 1, 1),
            ("-1", -1, -1000),
        ];
        for &(s, value, milli) in cases {
            let q = Quantity::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"));
            assert_eq!((q.value(), q.milli_value()), (value, milli), "{s}");
        }
        assert_eq!(cpu_millis("250m"), Ok(250));
        assert_eq!(memory_bytes("64Mi"), Ok(64 << 20));
        assert_eq!(Quantity::parse("1e-12").unwrap().nanos(), 1);
    }

    #[test]
    fn rejects_with_the_bad_value_named() {
        let cases: &[(&str, QuantityErrorKind)] = &[
            ("", QuantityErrorKind::Empty),
            ("Mi", QuantityErrorKind::NoDigits),
            ("-", QuantityErrorKind::NoDigits),
            ("1.2.3", QuantityErrorKind::NoDigits),
            ("12x", QuantityErrorKind::UnknownSuffix("x".into())),
            ("1 Mi", QuantityErrorKind::UnknownSuffix(" Mi".into())),
            ("1mi", QuantityErrorKind::UnknownSuffix("mi".into())),
            ("1e", QuantityErrorKind::UnknownSuffix("e".into())),
            ("1e99", QuantityErrorKind::OutOfRange),
            (
                "99999999999999999999999999999999999999999",
                QuantityErrorKind::OutOfRange,
            ),
        ];
        for (s, kind) in cases {
            let err = Quantity::parse(s).unwrap_err();
            assert_eq!(&err.kind, kind, "{s}");
            assert_eq!(err.value, *s);
        }
        assert_eq!(
            memory_bytes("12x").unwrap_err().to_string(),
            "invalid quantity \"12x\": unknown suffix \"x\""
        );
    }

    #[test]
    fn equal_amounts_compare_equal() {
        let q = |s| Quantity::parse(s).unwrap();
        assert_eq!(q("1"), q("1000m"));
        assert_eq!(q("1Ki"), q("1024"));
        assert_eq!(q("1e3"), q("1k"));
        assert!(q("100m") < q("0.2"));
        assert_eq!(q("1.5").to_string(), "1.5");
        assert_eq!(q("2k").to_string(), "2000");
    }
}
