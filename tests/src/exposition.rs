//! A strict reader of the Prometheus text exposition format (0.0.4) for tests of the agent's
//! metrics endpoints: every sample's family declared by `# TYPE` before it and only once, metric
//! and label names valid, label values unescaped (`\\`, `\"`, `\n` only), a float value and an
//! optional integer timestamp. Anything else is an error naming the line.

use std::collections::BTreeMap;

/// One sample line.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
    /// Milliseconds since the epoch, when the line has one.
    pub timestamp_ms: Option<i64>,
}

impl Sample {
    /// The value of label `name`, "" when absent.
    pub fn label(&self, name: &str) -> &str {
        self.labels.get(name).map_or("", String::as_str)
    }
}

fn valid_name(name: &str, colon: bool) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || (colon && c == ':'))
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || (colon && c == ':'))
}

/// The samples of `text`, or the first line that is not valid exposition format.
pub fn parse(text: &str) -> Result<Vec<Sample>, String> {
    let mut typed: Vec<String> = Vec::new();
    let mut samples = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let bad = |why: &str| format!("line {}: {why}: {line:?}", n + 1);
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest
                .split_once(' ')
                .ok_or_else(|| bad("TYPE without a type"))?;
            if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind) {
                return Err(bad("unknown type"));
            }
            if typed.iter().any(|t| t == name) {
                return Err(bad("family typed twice"));
            }
            typed.push(name.to_owned());
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let end = line.find(['{', ' ']).ok_or_else(|| bad("no value"))?;
        let name = &line[..end];
        if !valid_name(name, true) {
            return Err(bad("bad metric name"));
        }
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .filter(|f| typed.iter().any(|t| t == f))
            .unwrap_or(name);
        if !typed.iter().any(|t| t == family) {
            return Err(bad("sample before its TYPE"));
        }
        let mut labels = BTreeMap::new();
        let mut rest = &line[end..];
        if let Some(mut inner) = rest.strip_prefix('{') {
            loop {
                if let Some(after) = inner.strip_prefix('}') {
                    rest = after;
                    break;
                }
                inner = inner.strip_prefix(',').unwrap_or(inner);
                let (key, after) = inner
                    .split_once("=\"")
                    .ok_or_else(|| bad("label without =\""))?;
                if !valid_name(key, false) {
                    return Err(bad("bad label name"));
                }
                let mut value = String::new();
                let mut chars = after.char_indices();
                let close = loop {
                    let (i, c) = chars.next().ok_or_else(|| bad("unclosed label value"))?;
                    match c {
                        '\\' => match chars.next().map(|(_, c)| c) {
                            Some('n') => value.push('\n'),
                            Some(c @ ('\\' | '"')) => value.push(c),
                            _ => return Err(bad("bad escape")),
                        },
                        '"' => break i,
                        c => value.push(c),
                    }
                };
                if labels.insert(key.to_owned(), value).is_some() {
                    return Err(bad("label given twice"));
                }
                inner = &after[close + 1..];
            }
        }
        let mut fields = rest.split_whitespace();
        let value = fields
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .ok_or_else(|| bad("value is not a float"))?;
        let timestamp_ms = match fields.next() {
            Some(t) => Some(t.parse().map_err(|_| bad("bad timestamp"))?),
            None => None,
        };
        if fields.next().is_some() {
            return Err(bad("trailing text"));
        }
        samples.push(Sample {
            name: name.to_owned(),
            labels,
            value,
            timestamp_ms,
        });
    }
    Ok(samples)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaped_values_come_back_and_broken_lines_are_refused() {
        let text = "# TYPE m gauge\nm{a=\"x\\\"y\\\\z\\nw\",b=\"\"} 1.5 1700000000000\nm 2\n";
        let samples = parse(text).expect("valid");
        assert_eq!(samples.len(), 2);
        assert_eq!(samples[0].label("a"), "x\"y\\z\nw");
        assert_eq!(samples[0].timestamp_ms, Some(1_700_000_000_000));
        assert_eq!(samples[1].value, 2.0);
        for broken in [
            "m 1\n",
            "# TYPE m gauge\nm{a=\"x} 1\n",
            "# TYPE m gauge\nm{a=\"\\t\"} 1\n",
            "# TYPE m gauge\nm one\n",
            "# TYPE m gauge\nm 1 2 3\n",
        ] {
            assert!(parse(broken).is_err(), "{broken:?}");
        }
    }
}
