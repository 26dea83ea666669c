//! `Tokenizer`: text <-> token ids for one model, plus the special-token facts the engine needs (BOS, the EOS set,
//! whether encoding adds BOS itself, the token strings chat templates see).
//!
//! It wraps a `tokenizers::Tokenizer` built either from a Hugging Face `tokenizer.json` (+ `tokenizer_config.json`) or
//! from GGUF metadata (`gguf.rs`). Incremental detokenization for streaming lives in `detok.rs`.
//!
//! Invariant: `decode` is the one definition of "the text of these ids"; `token_to_string` and the incremental
//! detokenizer are defined in terms of it, so streamed text always equals the final text.
//!
//! The public API speaks [`TokenId`]; the wrapped `tokenizers` crate and the fields here keep bare `u32`s.

mod byte_level;
mod byte_stream;
pub mod detok;
mod gguf;
mod hf_config;

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use candle_core::quantized::gguf_file::Content;
use tokenizers::DecoderWrapper;

pub use detok::IncrementalDetokenizer;

use crate::error::{ModelError, Result};
use hf_config::HfTokenizerConfig;
use rserve_scheduler::TokenId;

/// A model's tokenizer. Cheap to share behind an `Arc`; all methods take `&self`.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    bos_token: Option<String>,
    bos_token_id: Option<u32>,
    eos_token: Option<String>,
    eos_token_ids: Vec<u32>,
    pad_token: Option<String>,
    unk_token: Option<String>,
    adds_bos: bool,
    special_ids: HashSet<u32>,
    /// Ids of `<0xNN>` tokens when the decoder turns them into bytes (sentencepiece byte fallback); else empty.
    byte_fallback_ids: HashSet<u32>,
    byte_level_decoder: bool,
    /// With a byte-level decoder: the bytes each id stands for in a decode (empty for ids outside the vocabulary),
    /// so streaming can concatenate them instead of decoding windows of ids.
    decode_bytes: Option<Arc<[Box<[u8]>]>>,
}

/// Special-token names/ids gathered from a source, before they are checked against the vocabulary.
#[derive(Default)]
struct Specials {
    bos_token: Option<String>,
    eos_token: Option<String>,
    extra_eos_ids: Vec<u32>,
    pad_token: Option<String>,
    unk_token: Option<String>,
}

impl Tokenizer {
    /// Loads a Hugging Face `tokenizer.json`, taking BOS/EOS/PAD/UNK strings from `tokenizer_config.json` when given.
    ///
    /// Whether `encode(.., true)` adds BOS is decided by the post-processor in `tokenizer.json` (that is what
    /// Hugging Face's fast tokenizers run); `add_bos_token` in the config is only read as a fact and a conflicting
    /// value is logged. Without a config, a BOS that the post-processor adds is still found.
    pub fn from_file(tokenizer_json: &Path, tokenizer_config: Option<&Path>) -> Result<Self> {
        let inner = tokenizers::Tokenizer::from_file(tokenizer_json)
            .map_err(|e| ModelError::Tokenizer(format!("{}: {e}", tokenizer_json.display())))?;
        let config = match tokenizer_config {
            Some(path) => HfTokenizerConfig::read(path)?,
            None => HfTokenizerConfig::default(),
        };
        let specials = Specials {
            bos_token: config.bos_token.clone(),
            eos_token: config.eos_token.clone(),
            extra_eos_ids: Vec::new(),
            pad_token: config.pad_token.clone(),
            unk_token: config.unk_token.clone(),
        };
        let tokenizer = Self::assemble(inner, specials)?;
        if let Some(flag) = config.add_bos_token {
            if flag != tokenizer.adds_bos {
                tracing::warn!(
                    add_bos_token = flag,
                    adds_bos = tokenizer.adds_bos,
                    "tokenizer_config.json add_bos_token disagrees with tokenizer.json's post-processor; following the post-processor"
                );
            }
        }
        Ok(tokenizer)
    }

