//! Where the batch input comes from (`-i`): a file, `-` (stdin) or an http(s):// URL read with GET (ureq, the
//! blocking client hf-hub already builds with rustls, so no new dependency). Lines are read on a thread of their own
//! and handed on checked (`line::parse`), so reading a million-line file never holds more than the channel's lines.

use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::path::PathBuf;

use tokio::sync::mpsc;

use super::line::{self, BatchRequest, LineFailure};

/// The input named by `-i`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Stdin,
    File(PathBuf),
    Url(String),
}

/// One non-blank input line, checked.
pub type Parsed = Result<BatchRequest, LineFailure>;

/// What the reader thread hands on: a line, or the error that ended reading.
#[derive(Debug)]
pub enum Item {
    Line(Parsed),
    Failed(io::Error),
}

impl Source {
    pub fn new(arg: &str) -> Self {
        if arg == "-" {
            Source::Stdin
        } else if arg.starts_with("http://") || arg.starts_with("https://") {
            Source::Url(arg.to_owned())
        } else {
            Source::File(PathBuf::from(arg))
        }
    }

    /// Opens the input (a URL is requested here, so a bad one fails before the model loads).
    pub fn open(&self) -> io::Result<Box<dyn BufRead + Send>> {
        Ok(match self {
            Source::Stdin => Box::new(BufReader::new(io::stdin())),
            Source::File(path) => Box::new(BufReader::new(
                File::open(path).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?,
            )),
            Source::Url(url) => {
                let response = ureq::get(url).call().map_err(|e| io::Error::other(format!("GET {url}: {e}")))?;
                Box::new(BufReader::new(response.into_reader()))
            }
        })
    }

    /// The number of non-blank lines, when it can be known before reading (a file: one quick pass).
    pub fn count_lines(&self) -> Option<u64> {
        let Source::File(path) = self else { return None };
        count_non_blank(BufReader::new(File::open(path).ok()?)).ok()
    }
}

fn count_non_blank(mut reader: impl BufRead) -> io::Result<u64> {
    let mut n = 0;
    let mut line = Vec::new();
    while read_line(&mut reader, &mut line)? {
        n += u64::from(!is_blank(&line));
    }
    Ok(n)
}

/// Reads one line (without its newline) into `buf`; false at the end.
fn read_line(reader: &mut impl BufRead, buf: &mut Vec<u8>) -> io::Result<bool> {
    buf.clear();
    if reader.read_until(b'\n', buf)? == 0 {
        return Ok(false);
    }
    while buf.last().is_some_and(|&b| b == b'\n' || b == b'\r') {
        buf.pop();
    }
    Ok(true)
}

/// A blank line is no request (vLLM skips them too).
fn is_blank(line: &[u8]) -> bool {
    line.iter().all(u8::is_ascii_whitespace)
}

/// Reads every line, checks it and sends it on, until the end, a read error, or the receiver is gone.
pub fn pump(reader: Box<dyn BufRead + Send>, tx: mpsc::Sender<Item>) {
    let mut reader = reader;
    let mut buf = Vec::new();
    loop {
        let item = match read_line(&mut reader, &mut buf) {
            Ok(false) => return,
            Ok(true) if is_blank(&buf) => continue,
            Ok(true) => Item::Line(line::parse(&buf)),
            Err(e) => Item::Failed(e),
        };
        let failed = matches!(item, Item::Failed(_));
        if tx.blocking_send(item).is_err() || failed {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_by_argument() {
        assert_eq!(Source::new("-"), Source::Stdin);
        assert_eq!(Source::new("https://h/b.jsonl"), Source::Url("https://h/b.jsonl".into()));
        assert_eq!(Source::new("b.jsonl"), Source::File("b.jsonl".into()));
    }

    #[test]
    fn blank_lines_are_skipped_and_crlf_is_taken_off() {
        let text = "{\"custom_id\":\"a\",\"url\":\"/v1/completions\",\"body\":{}}\r\n\n  \nnot json\n{\"custom_id\":\"b\",\"url\":\"/v1/completions\",\"body\":{}}";
        assert_eq!(count_non_blank(text.as_bytes()).unwrap(), 3);
        let (tx, mut rx) = mpsc::channel(8);
        pump(Box::new(io::Cursor::new(text.as_bytes().to_vec())), tx);
        let mut got = Vec::new();
        while let Ok(Item::Line(p)) = rx.try_recv() {
            got.push(p.map(|r| r.custom_id).map_err(|f| f.error.to_string()));
        }
        assert_eq!(got.len(), 3);
        assert_eq!(got[0], Ok("a".to_owned()));
        assert!(got[1].as_ref().is_err_and(|e| e.contains("not valid JSON")));
        assert_eq!(got[2], Ok("b".to_owned()));
    }
}
