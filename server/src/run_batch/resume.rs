//! Resuming a batch: the output file as a previous run left it (killed at any point) tells which input lines are
//! done. A torn last line (no newline: the run died while writing it) is cut off, so the file ends at its last
//! complete line before new lines are appended. Lines are matched by `custom_id`, counted (a custom_id given twice in
//! the input is done twice); lines without one (input that was not JSON, or had no string custom_id) are answered
//! in input order as they are read, so the first `idless` such input lines are the ones already answered.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Seek, SeekFrom};
use std::path::Path;

use serde::Deserialize;

/// The input lines a previous run answered.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Done {
    ids: HashMap<String, usize>,
    idless: usize,
    /// Complete lines in the output file.
    pub lines: u64,
}

/// The one field of an output line resume reads (the body is skipped, not built).
#[derive(Deserialize)]
struct CustomId {
    custom_id: Option<String>,
}

/// What an output file holds: its answered lines, and the length of its complete lines (up to and with the last
/// newline; anything after it is a torn line).
#[derive(Debug, Default, PartialEq)]
pub struct Scan {
    pub done: Done,
    pub complete_len: u64,
    pub total_len: u64,
}

impl Done {
    /// Reads an output file line by line (never whole: it may hold a million answers).
    pub fn scan(mut reader: impl BufRead) -> io::Result<Scan> {
        let mut scan = Scan::default();
        let mut line = Vec::new();
        loop {
            line.clear();
            let n = reader.read_until(b'\n', &mut line)? as u64;
            if n == 0 {
                return Ok(scan);
            }
            scan.total_len += n;
            if line.last() != Some(&b'\n') {
                continue; // torn: the end of the file
            }
            scan.complete_len = scan.total_len;
            if !line.iter().all(u8::is_ascii_whitespace) {
                scan.done.add(&line);
            }
        }
    }

    /// The complete lines of an output file's text.
    #[cfg(test)]
    pub fn from_output(text: &[u8]) -> Self {
        Self::scan(text).map(|s| s.done).unwrap_or_default()
    }

    fn add(&mut self, line: &[u8]) {
        self.lines += 1;
        match serde_json::from_slice::<CustomId>(line) {
            Ok(CustomId { custom_id: Some(id) }) => *self.ids.entry(id).or_default() += 1,
            _ => self.idless += 1,
        }
    }

    /// Whether the input line with this custom_id (`None`: a line without one) was answered; each answer is used
    /// once.
    pub fn take(&mut self, custom_id: Option<&str>) -> bool {
        let count = match custom_id {
            Some(id) => match self.ids.get_mut(id) {
                Some(n) => n,
                None => return false,
            },
            None => &mut self.idless,
        };
        if *count == 0 {
            return false;
        }
        *count -= 1;
        true
    }
}

/// Opens the output for appending: a new file, or an existing one cut to its last complete line, with what it
/// holds.
pub fn open(path: &Path) -> io::Result<(File, Done)> {
    let mut file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
    let scan = Done::scan(BufReader::new(&file))?;
    if scan.complete_len < scan.total_len {
        tracing::warn!(
            "{}: cutting off a torn last line ({} bytes) left by an interrupted run",
            path.display(),
            scan.total_len - scan.complete_len
        );
        file.set_len(scan.complete_len)?;
    }
    file.seek(SeekFrom::End(0))?;
    Ok((file, scan.done))
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn a_torn_last_line_is_not_counted() {
        let scan = |t: &[u8]| Done::scan(t).map(|s| (s.complete_len, s.total_len, s.done.lines)).unwrap();
        assert_eq!(scan(b""), (0, 0, 0));
        assert_eq!(scan(b"{\"a\":1}"), (0, 7, 0));
        assert_eq!(scan(b"{\"a\":1}\n{\"b\""), (8, 12, 1));
        assert_eq!(scan(b"{\"a\":1}\n"), (8, 8, 1));
    }

    #[test]
    fn answered_lines_are_taken_once() {
        let out = b"{\"custom_id\":\"a\"}\n{\"custom_id\":\"b\"}\n{\"custom_id\":\"a\"}\n{\"custom_id\":null}\n\n";
        let mut done = Done::from_output(out);
        assert_eq!(done.lines, 4);
        assert!(done.take(Some("a")) && done.take(Some("a")));
        assert!(!done.take(Some("a")), "a was answered twice, not three times");
        assert!(done.take(Some("b")) && !done.take(Some("c")));
        assert!(done.take(None) && !done.take(None));
    }

    #[test]
    fn open_cuts_the_file_and_appends_after_it() {
        let dir = std::env::temp_dir().join(format!("rserve-resume-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("out.jsonl");
        std::fs::write(&path, b"{\"custom_id\":\"a\"}\n{\"custom_id\":\"b").unwrap();
        let (mut file, mut done) = open(&path).unwrap();
        assert_eq!(done.lines, 1);
        assert!(done.take(Some("a")) && !done.take(Some("b")));
        file.write_all(b"{\"custom_id\":\"b\"}\n").unwrap();
        drop(file);
        assert_eq!(std::fs::read(&path).unwrap(), b"{\"custom_id\":\"a\"}\n{\"custom_id\":\"b\"}\n");
        let (_, done) = open(&dir.join("new.jsonl")).unwrap();
        assert_eq!(done, Done::default());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