    /// Builds the tokenizer a GGUF file describes (`tokenizer.ggml.*`; byte-level BPE only, see `gguf.rs`).
    pub fn from_gguf(content: &Content) -> Result<Self> {
        let (inner, facts, tokens) = gguf::build(content)?;
        let name = |id: Option<u32>| id.and_then(|id| tokens.get(id as usize).cloned());
        let specials = Specials {
            bos_token: name(facts.bos_id),
            eos_token: name(facts.eos_ids.first().copied()),
            extra_eos_ids: facts.eos_ids.iter().skip(1).copied().collect(),
            pad_token: name(facts.pad_id),
            unk_token: None,
        };
        let tokenizer = Self::assemble(inner, specials)?;
        if tokenizer.adds_bos != facts.add_bos {
            return Err(ModelError::Tokenizer(format!(
                "GGUF says add_bos_token = {} but the built tokenizer {} BOS",
                facts.add_bos,
                if tokenizer.adds_bos { "adds" } else { "does not add" }
            )));
        }
        Ok(tokenizer)
    }

    fn assemble(inner: tokenizers::Tokenizer, specials: Specials) -> Result<Self> {
        let special_ids: HashSet<u32> =
            inner.get_added_tokens_decoder().into_iter().filter(|(_, t)| t.special).map(|(id, _)| id).collect();
        let byte_level_decoder = matches!(inner.get_decoder(), Some(DecoderWrapper::ByteLevel(_)));
        let byte_fallback_ids = byte_fallback_ids(&inner);
        let decode_bytes = byte_level_decoder.then(|| decode_bytes(&inner));
        let id_of = |token: &Option<String>| token.as_deref().and_then(|t| inner.token_to_id(t));

        let mut bos_token = specials.bos_token;
        let mut bos_token_id = id_of(&bos_token);
        if bos_token.is_some() && bos_token_id.is_none() {
            tracing::warn!(bos_token = ?bos_token, "BOS token is not in the vocabulary; ignoring it");
            bos_token = None;
        }
        let mut eos_token_ids = Vec::new();
        let eos_token = specials.eos_token.and_then(|t| match inner.token_to_id(&t) {
            Some(id) => {
                eos_token_ids.push(id);
                Some(t)
            }
            None => {
                tracing::warn!(eos_token = %t, "EOS token is not in the vocabulary; ignoring it");
                None
            }
        });
        for id in specials.extra_eos_ids {
            if !eos_token_ids.contains(&id) {
                eos_token_ids.push(id);
            }
        }

        // Whether encoding with special tokens puts a token in front: compare with and without on a probe text.
        let probe = |add: bool| {
            inner
                .encode("a", add)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| ModelError::Tokenizer(format!("probe encode: {e}")))
        };
        let (with, without) = (probe(true)?, probe(false)?);
        // A front token was added when the plain encoding follows it (an EOS at the end does not count).
        let first_added = match with.split_first() {
            Some((&first, rest)) if with.len() > without.len() && rest.starts_with(&without) => Some(first),
            _ => None,
        };
        let adds_bos = match (first_added, bos_token_id) {
            (Some(first), Some(bos)) => first == bos,
            (Some(first), None) => {
                // No configured BOS, but the post-processor prepends one: that token is the BOS.
                bos_token_id = Some(first);
                bos_token = inner.id_to_token(first);
                true
            }
            (None, _) => false,
        };

