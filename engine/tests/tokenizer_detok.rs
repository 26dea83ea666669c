//! Incremental detokenization: for random id sequences (whole words, emoji and CJK split across tokens, lone partial
//! bytes, special tokens) on the real SmolLM2 and Llama 3 tokenizers and on a small sentencepiece-style
//! byte-fallback tokenizer, the streamed pieces never take anything back (each running total is a prefix of the
//! final text) and, with `finish`, add up to exactly `decode(all ids)`, with and without skipping special tokens.

mod tokenizer_support;

use std::sync::{Arc, OnceLock};

use proptest::prelude::*;
use rserve_engine::tokenizer::{IncrementalDetokenizer, Tokenizer};
use rserve_engine::TokenId;
use tokenizer_support::*;

/// Id pools to draw from: any id, ids that are only part of a UTF-8 character, ids of emoji/CJK text, special ids.
struct Pools {
    tokenizer: Arc<Tokenizer>,
    partial: Vec<TokenId>,
    multibyte: Vec<TokenId>,
    special: Vec<TokenId>,
}

impl Pools {
    fn new(tokenizer: Arc<Tokenizer>) -> Self {
        let n = tokenizer.vocab_size() as u32;
        let partial: Vec<TokenId> = (0..n)
            .map(TokenId)
            .filter(|&id| tokenizer.token_bytes(id).is_some_and(|b| std::str::from_utf8(&b).is_err()))
            .collect();
        let multibyte = tokenizer.encode("👋🌍 😀👍🏽🧑‍💻👨‍👩‍👧‍👦🇫🇷 你好，世界！한국어 ∑∫√ 𝔘𝔫𝔦 ภาษาไทย", false).expect("encode");
        let special: Vec<TokenId> = (0..n).map(TokenId).filter(|&id| tokenizer.is_special_token(id)).take(64).collect();
        assert!(partial.len() > 10 && !special.is_empty(), "pools too small");
        Self { tokenizer, partial, multibyte, special }
    }

    fn strategy(&'static self) -> impl Strategy<Value = Vec<TokenId>> {
        let n = self.tokenizer.vocab_size() as u32;
        let id = prop_oneof![
            4 => (0..n).prop_map(TokenId),
            3 => proptest::sample::select(self.partial.clone()),
            3 => proptest::sample::select(self.multibyte.clone()),
            1 => proptest::sample::select(self.special.clone()),
        ];
        proptest::collection::vec(id, 0..80)
    }
}

/// Streams `ids` and checks the invariants; returns the streamed text.
fn stream(tok: &Arc<Tokenizer>, ids: &[TokenId], skip: bool) -> Result<(), TestCaseError> {
    let full = tok.decode(ids, skip).expect("decode");
    let mut detok = IncrementalDetokenizer::new(tok.clone(), skip);
    let mut out = String::new();
    for &id in ids {
        out.push_str(&detok.push(id).expect("push"));
        prop_assert!(full.starts_with(&out), "streamed {out:?} is not a prefix of {full:?} (ids {ids:?})");
    }
    out.push_str(&detok.finish().expect("finish"));
    prop_assert_eq!(&out, &full, "ids {:?}", ids);
    Ok(())
}

fn smollm2_pools() -> &'static Pools {
    static P: OnceLock<Pools> = OnceLock::new();
    P.get_or_init(|| Pools::new(smollm2()))
}

fn llama3_pools() -> &'static Pools {
    static P: OnceLock<Pools> = OnceLock::new();
    P.get_or_init(|| Pools::new(llama3()))
}

