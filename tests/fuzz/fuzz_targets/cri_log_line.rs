//! Bytes a container writes reach its log file through the runtime, one CRI record per line
//! (`<timestamp> <stream> <tag> <content>`). Each line is parsed on its own
//! (`swiftlet::logs::format::parse_record`), and the whole input is parsed as the reader of
//! `/containerLogs` parses a file: as a stream of chunks (`swiftlet::logs::records::RecordParser`),
//! cut where the first input byte says. The pieces must not depend on where the chunks were cut
//! (a record that straddles two reads is the same record), and content is never invented. A panic
//! is a finding.
#![no_main]

use libfuzzer_sys::fuzz_target;
use swiftlet::logs::{
    format::parse_record,
    records::{Piece, RecordParser},
};

/// What a stream of pieces says, with content runs merged (chunking splits them anywhere).
#[derive(Debug, PartialEq, Eq)]
enum Said {
    Start(String),
    Content(Vec<u8>),
    End,
}

fn parse_in_chunks(data: &[u8], chunk: usize) -> (Vec<Said>, u64) {
    let mut parser = RecordParser::default();
    let mut pieces = Vec::new();
    let mut said: Vec<Said> = Vec::new();
    for part in data.chunks(chunk.max(1)) {
        parser.feed(part, &mut pieces);
        for piece in &pieces {
            match piece {
                Piece::Start(header) => said.push(Said::Start(format!("{header:?}"))),
                Piece::Content(bytes) => match said.last_mut() {
                    Some(Said::Content(run)) => run.extend_from_slice(bytes),
                    _ => said.push(Said::Content(bytes.to_vec())),
                },
                Piece::End => said.push(Said::End),
            }
        }
    }
    (said, parser.skipped)
}

fuzz_target!(|data: &[u8]| {
    let Some((&cut, data)) = data.split_first() else {
        return;
    };
    for raw in data.split_inclusive(|b| *b == b'\n') {
        match parse_record(raw) {
            Ok(record) => assert!(
                record.content.len() < raw.len(),
                "content is a part of its line"
            ),
            Err(error) => {
                let _ = error.to_string();
            }
        }
    }
    let (whole, skipped_whole) = parse_in_chunks(data, data.len());
    let (chunked, skipped_chunked) = parse_in_chunks(data, usize::from(cut) % 64 + 1);
    assert_eq!(
        whole, chunked,
        "the pieces depend on where the reads were cut"
    );
    assert_eq!(skipped_whole, skipped_chunked);
    let content: usize = whole
        .iter()
        .map(|s| match s {
            Said::Content(run) => run.len(),
            _ => 0,
        })
        .sum();
    assert!(content <= data.len(), "content is never invented");
});