        Ok(Self {
            inner,
            bos_token,
            bos_token_id,
            eos_token,
            eos_token_ids,
            pad_token: specials.pad_token,
            unk_token: specials.unk_token,
            adds_bos,
            special_ids,
            byte_fallback_ids,
            byte_level_decoder,
            decode_bytes,
        })
    }

    /// Token ids of `text`. `add_special_tokens` runs the post-processor (BOS/EOS as the tokenizer defines them).
    /// Special-token strings inside `text` (like `<|im_start|>`) always become their single ids, as in Hugging Face.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<TokenId>> {
        self.inner
            .encode_fast(text, add_special_tokens)
            .map(|e| e.get_ids().iter().copied().map(TokenId).collect())
            .map_err(|e| ModelError::Tokenizer(format!("encode: {e}")))
    }

    /// Encodes a (first, second) text pair as the tokenizer's pair template joins them (a BERT cross-encoder's
    /// `[CLS] query [SEP] document [SEP]`), with each token's segment (`token_type_ids`: 0 in the first text, 1 in the
    /// second where the template says so). A tokenizer without a pair template joins the two encodings.
    pub fn encode_pair(&self, first: &str, second: &str, add_special_tokens: bool) -> Result<(Vec<TokenId>, Vec<u32>)> {
        self.inner
            .encode_fast((first, second), add_special_tokens)
            .map(|e| (e.get_ids().iter().copied().map(TokenId).collect(), e.get_type_ids().to_vec()))
            .map_err(|e| ModelError::Tokenizer(format!("encode: {e}")))
    }

    /// Encodes a prompt rendered by a chat template without doubling BOS: when the text already starts with the BOS
    /// string the template wrote it, so special tokens are not added; otherwise they are (a tokenizer that adds BOS
    /// gets it, one that does not gets nothing).
    pub fn encode_chat_prompt(&self, rendered: &str) -> Result<Vec<TokenId>> {
        let starts_with_bos = self.bos_token.as_deref().is_some_and(|bos| !bos.is_empty() && rendered.starts_with(bos));
        self.encode(rendered, !starts_with_bos)
    }

    /// The text of `ids`. Ids outside the vocabulary are skipped (as `tokenizers` does); with `skip_special_tokens`
    /// special added tokens are dropped.
    pub fn decode(&self, ids: &[TokenId], skip_special_tokens: bool) -> Result<String> {
        let raw: Vec<u32> = ids.iter().map(|t| t.0).collect();
        self.decode_raw(&raw, skip_special_tokens)
    }

    /// `decode` over bare ids (the incremental detokenizer's window), without copying them.
    pub(crate) fn decode_raw(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner.decode(ids, skip_special_tokens).map_err(|e| ModelError::Tokenizer(format!("decode: {e}")))
    }

    /// The decoded text of one token (for log-prob display); `None` for an id outside the vocabulary. A token that
    /// is only part of a UTF-8 character shows as U+FFFD; `token_bytes` gives its exact bytes.
    pub fn token_to_string(&self, id: TokenId) -> Option<String> {
        self.inner.id_to_token(id.0)?;
        self.inner.decode(&[id.0], false).ok()
    }

    /// The exact bytes one token stands for, when they are known: byte-level vocabularies map each character back
    /// to its byte, `<0xNN>` byte-fallback tokens are that byte, special tokens are their text. Other vocabularies
    /// give the UTF-8 of the decoded token. `None` for an id outside the vocabulary.
    pub fn token_bytes(&self, id: TokenId) -> Option<Vec<u8>> {
        let raw = self.inner.id_to_token(id.0)?;
        if self.special_ids.contains(&id.0) {
            return Some(raw.into_bytes());
        }
        if self.byte_level_decoder {
            if let Some(bytes) = byte_level::unspell(&raw) {
                return Some(bytes);
            }
        }
        if let Some(hex) = raw.strip_prefix("<0x").and_then(|r| r.strip_suffix('>')) {
            if hex.len() == 2 {
                if let Ok(byte) = u8::from_str_radix(hex, 16) {
                    return Some(vec![byte]);
                }
            }
        }
        self.token_to_string(id).map(String::into_bytes)
    }

    /// The bytes a token adds to a text in the middle of it, which is what a grammar matches: as `token_bytes`, but a
    /// SentencePiece word-start `▁` is the space it stands for (decoding a single token drops that space).
    pub fn grammar_bytes(&self, id: TokenId) -> Option<Vec<u8>> {
        let raw = self.inner.id_to_token(id.0)?;
        if self.byte_level_decoder || self.special_ids.contains(&id.0) || raw.starts_with("<0x") {
            return self.token_bytes(id);
        }
        Some(raw.replace('\u{2581}', " ").into_bytes())
    }

    /// The token's raw vocabulary string (byte-level spelling, `▁` and so on), as `convert_ids_to_tokens` gives.
    pub fn id_to_token(&self, id: TokenId) -> Option<String> {
        self.inner.id_to_token(id.0)
    }

    /// The id of a vocabulary string or added token.
    pub fn token_to_id(&self, token: &str) -> Option<TokenId> {
        self.inner.token_to_id(token).map(TokenId)
    }

    /// Number of ids, added tokens included (the size the embedding must cover at least).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn bos_token_id(&self) -> Option<TokenId> {
        self.bos_token_id.map(TokenId)
    }

    /// Every id that ends generation: the EOS first, then extra end-of-turn ids (GGUF `eot`/`eom`, or ones the
    /// caller merged in from `generation_config.json` through `with_extra_eos_token_ids`).
    pub fn eos_token_ids(&self) -> Vec<TokenId> {
        self.eos_token_ids.iter().copied().map(TokenId).collect()
    }

    /// Adds stop ids (e.g. `generation_config.json`'s `eos_token_id` list) to the EOS set, keeping order, no repeats.
    pub fn with_extra_eos_token_ids(mut self, ids: &[TokenId]) -> Self {
        for &TokenId(id) in ids {
            if !self.eos_token_ids.contains(&id) {
                self.eos_token_ids.push(id);
            }
        }
        self
    }

    /// The BOS string, as chat templates see it (`bos_token`).
    pub fn bos_token(&self) -> Option<String> {
        self.bos_token.clone()
    }

    /// The EOS string, as chat templates see it (`eos_token`).
    pub fn eos_token(&self) -> Option<String> {
        self.eos_token.clone()
    }

    pub fn pad_token(&self) -> Option<String> {
        self.pad_token.clone()
    }

    pub fn unk_token(&self) -> Option<String> {
        self.unk_token.clone()
    }

    /// Whether `encode(text, true)` puts BOS in front.
    pub fn adds_bos_token(&self) -> bool {
        self.adds_bos
    }

    /// Whether `id` is a special added token (dropped by `decode(.., true)`).
    pub fn is_special_token(&self, id: TokenId) -> bool {
        self.special_ids.contains(&id.0)
    }

    /// Whether `id` is a `<0xNN>` byte-fallback token: a run of them decodes as one unit (all valid UTF-8, or one
    /// U+FFFD per byte), so a streaming decoder must not send text while such a run may still grow.
    pub fn is_byte_fallback_token(&self, id: TokenId) -> bool {
        self.byte_fallback_ids.contains(&id.0)
    }

    /// Whether decoding is concatenative over bytes (each id stands for fixed bytes, `decode_bytes_of` gives them).
    pub(crate) fn decodes_by_bytes(&self) -> bool {
        self.decode_bytes.is_some()
    }

    /// The bytes `id` adds to a decode, when the decoder is concatenative over bytes (byte-level BPE); `None` for
    /// other decoders. Ids outside the vocabulary add nothing.
    pub(crate) fn decode_bytes_of(&self, id: TokenId) -> Option<&[u8]> {
        let table = self.decode_bytes.as_ref()?;
        Some(table.get(id.0 as usize).map_or(&[][..], |b| &b[..]))
    }

    /// The wrapped tokenizer (e.g. to `.save()` it as `tokenizer.json`).
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

