//! Per-request text output: incremental detokenization plus stop strings matched across token boundaries.
//!
//! Text that could still be the start of a stop string is held back; a matched stop string and everything after it
//! is dropped, as OpenAI and vLLM do (with `include_stop_str_in_output`, the stop string itself is kept).

use std::sync::Arc;

use crate::error::Result;
use crate::tokenizer::{IncrementalDetokenizer, Tokenizer};
use crate::TokenId;

pub(crate) struct TextOutput {
    detok: IncrementalDetokenizer,
    stop: Vec<String>,
    pending: String,
    /// `include_stop_str_in_output`: a matched stop string ends the text instead of being cut from it.
    include_stop: bool,
}

/// The longest suffix of `text` that is a proper prefix of some stop string (bytes, on a char boundary).
fn held_back(text: &str, stop: &[String]) -> usize {
    let mut keep = 0;
    for s in stop {
        for (k, _) in s.char_indices().skip(1) {
            if k > keep && text.ends_with(&s[..k]) {
                keep = k;
            }
        }
    }
    keep
}

impl TextOutput {
    pub(crate) fn new(
        tokenizer: Arc<Tokenizer>,
        prompt: &[TokenId],
        skip_special: bool,
        stop: Vec<String>,
        include_stop: bool,
    ) -> Result<Self> {
        let detok = IncrementalDetokenizer::with_prompt(tokenizer, prompt, skip_special)?;
        let stop = stop.into_iter().filter(|s| !s.is_empty()).collect();
        Ok(Self { detok, stop, pending: String::new(), include_stop })
    }

    /// Earliest stop-string match in the pending text: (byte offset, the stop string).
    fn find_stop(&self) -> Option<(usize, String)> {
        self.stop.iter().filter_map(|s| self.pending.find(s.as_str()).map(|i| (i, s.clone()))).min_by_key(|(i, _)| *i)
    }

    /// Feeds a token; returns the text now safe to show and the stop string if one matched (the request then ends).
    pub(crate) fn push(&mut self, token: TokenId) -> Result<(String, Option<String>)> {
        let new = self.detok.push(token)?;
        self.pending.push_str(&new);
        Ok(self.drain(false))
    }

    /// Ends the stream: everything still held back (up to a stop string, if the last bytes complete one).
    pub(crate) fn finish(&mut self) -> Result<(String, Option<String>)> {
        let rest = self.detok.finish()?;
        self.pending.push_str(&rest);
        Ok(self.drain(true))
    }

    fn drain(&mut self, all: bool) -> (String, Option<String>) {
        if let Some((at, s)) = self.find_stop() {
            let end = if self.include_stop { at + s.len() } else { at };
            let out = self.pending[..end].to_string();
            self.pending.clear();
            return (out, Some(s));
        }
        let keep = if all { 0 } else { held_back(&self.pending, &self.stop) };
        let cut = self.pending.len() - keep;
        let out = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        (out, None)
    }
}

#[cfg(test)]
mod tests {
    use super::held_back;

    #[test]
    fn holds_back_a_possible_stop_prefix() {
        let stop = vec!["END".to_string(), "\n\n".to_string()];
        assert_eq!(held_back("hello E", &stop), 1);
        assert_eq!(held_back("hello EN", &stop), 2);
        assert_eq!(held_back("hello\n", &stop), 1);
        assert_eq!(held_back("hello", &stop), 0);
    }
}
