//! `IncrementalDetokenizer`: turns a stream of generated token ids into a stream of text pieces for one request.
//!
//! Technique (prefix offset / read offset): keep a short window of ids. `read` marks where the text already sent
//! ends; the ids before it (the "prefix") are kept only as context, because decoders are not concatenative at token
//! boundaries (sentencepiece-style decoders drop the leading space of the first token; bytes of one character may be
//! spread over several tokens). Each step decodes the window and sends what lies past the prefix's text, unless the
//! decoded text ends in U+FFFD, which means a character is still incomplete: then it waits for more ids. After a
//! send, the ids before the old read offset are dropped, so the cost of a step is bounded by the window, not by the
//! length of the output.
//!
//! Invariant: the concatenation of every piece returned by `push` plus `finish` equals
//! `tokenizer.decode(all_ids, skip_special_tokens)` (for a detokenizer made by `new`). Pieces never end inside a
//! character; a U+FFFD that the full decode also has is sent once it can no longer change.
//! Byte-level BPE decoders are concatenative over bytes: for them the window is not needed, each id's bytes are
//! appended to a `ByteStream` (`byte_stream.rs`), which holds back at most an unfinished character.
//! One bounded exception: a byte-fallback run (`<0xNN>` tokens) longer than `MAX_BYTE_RUN_TOKENS` is sent while
//! valid, although the tokenizer's decoder would turn the whole run into U+FFFD if an invalid byte came later.

use std::sync::Arc;

use super::byte_stream::ByteStream;
use super::Tokenizer;
use crate::error::Result;
use rserve_scheduler::TokenId;

/// How many tokens may wait unsent before the detokenizer tries to cut the window (only a run of bytes that never
/// forms a character gets this long; real text sends every few tokens).
const MAX_PENDING_TOKENS: usize = 16;
/// A UTF-8 character spans at most 4 bytes, and every token is at least one byte, so a cut this many tokens before
/// the end can no longer be changed by ids still to come.
const SETTLE_TOKENS: usize = 4;
/// How long a byte-fallback run may wait for a token of another kind before its (valid) text is sent.
const MAX_BYTE_RUN_TOKENS: usize = 64;
/// How many prompt ids `with_prompt` keeps as context.
const PROMPT_CONTEXT_TOKENS: usize = 6;

/// Streaming decoder for one sequence. Owns an `Arc` of the tokenizer so it can live in per-request state.
#[derive(Debug)]
pub struct IncrementalDetokenizer {
    tokenizer: Arc<Tokenizer>,
    skip_special_tokens: bool,
    /// The window: context ids (already sent) first, then ids not yet sent, starting at `read` (bare ids, as the
    /// wrapped tokenizer decodes them).
    ids: Vec<u32>,
    read: usize,
    /// `decode(ids[..read])`, cached.
    prefix_text: String,
    /// Set when the tokenizer's decode is concatenative over bytes: the window is then unused.
    bytes: Option<ByteStream>,
}

impl IncrementalDetokenizer {
    /// A detokenizer with no context: its output is exactly `decode(ids, skip_special_tokens)`.
    pub fn new(tokenizer: Arc<Tokenizer>, skip_special_tokens: bool) -> Self {
        let bytes = tokenizer.decodes_by_bytes().then(ByteStream::default);
        Self { tokenizer, skip_special_tokens, ids: Vec::new(), read: 0, prefix_text: String::new(), bytes }
    }

    /// A detokenizer whose first piece is decoded after the last few `prompt_ids`, so a sentencepiece-style leading
    /// space of the first generated token is kept (as it would be in `decode(prompt + generated)`). The prompt's
    /// text is not returned.
    pub fn with_prompt(tokenizer: Arc<Tokenizer>, prompt_ids: &[TokenId], skip_special_tokens: bool) -> Result<Self> {
        if tokenizer.decodes_by_bytes() {
            // Concatenative: the prompt cannot change how the first generated token decodes.
            return Ok(Self::new(tokenizer, skip_special_tokens));
        }
        let mut context: Vec<u32> = prompt_ids
            .iter()
            .copied()
            .filter(|&id| !(skip_special_tokens && tokenizer.is_special_token(id)))
            .map(|id| id.0)
            .collect();
        context.drain(..context.len().saturating_sub(PROMPT_CONTEXT_TOKENS));
        let prefix_text = tokenizer.decode_raw(&context, skip_special_tokens)?;
        let read = context.len();
        Ok(Self { tokenizer, skip_special_tokens, ids: context, read, prefix_text, bytes: None })
    }