/// The `<0xNN>` ids, if this tokenizer decodes them as raw bytes (checked on `<0x41>`, which must decode to "A").
fn byte_fallback_ids(inner: &tokenizers::Tokenizer) -> HashSet<u32> {
    let decodes_as_byte =
        inner.token_to_id("<0x41>").and_then(|id| inner.decode(&[id], false).ok()).is_some_and(|text| text == "A");
    if !decodes_as_byte {
        return HashSet::new();
    }
    (0..=255u32).filter_map(|b| inner.token_to_id(&format!("<0x{b:02X}>"))).collect()
}

/// What the byte-level decoder makes of each id: the byte of every character of the token's string, or the
/// string's own UTF-8 when a character lies outside the byte-level alphabet (as `tokenizers`' `ByteLevel` decoder).
fn decode_bytes(inner: &tokenizers::Tokenizer) -> Arc<[Box<[u8]>]> {
    let n = inner.get_vocab_size(true) as u32;
    let top = inner.get_added_tokens_decoder().keys().copied().max().map_or(n, |m| n.max(m + 1));
    (0..top)
        .map(|id| match inner.id_to_token(id) {
            Some(token) => byte_level::unspell(&token).unwrap_or_else(|| token.into_bytes()).into_boxed_slice(),
            None => Box::default(),
        })
        .collect()
}

#[allow(dead_code)]
fn assert_send_sync() {
    fn check<T: Send + Sync>() {}
    check::<Tokenizer>();
    check::<IncrementalDetokenizer>();
}
