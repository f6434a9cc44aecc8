//! The CRI container log format, as containerd writes it (upstream
//! `pkg/kubelet/kuberuntime/logs/logs.go`, `parseCRILog`): one record per line,
//! `<RFC3339Nano timestamp> <stdout|stderr> <tag> <content>`, where the tag is `F` for a full line
//! or `P` for a partial one (the runtime splits long lines; the rest follows in later records),
//! possibly followed by `:`-separated tags a later CRI may add.
//!
//! A reader joins partial records with what follows until a full one ends the line; the line
//! carries its first record's timestamp (`read.rs`; upstream prefixes only the first fragment of
//! a line with its timestamp, too).

use jiff::Timestamp;
use k8s_openapi::jiff;

/// The stream a record came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// One record of a CRI log file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record<'a> {
    pub timestamp: Timestamp,
    pub stream: Stream,
    /// A `P` record: the line goes on in the next record.
    pub partial: bool,
    /// The content without the record's line ending.
    pub content: &'a [u8],
}

/// Why a line is not a CRI log record (upstream's messages).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("timestamp is not found")]
    NoTimestamp,
    #[error("unexpected timestamp format: {0}")]
    Timestamp(String),
    #[error("stream type is not found")]
    NoStream,
    #[error("unexpected stream type {0:?}")]
    Stream(String),
    #[error("log tag is not found")]
    NoTag,
}

/// Parses one line of a CRI log file (with or without its `\n`).
pub fn parse_record(line: &[u8]) -> Result<Record<'_>, ParseError> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let (timestamp, rest) = split_field(line).ok_or(ParseError::NoTimestamp)?;
    let timestamp = std::str::from_utf8(timestamp)
        .map_err(|e| ParseError::Timestamp(e.to_string()))?
        .parse::<Timestamp>()
        .map_err(|e| ParseError::Timestamp(e.to_string()))?;
    let (stream, rest) = split_field(rest).ok_or(ParseError::NoStream)?;
    let stream = match stream {
        b"stdout" => Stream::Stdout,
        b"stderr" => Stream::Stderr,
        other => {
            return Err(ParseError::Stream(
                String::from_utf8_lossy(other).into_owned(),
            ));
        }
    };
    let (tags, content) = split_field(rest).ok_or(ParseError::NoTag)?;
    // Forward compatible: only the first tag says whether the line is partial.
    let partial = tags.split(|b| *b == b':').next() == Some(b"P".as_slice());
    Ok(Record {
        timestamp,
        stream,
        partial,
        content,
    })
}

/// The bytes before the first space, and those after it.
fn split_field(s: &[u8]) -> Option<(&[u8], &[u8])> {
    let at = s.iter().position(|b| *b == b' ')?;
    Some((&s[..at], &s[at + 1..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn parses_full_and_partial_records() {
        let r = parse_record(b"2016-10-06T00:17:09.669794202Z stdout F log content 1\n")
            .expect("full record");
        assert_eq!(r.timestamp, ts("2016-10-06T00:17:09.669794202Z"));
        assert_eq!(r.stream, Stream::Stdout);
        assert!(!r.partial);
        assert_eq!(r.content, b"log content 1");

        let r = parse_record(b"2016-10-06T00:17:09.669794203Z stderr P:x part").expect("partial");
        assert_eq!(r.stream, Stream::Stderr);
        assert!(r.partial);
        assert_eq!(r.content, b"part");

        // An empty line is a full record with no content.
        let r = parse_record(b"2016-10-06T00:17:09Z stdout F \n").expect("empty content");
        assert_eq!(r.content, b"");
    }

    #[test]
    fn rejects_what_is_not_a_record() {
        assert_eq!(parse_record(b"nonsense"), Err(ParseError::NoTimestamp));
        assert!(matches!(
            parse_record(b"yesterday stdout F x"),
            Err(ParseError::Timestamp(_))
        ));
        assert_eq!(
            parse_record(b"2016-10-06T00:17:09Z stdin F x"),
            Err(ParseError::Stream("stdin".into()))
        );
        assert_eq!(
            parse_record(b"2016-10-06T00:17:09Z stdout"),
            Err(ParseError::NoStream)
        );
        assert_eq!(
            parse_record(b"2016-10-06T00:17:09Z stdout F"),
            Err(ParseError::NoTag)
        );
    }
}