    /// Feeds one generated id; returns the text that became final (often empty).
    pub fn push(&mut self, id: TokenId) -> Result<String> {
        // Skipped special tokens never enter the window: they decode to nothing, and leaving them out keeps
        // sentencepiece decoders from treating the next token as the first one.
        if self.skip_special_tokens && self.tokenizer.is_special_token(id) {
            return Ok(String::new());
        }
        if let Some(stream) = self.bytes.as_mut() {
            return Ok(stream.push(self.tokenizer.decode_bytes_of(id).unwrap_or_default()));
        }
        self.ids.push(id.0);
        let text = self.decode(&self.ids)?;
        let pending = self.ids.len() - self.read;
        // A byte-fallback run decodes as a whole (valid UTF-8, or one U+FFFD per byte), so it is final only once a
        // token of another kind follows; past MAX_BYTE_RUN_TOKENS a valid run is sent anyway to bound the latency.
        let run_may_grow = self.tokenizer.is_byte_fallback_token(id) && pending <= MAX_BYTE_RUN_TOKENS;
        if !text.ends_with('\u{FFFD}') && !run_may_grow {
            return self.send_up_to(self.ids.len(), text);
        }
        if pending > MAX_PENDING_TOKENS {
            // A long run that keeps ending in U+FFFD: send the part that later ids can no longer change, if the
            // window splits cleanly there (decoding both halves apart gives the same text as decoding them together).
            let cut = self.ids.len() - SETTLE_TOKENS;
            if self.tokenizer.is_byte_fallback_token(TokenId(self.ids[cut])) {
                // Cutting would split a byte-fallback run, which only decodes as a whole.
                return Ok(String::new());
            }
            let head = self.decode(&self.ids[..cut])?;
            let tail = self.decode(&self.ids[cut..])?;
            if head.len() > self.prefix_text.len() && format!("{head}{tail}") == text {
                return self.send_up_to(cut, head);
            }
        }
        Ok(String::new())
    }

    /// Feeds several ids; returns the text that became final.
    pub fn push_all(&mut self, ids: &[TokenId]) -> Result<String> {
        let mut out = String::new();
        for &id in ids {
            out.push_str(&self.push(id)?);
        }
        Ok(out)
    }

    /// Ends the stream: returns whatever is still held back (possibly with U+FFFD, as the full decode has it).
    pub fn finish(&mut self) -> Result<String> {
        if let Some(stream) = self.bytes.as_mut() {
            return Ok(stream.finish());
        }
        let text = self.decode(&self.ids)?;
        let out = suffix_after(&text, &self.prefix_text).to_owned();
        self.prefix_text = text;
        self.read = self.ids.len();
        Ok(out)
    }

    /// How many ids the window holds now (context plus unsent; with a byte stream, the ids whose bytes wait for the
    /// rest of a character); small for real text, whatever the output length.
    pub fn window_len(&self) -> usize {
        self.bytes.as_ref().map_or(self.ids.len(), ByteStream::held_ids)
    }

    /// True when ids are held back waiting for more bytes.
    pub fn has_pending(&self) -> bool {
        self.bytes.as_ref().map_or(self.read < self.ids.len(), |b| b.held_ids() > 0)
    }

    /// `text` = `decode(ids[..end])`: sends what lies past the prefix text and moves the window.
    fn send_up_to(&mut self, end: usize, text: String) -> Result<String> {
        if text.len() <= self.prefix_text.len() {
            // Nothing new yet (a token that decodes to nothing): keep waiting, the window stays as it is.
            return Ok(String::new());
        }
        let out = suffix_after(&text, &self.prefix_text).to_owned();
        // The part just sent becomes the context: drop the old context before it.
        let old_read = self.read;
        self.ids.drain(..old_read);
        self.read = end - old_read;
        self.prefix_text = self.decode(&self.ids[..self.read])?;
        Ok(out)
    }

    fn decode(&self, ids: &[u32]) -> Result<String> {
        self.tokenizer.decode_raw(ids, self.skip_special_tokens)
    }
}

/// The part of `text` after `prefix`. When a decoder rewrote the start (so `prefix` is not a prefix), cut at the
/// same byte length, moved forward to a character boundary.
fn suffix_after<'a>(text: &'a str, prefix: &str) -> &'a str {
    if let Some(rest) = text.strip_prefix(prefix) {
        return rest;
    }
    let mut cut = prefix.len().min(text.len());
    while !text.is_char_boundary(cut) {
        cut += 1;
    }
    &text[cut..]
}
