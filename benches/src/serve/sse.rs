//! Incremental parsing of a `text/event-stream` body into the `data:` payloads of its events, fed with whatever
//! byte chunks the network delivers (an event may be split anywhere, even inside a UTF-8 sequence or a CRLF).

/// Accumulates bytes and yields complete events' data.
#[derive(Debug, Default)]
pub struct SseParser {
    buf: Vec<u8>,
}

impl SseParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `bytes` and returns the data of every event completed by them, in order. An event's `data:` lines are
    /// joined with `\n`; comments (`:`) and other fields are skipped; events without data are dropped.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        self.buf.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some((end, sep_len)) = find_event_end(&self.buf) {
            let raw: Vec<u8> = self.buf.drain(..end + sep_len).take(end).collect();
            if let Some(data) = event_data(&raw) {
                events.push(data);
            }
        }
        events
    }

    /// The data of a last event that was not terminated by a blank line (some servers close the stream right
    /// after the final `data:` line).
    pub fn finish(&mut self) -> Option<String> {
        let raw = std::mem::take(&mut self.buf);
        event_data(&raw)
    }
}

/// Position and length of the first blank-line separator (`\n\n`, `\r\n\r\n` or `\r\r`).
fn find_event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    while i < buf.len() {
        for sep in [&b"\r\n\r\n"[..], b"\n\n", b"\r\r"] {
            if buf[i..].starts_with(sep) {
                return Some((i, sep.len()));
            }
        }
        i += 1;
    }
    None
}

fn event_data(raw: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(raw);
    let mut data: Option<String> = None;
    for line in text.split(['\n', '\r']) {
        let Some(rest) = line.strip_prefix("data:") else { continue };
        let value = rest.strip_prefix(' ').unwrap_or(rest);
        match &mut data {
            Some(d) => {
                d.push('\n');
                d.push_str(value);
            }
            None => data = Some(value.to_owned()),
        }
    }
    data
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_events_across_arbitrary_chunk_boundaries() {
        let body = "data: {\"a\":\"é\"}\n\n: keep-alive\n\ndata: two\r\ndata: lines\r\n\r\nevent: x\ndata: [DONE]\n\n";
        let want = vec!["{\"a\":\"é\"}".to_owned(), "two\nlines".to_owned(), "[DONE]".to_owned()];
        let bytes = body.as_bytes();
        for step in 1..bytes.len() {
            let mut p = SseParser::new();
            let mut got = Vec::new();
            for chunk in bytes.chunks(step) {
                got.extend(p.push(chunk));
            }
            assert_eq!(got, want, "chunk size {step}");
            assert_eq!(p.finish(), None);
        }
    }

    #[test]
    fn an_unterminated_last_event_is_returned_by_finish() {
        let mut p = SseParser::new();
        assert!(p.push(b"data: x\n\ndata: y").len() == 1);
        assert_eq!(p.finish().as_deref(), Some("y"));
    }
}
