//! Object metadata helpers: reading and writing `metadata.*` of a JSON object, the RFC 3339
//! timestamps (second precision, UTC, as `metav1.Time` marshals) and UIDs.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};

/// `metadata.<field>` as a string.
pub fn meta_str<'a>(object: &'a Value, field: &str) -> Option<&'a str> {
    object.get("metadata")?.get(field)?.as_str()
}

/// The object's `metadata` map, created when missing.
pub fn metadata_mut(object: &mut Value) -> Option<&mut Map<String, Value>> {
    let map = object.as_object_mut()?;
    let meta = map
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !meta.is_object() {
        *meta = Value::Object(Map::new());
    }
    meta.as_object_mut()
}

/// Sets `metadata.<field>`, or removes it for `Value::Null`.
pub fn set_meta(object: &mut Value, field: &str, value: Value) {
    if let Some(meta) = metadata_mut(object) {
        if value.is_null() {
            meta.remove(field);
        } else {
            meta.insert(field.to_owned(), value);
        }
    }
}

/// `metadata.finalizers`, empty when unset.
pub fn finalizers(object: &Value) -> Vec<&str> {
    object
        .get("metadata")
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|f| f.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// `metadata.labels` as pairs.
pub fn labels(object: &Value) -> Option<&Map<String, Value>> {
    object.get("metadata")?.get("labels")?.as_object()
}

/// A random RFC 4122 version-4 UID, as upstream's `uuid.NewUUID` gives.
pub fn new_uid() -> String {
    let mut bytes = [0u8; 16];
    for b in &mut bytes {
        *b = fastrand::u8(..);
    }
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex = hex::encode(bytes);
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// Seconds since the epoch now.
pub fn now_seconds() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs()
        .try_into()
        .unwrap_or(i64::MAX)
}

/// `2006-01-02T15:04:05Z` for `seconds` since the epoch (`metav1.Time`'s RFC 3339 form).
pub fn rfc3339(seconds: i64) -> String {
    let days = seconds.div_euclid(86_400);
    let secs = seconds.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        (secs / 60) % 60,
        secs % 60
    )
}

/// Seconds since the epoch of an RFC 3339 time in UTC (`Z`), fractional seconds ignored.
pub fn parse_rfc3339(text: &str) -> Option<i64> {
    let (date, time) = text.split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let time = time.strip_suffix('Z')?;
    let time = time.split('.').next()?;
    let mut t = time.split(':').map(|p| p.parse::<i64>().ok());
    let (h, min, s) = (t.next()??, t.next()??, t.next()??);
    Some(days_from_civil(y, m, day) * 86_400 + h * 3600 + min * 60 + s)
}

/// Howard Hinnant's `civil_from_days`: (year, month, day) of a day count since 1970-01-01.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// The inverse of [`civil_from_days`].
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_round_trip_in_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(parse_rfc3339("2023-11-14T22:13:20Z"), Some(1_700_000_000));
        assert_eq!(
            parse_rfc3339("2023-11-14T22:13:20.123456Z"),
            Some(1_700_000_000)
        );
        assert_eq!(parse_rfc3339("yesterday"), None);
    }

    #[test]
    fn uids_are_version_4() {
        let uid = new_uid();
        assert_eq!(uid.len(), 36);
        assert_eq!(uid.as_bytes()[14], b'4');
        assert_ne!(uid, new_uid());
    }
}
