//! `ByteStream`: streaming text for decoders that are concatenative over bytes (byte-level BPE: each token stands
//! for a fixed byte string and the text is the lossy UTF-8 of their concatenation).
//!
//! The lossy UTF-8 decode parses left to right and starts afresh at every character boundary, so a stream can send
//! every complete character (and the U+FFFD of every byte run that can no longer become valid) at once and hold back
//! only an incomplete character at the end: at most three bytes. Each token then costs a table lookup and a copy,
//! instead of decoding a window of ids through the tokenizer.

/// The bytes still held back (an unfinished character at the end of the stream).
#[derive(Debug, Default)]
pub(crate) struct ByteStream {
    pending: Vec<u8>,
    /// Ids whose bytes (some of them) are still in `pending`.
    held_ids: usize,
}

impl ByteStream {
    /// Adds one token's bytes; returns the text that became final.
    pub(crate) fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        self.held_ids += 1;
        let mut out = String::new();
        let mut consumed = 0;
        for chunk in self.pending.utf8_chunks() {
            out.push_str(chunk.valid());
            let invalid = chunk.invalid();
            let start = consumed + chunk.valid().len();
            consumed = start + invalid.len();
            if invalid.is_empty() {
                continue;
            }
            // An invalid run at the very end that is the start of a character may still complete: hold it.
            let at_end = consumed == self.pending.len();
            if at_end && std::str::from_utf8(invalid).err().is_some_and(|e| e.error_len().is_none()) {
                consumed = start;
                break;
            }
            out.push('\u{FFFD}');
        }
        self.pending.drain(..consumed);
        if self.pending.is_empty() {
            self.held_ids = 0;
        }
        out
    }

    /// Ends the stream: the held-back bytes as the lossy decode shows them.
    pub(crate) fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        self.held_ids = 0;
        out
    }

    /// How many ids have bytes held back.
    pub(crate) fn held_ids(&self) -> usize {
        self.held_ids
    }
}

#[cfg(test)]
mod tests {
    use super::ByteStream;

    fn stream(parts: &[&[u8]]) -> (Vec<String>, String) {
        let mut s = ByteStream::default();
        let pieces: Vec<String> = parts.iter().map(|p| s.push(p)).collect();
        (pieces, s.finish())
    }

    #[test]
    fn a_character_split_over_tokens_is_sent_when_complete() {
        let euro = "€".as_bytes();
        let (pieces, rest) = stream(&[b"a", &euro[..1], &euro[1..2], &euro[2..], b"b"]);
        assert_eq!(pieces, ["a", "", "", "€", "b"]);
        assert_eq!(rest, "");
    }

    #[test]
    fn bytes_that_cannot_become_valid_are_replaced_as_the_whole_decode_does() {
        let parts: [&[u8]; 5] = [b"x\xE2\x82", b"y", b"\xFF", b"\xF0\x9F", b"\x98"];
        let (pieces, rest) = stream(&parts);
        let whole: Vec<u8> = parts.concat();
        assert_eq!(pieces.concat() + &rest, String::from_utf8_lossy(&whole));
        assert_eq!(pieces[0], "x");
        assert_eq!(rest, "\u{FFFD}");
    }
}