/// A small Llama-2-style tokenizer: `▁` for spaces, `<0xNN>` byte fallback, and the decoder chain
/// Replace(▁ -> space), ByteFallback, Fuse, Strip(one leading space).
fn byte_fallback_tokenizer() -> Arc<Tokenizer> {
    static TOK: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOK.get_or_init(|| {
        let mut vocab = serde_json::Map::new();
        for (i, t) in ["<unk>", "<s>", "</s>"].iter().enumerate() {
            vocab.insert((*t).into(), i.into());
        }
        for b in 0..=255u32 {
            vocab.insert(format!("<0x{b:02X}>"), (3 + b).into());
        }
        for w in ["▁", "▁▁", "▁Hello", "▁world", "a", "b", "▁a", ".", "!", "é", "▁caf", "é!", "你", "好"]
        {
            let id = vocab.len();
            vocab.insert(w.into(), id.into());
        }
        let added = |id: u32, content: &str| {
            serde_json::json!({"id": id, "content": content, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true})
        };
        let json = serde_json::json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": [added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")],
            "normalizer": null,
            "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": false},
            "post_processor": null,
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0}
            ]},
            "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                "vocab": vocab, "merges": []}
        });
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("tokenizer.json");
        std::fs::write(&path, json.to_string()).expect("write");
        Arc::new(Tokenizer::from_file(&path, None).expect("byte-fallback tokenizer"))
    })
    .clone()
}

fn byte_fallback_strategy() -> impl Strategy<Value = Vec<TokenId>> {
    let tok = byte_fallback_tokenizer();
    let n = tok.vocab_size() as u32;
    // Bytes of multibyte characters (é, €, 😀) and their pieces, so runs form, break and complete.
    let bytes: Vec<TokenId> = [0xC3u8, 0xA9, 0xE2, 0x82, 0xAC, 0xF0, 0x9F, 0x98, 0x80, 0x41, 0x20, 0xFF]
        .iter()
        .map(|b| tok.token_to_id(&format!("<0x{b:02X}>")).expect("byte token"))
        .collect();
    let id = prop_oneof![3 => (0..n).prop_map(TokenId), 5 => proptest::sample::select(bytes)];
    proptest::collection::vec(id, 0..60)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn smollm2_stream_equals_full_decode(ids in smollm2_pools().strategy()) {
        let tok = smollm2();
        stream(&tok, &ids, false)?;
        stream(&tok, &ids, true)?;
    }

    #[test]
    fn llama3_stream_equals_full_decode(ids in llama3_pools().strategy()) {
        let tok = llama3();
        stream(&tok, &ids, false)?;
        stream(&tok, &ids, true)?;
    }

    #[test]
    fn byte_fallback_stream_equals_full_decode(ids in byte_fallback_strategy()) {
        let tok = byte_fallback_tokenizer();
        stream(&tok, &ids, false)?;
        stream(&tok, &ids, true)?;
    }
}

#[test]
fn multibyte_characters_are_held_until_complete() {
    let tok = llama3();
    let ids = tok.encode("🧑‍💻 done", false).unwrap();
    let mut detok = IncrementalDetokenizer::new(tok.clone(), false);
    let mut pieces = Vec::new();
    for &id in &ids {
        pieces.push(detok.push(id).unwrap());
    }
    pieces.push(detok.finish().unwrap());
    assert!(pieces.iter().all(|p| !p.contains('\u{FFFD}')), "{pieces:?}");
    assert_eq!(pieces.concat(), "🧑‍💻 done");
    // The emoji needs several byte-level tokens; at least one push had to wait.
    assert!(pieces.iter().any(String::is_empty), "{pieces:?}");
}

#[test]
fn prompt_context_keeps_the_leading_space_of_the_first_generated_token() {
    let tok = byte_fallback_tokenizer();
    let id = |t: &str| tok.token_to_id(t).unwrap();
    let prompt = [id("<s>"), id("▁Hello")];
    let generated = [id("▁world"), id("!")];
    let mut detok = IncrementalDetokenizer::with_prompt(tok.clone(), &prompt, true).unwrap();
    let out = format!("{}{}", detok.push_all(&generated).unwrap(), detok.finish().unwrap());
    let all: Vec<TokenId> = prompt.iter().chain(&generated).copied().collect();
    let whole = tok.decode(&all, true).unwrap();
    let prompt_text = tok.decode(&prompt, true).unwrap();
    assert_eq!(out, whole[prompt_text.len()..]);
    // Without the prompt as context, the decoder would strip that space.
    let mut bare = IncrementalDetokenizer::new(tok.clone(), true);
    let bare_out = format!("{}{}", bare.push_all(&generated).unwrap(), bare.finish().unwrap());
    assert_eq!(bare_out, tok.decode(&generated, true).unwrap());
    assert_ne!(out, bare_out);
}

