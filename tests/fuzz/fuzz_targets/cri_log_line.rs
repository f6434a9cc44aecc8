//! Bytes a container writes reach its log file through the runtime, one CRI record per line
//! (`<timestamp> <stream> <tag> <content>`): each line is parsed
//! (`swiftlet::logs::format::parse_record`), records are joined into lines
//! (`LineJoiner`, as `logs::read` does) and rendered with and without timestamps, as
//! `/containerLogs` serves them. A line that does not parse is skipped; a panic is a finding.
#![no_main]

use libfuzzer_sys::fuzz_target;
use swiftlet::logs::format::{LineJoiner, parse_record};

fuzz_target!(|data: &[u8]| {
    let mut joiner = LineJoiner::default();
    let mut content_in = 0usize;
    let mut content_out = 0usize;
    for raw in data.split_inclusive(|b| *b == b'\n') {
        let record = match parse_record(raw) {
            Ok(record) => record,
            Err(error) => {
                let _ = error.to_string();
                continue;
            }
        };
        assert!(
            record.content.len() < raw.len(),
            "content is a part of its line"
        );
        content_in += record.content.len();
        if let Some(line) = joiner.push(&record) {
            assert_eq!(
                line.content.last(),
                Some(&b'\n'),
                "a completed line ends its line"
            );
            content_out += line.content.len() - 1;
            let plain = line.render(false);
            let stamped = line.render(true);
            assert!(stamped.ends_with(&plain));
        }
    }
    if let Some(line) = joiner.take_pending() {
        content_out += line.content.len();
        let _ = line.render(true);
    }
    // Joining never invents content.
    assert!(
        content_out <= content_in,
        "{content_out} bytes out of {content_in}"
    );
});
