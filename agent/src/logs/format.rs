//! The CRI container log format, as containerd writes it (upstream
//! `pkg/kubelet/kuberuntime/logs/logs.go`, `parseCRILog`): one record per line,
//! `<RFC3339Nano timestamp> <stdout|stderr> <tag> <content>`, where the tag is `F` for a full line
//! or `P` for a partial one (the runtime splits long lines; the rest follows in later records),
//! possibly followed by `:`-separated tags a later CRI may add.
//!
//! [`LineJoiner`] turns records into the lines a reader sees: partial records are joined with what
//! follows until a full one ends the line, and the line carries its first record's timestamp and
//! stream (upstream prefixes only the first fragment of a line with its timestamp, too).

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

/// One line as a reader sees it: the joined content of its records, with its newline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogLine {
    pub timestamp: Timestamp,
    pub stream: Stream,
    /// The content, ending with `\n`.
    pub content: Vec<u8>,
}

impl LogLine {
    /// The line as served: with `timestamps`, prefixed by its RFC 3339 timestamp (nanoseconds,
    /// trailing zeros dropped, as Go's `RFC3339Nano`) and a space.
    pub fn render(&self, timestamps: bool) -> Vec<u8> {
        if !timestamps {
            return self.content.clone();
        }
        let mut out = format!("{} ", self.timestamp).into_bytes();
        out.extend_from_slice(&self.content);
        out
    }
}

/// Joins partial records into lines.
#[derive(Debug, Default)]
pub struct LineJoiner {
    pending: Option<LogLine>,
}

impl LineJoiner {
    /// Adds a record; returns the line it completes, if any.
    pub fn push(&mut self, record: &Record<'_>) -> Option<LogLine> {
        let line = self.pending.get_or_insert_with(|| LogLine {
            timestamp: record.timestamp,
            stream: record.stream,
            content: Vec::new(),
        });
        line.content.extend_from_slice(record.content);
        if record.partial {
            return None;
        }
        let mut line = self.pending.take()?;
        line.content.push(b'\n');
        Some(line)
    }

    /// The partial line still waiting for its end (a container that exited mid-line, or a file
    /// that ends there), as upstream serves it: without a newline.
    pub fn take_pending(&mut self) -> Option<LogLine> {
        self.pending.take()
    }
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

    #[test]
    fn joins_partial_records_into_one_line_with_the_first_timestamp() {
        let mut joiner = LineJoiner::default();
        let lines = [
            "2016-10-06T00:17:09.1Z stdout P hello ",
            "2016-10-06T00:17:09.2Z stdout P big ",
            "2016-10-06T00:17:09.3Z stdout F world",
            "2016-10-06T00:17:10Z stderr F next",
        ];
        let mut out = Vec::new();
        for l in lines {
            let record = parse_record(l.as_bytes()).expect("record");
            out.extend(joiner.push(&record));
        }
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].content, b"hello big world\n");
        assert_eq!(out[0].timestamp, ts("2016-10-06T00:17:09.1Z"));
        assert_eq!(
            out[0].render(true),
            b"2016-10-06T00:17:09.1Z hello big world\n"
        );
        assert_eq!(out[1].stream, Stream::Stderr);
        assert_eq!(out[1].render(false), b"next\n");
        assert_eq!(joiner.take_pending(), None);

        let record = parse_record(b"2016-10-06T00:17:11Z stdout P cut").expect("record");
        assert_eq!(joiner.push(&record), None);
        assert_eq!(
            joiner.take_pending().map(|l| l.content),
            Some(b"cut".to_vec())
        );
    }
}
