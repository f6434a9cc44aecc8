//! Go durations (`time.ParseDuration`: `12h`, `1m30s`, `0.5s`, `0`) as the provider config's
//! `defaultCacheDuration` and a response's `cacheDuration` are written. Its own small parser:
//! `crate::config`'s imports `kuberuntime`, which must not import it back.

use std::time::Duration;

/// Why a duration did not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("must not be negative")]
    Negative,
    #[error("not a duration, e.g. 1m30s")]
    Syntax,
}

/// Parses `text` as Go does; a negative duration is [`DurationError::Negative`].
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    let rest = text.strip_prefix('+').unwrap_or(text);
    if let Some(negative) = rest.strip_prefix('-') {
        parse(negative)?;
        return Err(DurationError::Negative);
    }
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(DurationError::Syntax);
    }
    let mut total = 0_f64;
    let mut rest = rest;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or(DurationError::Syntax)?;
        let number: f64 = rest[..number_len]
            .parse()
            .map_err(|_| DurationError::Syntax)?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(DurationError::Syntax),
        };
        rest = &rest[unit_len..];
        total += number * seconds;
    }
    Duration::try_from_secs_f64(total).map_err(|_| DurationError::Syntax)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_parse() {
        assert_eq!(parse("12h"), Ok(Duration::from_secs(12 * 3600)));
        assert_eq!(parse("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("-1m"), Err(DurationError::Negative));
        for bad in ["", "1", "1x", "m", "1.2.3s"] {
            assert_eq!(parse(bad), Err(DurationError::Syntax), "{bad}");
        }
    }
}
