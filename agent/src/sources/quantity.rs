//! Resource quantities (`500m`, `128Mi`, `1e3`, `2`) as Kubernetes writes them: a grammar check
//! and an approximate value for comparisons such as "request ≤ limit". Upstream:
//! `staging/src/k8s.io/apimachinery/pkg/api/resource/quantity.go` (`ParseQuantity`).
//!
//! Not here: exact arithmetic or canonical printing; a float is precise enough to validate.

/// Why a quantity did not parse.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error(
        "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
    )]
    Format,
    #[error("unable to parse quantity's suffix")]
    Suffix,
}

/// Parses a quantity and returns its value (in base units: cores, bytes, ...).
pub fn parse_quantity(input: &str) -> Result<f64, QuantityError> {
    let (negative, rest) = match input.as_bytes().first() {
        Some(b'-') => (true, &input[1..]),
        Some(b'+') => (false, &input[1..]),
        _ => (false, input),
    };
    let number_len = rest
        .bytes()
        .take_while(|b| b.is_ascii_digit() || *b == b'.')
        .count();
    let (number, suffix) = rest.split_at(number_len);
    // One dot at most and at least one digit: `5`, `5.`, `.5`, `5.5`.
    if number.bytes().filter(|b| *b == b'.').count() > 1
        || !number.bytes().any(|b| b.is_ascii_digit())
    {
        return Err(QuantityError::Format);
    }
    let value: f64 = number.parse().map_err(|_| QuantityError::Format)?;
    let multiplier = suffix_multiplier(suffix)?;
    let value = value * multiplier;
    Ok(if negative { -value } else { value })
}

fn suffix_multiplier(suffix: &str) -> Result<f64, QuantityError> {
    let binary = |power: i32| Ok(2f64.powi(power));
    let decimal = |power: i32| Ok(10f64.powi(power));
    match suffix {
        "" => decimal(0),
        "n" => decimal(-9),
        "u" => decimal(-6),
        "m" => decimal(-3),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        "Ki" => binary(10),
        "Mi" => binary(20),
        "Gi" => binary(30),
        "Ti" => binary(40),
        "Pi" => binary(50),
        "Ei" => binary(60),
        _ => {
            // A decimal exponent: `e3`, `E-2`, `e+6`.
            let exponent = suffix
                .strip_prefix('e')
                .or_else(|| suffix.strip_prefix('E'))
                .ok_or(QuantityError::Suffix)?;
            let digits = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(QuantityError::Suffix);
            }
            let power: i32 = exponent.parse().map_err(|_| QuantityError::Suffix)?;
            decimal(power)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_grammar() {
        let cases = [
            ("1", 1.0),
            ("500m", 0.5),
            ("0.5", 0.5),
            (".5", 0.5),
            ("5.", 5.0),
            ("+2", 2.0),
            ("-2", -2.0),
            ("128Mi", 134_217_728.0),
            ("1Gi", 1_073_741_824.0),
            ("1G", 1e9),
            ("2k", 2000.0),
            ("1e3", 1000.0),
            ("1E-3", 0.001),
            ("100n", 1e-7),
        ];
        for (input, want) in cases {
            let got = parse_quantity(input).expect(input);
            assert!(
                (got - want).abs() <= want.abs() * 1e-12,
                "{input}: {got} != {want}"
            );
        }
    }

    #[test]
    fn rejects_what_kubernetes_rejects() {
        for input in [
            "", "m", "1x", "1 Gi", "1.2.3", "1K", "1Gb", "1e", "1e+", "abc", "--1",
        ] {
            assert!(parse_quantity(input).is_err(), "{input}");
        }
    }
}
