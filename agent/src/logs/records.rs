//! CRI log records read as a stream of bytes, never whole: [`RecordParser`] takes a file's bytes
//! in chunks of any size and hands out each record's header once it is complete (at most
//! [`MAX_HEADER`] bytes are held for it), then its content as it goes by, then its end. A record
//! of 100 MiB (a runtime that does not split long lines) costs the same memory as one of ten
//! bytes.
//!
//! A record whose header does not parse (or is longer than [`MAX_HEADER`]) is skipped to its
//! newline and counted, as upstream skips a line it cannot parse.
//!
//! Not here: the format of one header (`format.rs`), what a reader makes of the pieces
//! (`read.rs`).

use k8s_openapi::jiff::Timestamp;

use super::format::{ParseError, Stream, parse_record};

/// The most bytes of a record held while its header is incomplete: an RFC 3339 timestamp, a
/// stream name and the tags fit many times over.
pub const MAX_HEADER: usize = 1024;

/// What a record's header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub timestamp: Timestamp,
    pub stream: Stream,
    /// The line goes on in the next record.
    pub partial: bool,
}

/// One piece of the records in a chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Piece<'a> {
    /// A record begins (its content follows).
    Start(Header),
    /// Some of the current record's content.
    Content(&'a [u8]),
    /// The current record's newline.
    End,
}

#[derive(Debug)]
enum State {
    /// Collecting a record's header.
    Header(Vec<u8>),
    /// In a record's content.
    Content { partial: bool },
    /// In a record that did not parse, until its newline.
    Skip,
}

/// The parser's state between chunks.
#[derive(Debug)]
pub struct RecordParser {
    state: State,
    /// Records skipped because they did not parse, and the first reason.
    pub skipped: u64,
    pub first_error: Option<ParseError>,
}

impl Default for RecordParser {
    fn default() -> Self {
        RecordParser {
            state: State::Header(Vec::new()),
            skipped: 0,
            first_error: None,
        }
    }
}

impl RecordParser {
    /// Back to the start of a record (a new file begins with one).
    pub fn reset(&mut self) {
        self.state = State::Header(Vec::new());
    }

    /// Whether the parser is inside a full (`F`) record's content: the file ended before its
    /// newline.
    pub fn in_full_record(&self) -> bool {
        matches!(self.state, State::Content { partial: false })
    }

    fn skip(&mut self, error: ParseError) {
        self.skipped += 1;
        self.first_error.get_or_insert(error);
    }

