//! Where the last `n` lines of a CRI log file start, found by reading it backwards a chunk at a
//! time (upstream `tail.FindTailLineStartIndex`), so `tailLines` costs one chunk of memory
//! whatever the file's size.
//!
//! Lines are the joined ones a reader sees: a line ends with a full (`F`) record, so counting
//! goes by the records' tags, read from each record's first bytes. The partial records after the
//! last full one (a line still being written) come after the cut, as they would reading forwards.
//! Records that do not parse are not lines.

use std::{fs::File, io, os::unix::fs::FileExt as _};

use super::{format::parse_record, records::MAX_HEADER};

/// Bytes read at a time, backwards.
pub const CHUNK: usize = 64 * 1024;

/// The file's bytes read backwards, one chunk held at a time.
struct Backwards<'f> {
    file: &'f File,
    buf: Vec<u8>,
    /// The file offset of `buf[0]`.
    start: u64,
}

impl Backwards<'_> {
    /// The offset of the last `\n` before `before`, if any.
    fn newline_before(&mut self, before: u64) -> io::Result<Option<u64>> {
        let mut end = before;
        while end > 0 {
            let buffered = self.start < end && end <= self.start + self.buf.len() as u64;
            if !buffered {
                let start = end.saturating_sub(CHUNK as u64);
                self.buf
                    .resize(usize::try_from(end - start).unwrap_or(CHUNK), 0);
                let n = read_fully(self.file, &mut self.buf, start)?;
                self.buf.truncate(n);
                self.start = start;
                if self.start + (self.buf.len() as u64) < end {
                    // The file shrank under us: what is gone has no newline to offer.
                    end = self.start + self.buf.len() as u64;
                    if self.buf.is_empty() {
                        return Ok(None);
                    }
                    continue;
                }
            }
            let upto = usize::try_from(end - self.start).unwrap_or(0);
            if let Some(at) = memchr::memrchr(b'\n', &self.buf[..upto]) {
                return Ok(Some(self.start + at as u64));
            }
            end = self.start;
        }
        Ok(None)
    }
}

/// Reads into `buf` at `offset` until it is full or the file ends; the bytes read.
fn read_fully(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// Whether the record starting at `start` (its newline at `newline`) is a full one; `None` when
/// it does not parse.
fn is_full_record(file: &File, start: u64, newline: u64) -> io::Result<Option<bool>> {
    let len = usize::try_from(newline - start)
        .unwrap_or(MAX_HEADER)
        .min(MAX_HEADER);
    let mut head = vec![0u8; len];
    let n = read_fully(file, &mut head, start)?;
    head.truncate(n);
    Ok(parse_record(&head).ok().map(|r| !r.partial))
}

/// The offset from which the last `lines` complete lines of `file` (of `len` bytes) start; 0
/// when it has no more than that.
pub fn tail_start(file: &File, len: u64, lines: u64) -> io::Result<u64> {
    let mut back = Backwards {
        file,
        buf: Vec::with_capacity(CHUNK),
        start: len,
    };
    let mut full = 0u64;
    // Anything after the last newline is a record still being written: not a line yet.
    let mut newline = back.newline_before(len)?;
    while let Some(end) = newline {
        let previous = back.newline_before(end)?;
        let start = previous.map_or(0, |p| p + 1);
        if is_full_record(file, start, end)? == Some(true) {
            full += 1;
            // The end of the line before the ones wanted: they start right after it.
            if full > lines {
                return Ok(end + 1);
            }
        }
        newline = previous;
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    fn file(text: &[u8]) -> (tempfile::NamedTempFile, u64) {
        let mut f = tempfile::NamedTempFile::new().expect("temp file");
        f.write_all(text).expect("write");
        (f, text.len() as u64)
    }

    fn tail(text: &str, lines: u64) -> String {
        let (f, len) = file(text.as_bytes());
        let at = tail_start(f.as_file(), len, lines).expect("tail");
        text[usize::try_from(at).expect("offset")..].to_owned()
    }

    const LOG: &str = "2024-05-01T10:00:01Z stdout F one\n\
                       2024-05-01T10:00:02Z stdout P tw\n\
                       2024-05-01T10:00:02Z stdout F o\n\
                       garbage\n\
                       2024-05-01T10:00:03Z stderr F three\n\
                       2024-05-01T10:00:04Z stdout P four, not ended";

    #[test]
    fn counts_joined_lines_from_the_end() {
        let after = |lines| tail(LOG, lines);
        // The unended line is after the cut whatever the count, as a forward read serves it.
        assert_eq!(after(0), "2024-05-01T10:00:04Z stdout P four, not ended");
        // Right after the line before: a record that does not parse may come first (a forward
        // read skips it).
        assert!(after(1).starts_with("garbage\n2024-05-01T10:00:03Z stderr F three\n"));
        // "garbage" is no line: two lines back is the one split in two records.
        assert!(after(2).starts_with("2024-05-01T10:00:02Z stdout P tw\n"));
        assert_eq!(after(3), LOG);
        assert_eq!(after(100), LOG);
        assert_eq!(tail("", 5), "");
    }

    #[test]
    fn reads_backwards_across_chunks_with_records_longer_than_a_chunk() {
        let mut text = String::new();
        for i in 0..5 {
            text.push_str(&format!("2024-05-01T10:00:0{i}Z stdout F line {i}\n"));
        }
        // A line of three records, each longer than a chunk, then two short lines.
        let big = "z".repeat(CHUNK + 17);
        for tag in ["P", "P", "F"] {
            text.push_str(&format!("2024-05-01T10:00:06Z stdout {tag} {big}\n"));
        }
        text.push_str("2024-05-01T10:00:07Z stdout F seven\n2024-05-01T10:00:08Z stdout F eight\n");
        let after = tail(&text, 3);
        assert!(
            after.starts_with("2024-05-01T10:00:06Z stdout P zzz"),
            "{}",
            &after[..80]
        );
        assert_eq!(after.matches('\n').count(), 5);
        let after = tail(&text, 4);
        assert!(after.starts_with("2024-05-01T10:00:04Z stdout F line 4\n"));
    }
}