#[test]
fn window_stays_small_over_a_long_stream() {
    let tok = smollm2();
    let text = "The quick brown fox 🦊 jumps over the lazy dog 🐶; 速い茶色の狐。\n".repeat(200);
    let ids = tok.encode(&text, false).unwrap();
    let mut detok = IncrementalDetokenizer::new(tok.clone(), false);
    let mut out = String::new();
    let mut widest = 0;
    for &id in &ids {
        out.push_str(&detok.push(id).unwrap());
        widest = widest.max(detok.window_len());
    }
    out.push_str(&detok.finish().unwrap());
    assert_eq!(out, text);
    assert!(widest <= 12, "window grew to {widest} ids over {} ids", ids.len());
}

/// Streams `ids`, checking the prefix invariant; returns (text sent before `finish`, widest window, all text).
fn stream_measured(tok: &Arc<Tokenizer>, ids: &[TokenId]) -> (String, usize, String) {
    let full = tok.decode(ids, false).unwrap();
    let mut detok = IncrementalDetokenizer::new(tok.clone(), false);
    let (mut out, mut widest) = (String::new(), 0);
    for &id in ids {
        out.push_str(&detok.push(id).unwrap());
        assert!(full.starts_with(&out), "streamed {out:?} is not a prefix of {full:?}");
        widest = widest.max(detok.window_len());
    }
    let before_finish = out.clone();
    out.push_str(&detok.finish().unwrap());
    (before_finish, widest, out)
}

#[test]
fn long_runs_of_invalid_bytes_are_sent_with_a_bounded_window() {
    let tok = smollm2();
    // Tokens made only of UTF-8 continuation bytes: every prefix of their text ends in U+FFFD. A "€" (three bytes,
    // three tokens) every 37 tokens gives cuts that would split a character and must be skipped.
    let continuation: Vec<TokenId> = smollm2_pools()
        .partial
        .iter()
        .copied()
        .filter(|&id| tok.token_bytes(id).unwrap().iter().all(|b| (0x80..=0xBF).contains(b)))
        .collect();
    assert!(continuation.len() >= 32, "too few continuation-byte tokens");
    let euro = tok.encode("€", false).unwrap();
    let mut ids = Vec::new();
    for i in 0..400 {
        if i % 37 == 0 {
            ids.extend(&euro);
        }
        ids.push(continuation[(i * 7919) % continuation.len()]);
    }
    let (before_finish, widest, out) = stream_measured(&tok, &ids);
    assert_eq!(out, tok.decode(&ids, false).unwrap());
    assert!(!before_finish.is_empty(), "nothing was sent before finish");
    assert!(widest <= 40, "window grew to {widest} ids");
}

#[test]
fn long_valid_byte_fallback_runs_stream_before_finish() {
    let tok = byte_fallback_tokenizer();
    let euro: Vec<TokenId> = "€".bytes().map(|b| tok.token_to_id(&format!("<0x{b:02X}>")).unwrap()).collect();
    let ids: Vec<TokenId> = euro.iter().copied().cycle().take(300).collect();
    let (before_finish, widest, out) = stream_measured(&tok, &ids);
    assert_eq!(out, tok.decode(&ids, false).unwrap());
    assert!(!before_finish.is_empty(), "a long valid run must not wait for the end");
    assert!(widest <= 140, "window grew to {widest} ids");
}
