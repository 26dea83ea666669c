//! Resuming a batch: the output file as a previous run left it (killed at any point) tells which input lines are
//! done. A torn last line (no newline: the run died while writing it) is cut off, so the file ends at its last
//! complete line before new lines are appended. Lines are matched by `custom_id`, counted (a custom_id given twice in
//! the input is done twice); lines without one (input that was not JSON, or had no string custom_id) are answered
//! in input order as they are read, so the first `idless` such input lines are the ones already answered.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::Path;

/// The input lines a previous run answered.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Done {
    ids: HashMap<String, usize>,
    idless: usize,
    /// Complete lines in the output file.
    pub lines: u64,
}

impl Done {
    /// Reads the complete lines of an output file (the text up to its last newline).
    pub fn from_output(text: &[u8]) -> Self {
        let mut done = Done::default();
        for line in text.split(|&b| b == b'\n').filter(|l| !l.iter().all(u8::is_ascii_whitespace)) {
            done.lines += 1;
            match serde_json::from_slice::<serde_json::Value>(line).ok().and_then(|v| v.get("custom_id").cloned()) {
                Some(serde_json::Value::String(id)) => *done.ids.entry(id).or_default() += 1,
                _ => done.idless += 1,
            }
        }
        done
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

/// The length of the complete lines at the start of `text`: up to and with its last newline.
pub fn complete_len(text: &[u8]) -> usize {
    text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1)
}

/// Opens the output for appending: a new file, or an existing one cut to its last complete line, with what it
/// holds.
pub fn open(path: &Path) -> io::Result<(File, Done)> {
    let mut file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
    let mut text = Vec::new();
    file.read_to_end(&mut text)?;
    let keep = complete_len(&text);
    if keep < text.len() {
        tracing::warn!(
            "{}: cutting off a torn last line ({} bytes) left by an interrupted run",
            path.display(),
            text.len() - keep
        );
        file.set_len(keep as u64)?;
    }
    let done = Done::from_output(&text[..keep]);
    file.seek(SeekFrom::End(0))?;
    file.flush()?;
    Ok((file, done))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_torn_last_line_is_cut() {
        assert_eq!(complete_len(b""), 0);
        assert_eq!(complete_len(b"{\"a\":1}"), 0);
        assert_eq!(complete_len(b"{\"a\":1}\n{\"b\""), 8);
        assert_eq!(complete_len(b"{\"a\":1}\n"), 8);
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