    /// Parses `chunk`, appending its pieces to `pieces` (cleared first).
    pub fn feed<'a>(&mut self, mut chunk: &'a [u8], pieces: &mut Vec<Piece<'a>>) {
        pieces.clear();
        while !chunk.is_empty() {
            match &mut self.state {
                State::Content { .. } => match memchr::memchr(b'\n', chunk) {
                    Some(at) => {
                        if at > 0 {
                            pieces.push(Piece::Content(&chunk[..at]));
                        }
                        pieces.push(Piece::End);
                        self.state = State::Header(Vec::new());
                        chunk = &chunk[at + 1..];
                    }
                    None => {
                        pieces.push(Piece::Content(chunk));
                        chunk = &[];
                    }
                },
                State::Skip => match memchr::memchr(b'\n', chunk) {
                    Some(at) => {
                        self.state = State::Header(Vec::new());
                        chunk = &chunk[at + 1..];
                    }
                    None => chunk = &[],
                },
                State::Header(header) => {
                    let spaces_before = header.iter().filter(|b| **b == b' ').count();
                    // The header ends at its third space (after timestamp, stream and tags), or
                    // the record ends at a newline before that.
                    let mut spaces = spaces_before;
                    let mut cut = None;
                    for (i, b) in chunk.iter().enumerate() {
                        if *b == b'\n' {
                            cut = Some((i, true));
                            break;
                        }
                        if *b == b' ' {
                            spaces += 1;
                            if spaces == 3 {
                                cut = Some((i, false));
                                break;
                            }
                        }
                    }
                    let take = cut.map_or(chunk.len(), |(i, _)| i + 1);
                    if header.len() + take > MAX_HEADER {
                        self.skip(ParseError::Timestamp(format!(
                            "no header within the first {MAX_HEADER} bytes"
                        )));
                        let ended = cut.is_some_and(|(_, newline)| newline);
                        self.state = if ended {
                            State::Header(Vec::new())
                        } else {
                            State::Skip
                        };
                        chunk = &chunk[take..];
                        continue;
                    }
                    header.extend_from_slice(&chunk[..take]);
                    chunk = &chunk[take..];
                    match cut {
                        None => {}
                        Some((_, true)) => {
                            // A whole record without content: "ts stream F\n" and the like.
                            match parse_record(header) {
                                Ok(record) => {
                                    pieces.push(Piece::Start(Header {
                                        timestamp: record.timestamp,
                                        stream: record.stream,
                                        partial: record.partial,
                                    }));
                                    pieces.push(Piece::End);
                                }
                                Err(e) => self.skip(e),
                            }
                            self.state = State::Header(Vec::new());
                        }
                        Some((_, false)) => match parse_record(header) {
                            Ok(record) => {
                                pieces.push(Piece::Start(Header {
                                    timestamp: record.timestamp,
                                    stream: record.stream,
                                    partial: record.partial,
                                }));
                                self.state = State::Content {
                                    partial: record.partial,
                                };
                            }
                            Err(e) => {
                                self.skip(e);
                                self.state = State::Skip;
                            }
                        },
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// All pieces of `input` fed in chunks of `size`, content pieces merged.
    fn pieces(input: &[u8], size: usize) -> (Vec<String>, u64) {
        let mut parser = RecordParser::default();
        let mut out: Vec<String> = Vec::new();
        let mut buf = Vec::new();
        for chunk in input.chunks(size) {
            parser.feed(chunk, &mut buf);
            for piece in &buf {
                match piece {
                    Piece::Start(h) => out.push(format!(
                        "start {} {:?} {}",
                        h.timestamp,
                        h.stream,
                        if h.partial { "P" } else { "F" }
                    )),
                    Piece::Content(c) => {
                        let text = String::from_utf8_lossy(c).into_owned();
                        match out.last_mut() {
                            Some(last) if last.starts_with("content ") => last.push_str(&text),
                            _ => out.push(format!("content {text}")),
                        }
                    }
                    Piece::End => out.push("end".into()),
                }
            }
        }
        (out, parser.skipped)
    }

    #[test]
    fn records_come_out_the_same_whatever_the_chunking() {
        let input = b"2024-05-01T10:00:01.5Z stdout P hel\n\
                      garbage\n\
                      2024-05-01T10:00:02.5Z stderr F lo world\n\
                      2024-05-01T10:00:03Z stdout F \n\
                      2024-05-01T10:00:04Z stdout F\n\
                      2024-05-01T10:00:05Z stdout F unterminated";
        let want = vec![
            "start 2024-05-01T10:00:01.5Z Stdout P",
            "content hel",
            "end",
            "start 2024-05-01T10:00:02.5Z Stderr F",
            "content lo world",
            "end",
            "start 2024-05-01T10:00:03Z Stdout F",
            "end",
            "start 2024-05-01T10:00:05Z Stdout F",
            "content unterminated",
        ];
        for size in [1, 2, 3, 7, 16, 1000] {
            let (got, skipped) = pieces(input, size);
            assert_eq!(got, want, "chunks of {size}");
            // "garbage" and the tag without its space.
            assert_eq!(skipped, 2, "chunks of {size}");
        }
    }

    #[test]
    fn a_header_longer_than_the_bound_is_skipped_not_held() {
        let mut input = vec![b'x'; 10 * MAX_HEADER];
        input.extend_from_slice(b"\n2024-05-01T10:00:01Z stdout F ok\n");
        let (got, skipped) = pieces(&input, 333);
        assert_eq!(
            got,
            vec!["start 2024-05-01T10:00:01Z Stdout F", "content ok", "end"]
        );
        assert_eq!(skipped, 1);
    }

    #[test]
    fn a_huge_record_streams_in_pieces_no_bigger_than_the_chunks() {
        let mut input = b"2024-05-01T10:00:01Z stdout P ".to_vec();
        input.extend(std::iter::repeat_n(b'y', 1 << 20));
        input.push(b'\n');
        let mut parser = RecordParser::default();
        let mut buf = Vec::new();
        let mut content = 0usize;
        for chunk in input.chunks(4096) {
            parser.feed(chunk, &mut buf);
            for piece in &buf {
                if let Piece::Content(c) = piece {
                    assert!(c.len() <= 4096);
                    content += c.len();
                }
            }
        }
        assert_eq!(content, 1 << 20);
    }
}
