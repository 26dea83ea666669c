//! Tokenizer parity with Hugging Face: every line of a mixed corpus (unicode, emoji, CJK, code, whitespace runs,
//! special tokens in text, digits) must encode to exactly the ids `transformers.AutoTokenizer` gives, and decode to
//! the same text, for SmolLM2 built from its GGUF, Llama 3 from tokenizer.json, and Llama 3 re-described as GGUF
//! metadata (`llama-bpe`). References: tests/fixtures/tokenizer/{smollm2_gguf,llama3}.json from
//! scripts/reference/tokenizer_refs.py.

mod tokenizer_support;

use rserve_engine::tokenizer::Tokenizer;
use rserve_engine::TokenId;
use serde_json::Value;
use tokenizer_support::*;

fn ids(v: &Value) -> Vec<TokenId> {
    v.as_array().expect("id list").iter().map(|x| TokenId(x.as_u64().expect("id") as u32)).collect()
}

/// Checks every corpus line and every token's text/bytes; returns all mismatches at once.
fn check_against(tok: &Tokenizer, reference: &Value) -> Vec<String> {
    let mut bad = Vec::new();
    let cases = reference["cases"].as_array().expect("cases");
    for case in cases {
        let text = case["text"].as_str().expect("text");
        let want = ids(&case["ids"]);
        let want_special = ids(&case["ids_with_special"]);
        let got = tok.encode(text, false).expect("encode");
        if got != want {
            bad.push(format!("encode {text:?}: got {got:?}, want {want:?}"));
        }
        let got = tok.encode(text, true).expect("encode");
        if got != want_special {
            bad.push(format!("encode+special {text:?}: got {got:?}, want {want_special:?}"));
        }
        for (skip, key) in [(false, "decode"), (true, "decode_skip_special")] {
            let got = tok.decode(&want_special, skip).expect("decode");
            let want = case[key].as_str().expect("decode text");
            if got != want {
                bad.push(format!("{key} {text:?}: got {got:?}, want {want:?}"));
            }
        }
    }
    for (id, detail) in reference["tokens"].as_object().expect("tokens") {
        let id = TokenId(id.parse().expect("id"));
        let want_text = detail["decode"].as_str().expect("decode");
        let want_token = detail["token"].as_str().expect("token");
        let want_hex = detail["bytes_hex"].as_str().expect("bytes_hex");
        if tok.token_to_string(id).as_deref() != Some(want_text) {
            bad.push(format!("token_to_string({id}): got {:?}, want {want_text:?}", tok.token_to_string(id)));
        }
        if tok.id_to_token(id).as_deref() != Some(want_token) {
            bad.push(format!("id_to_token({id}): got {:?}, want {want_token:?}", tok.id_to_token(id)));
        }
        let got_hex: Option<String> = tok.token_bytes(id).map(|b| b.iter().map(|x| format!("{x:02x}")).collect());
        if got_hex.as_deref() != Some(want_hex) {
            bad.push(format!("token_bytes({id}): got {got_hex:?}, want {want_hex}"));
        }
    }
    bad
}

fn check_specials(tok: &Tokenizer, reference: &Value) {
    assert_eq!(tok.vocab_size() as u64, reference["vocab_size"].as_u64().unwrap(), "vocab size");
    assert_eq!(tok.bos_token().as_deref(), reference["bos_token"].as_str(), "bos token");
    assert_eq!(tok.eos_token().as_deref(), reference["eos_token"].as_str(), "eos token");
    assert_eq!(tok.bos_token_id().map(|id| u64::from(id.0)), reference["bos_token_id"].as_u64(), "bos id");
    let eos = TokenId(reference["eos_token_id"].as_u64().unwrap() as u32);
    assert_eq!(tok.eos_token_ids().first(), Some(&eos), "first eos id");
    // Whether BOS is added must agree with the reference's own encodings of a non-empty line.
    let case = &reference["cases"][0];
    let reference_adds_bos = ids(&case["ids_with_special"]).first() != ids(&case["ids"]).first();
    assert_eq!(tok.adds_bos_token(), reference_adds_bos, "adds BOS");
}

/// `tok` against a Hugging Face fixture: special tokens, then every line.
fn matches_reference(what: &str, tok: &Tokenizer, fixture_name: &str) {
    let reference = fixture(fixture_name);
    check_specials(tok, &reference);
    assert_clean(what, check_against(tok, &reference), &reference);
}

fn assert_clean(what: &str, bad: Vec<String>, reference: &Value) {
    let n = reference["cases"].as_array().unwrap().len();
    assert!(bad.is_empty(), "{what}: {} mismatches over {n} lines:\n{}", bad.len(), bad.join("\n"));
    eprintln!("{what}: {n} lines and {} tokens match Hugging Face", reference["tokens"].as_object().unwrap().len());
}

#[test]
fn smollm2_from_gguf_matches_hugging_face() {
    matches_reference("SmolLM2 (GGUF)", &smollm2(), "smollm2_gguf.json");
}

#[test]
fn llama3_tokenizer_json_matches_hugging_face() {
    matches_reference("Llama 3 (tokenizer.json)", &llama3(), "llama3.json");
}

#[test]
fn llama3_described_as_gguf_llama_bpe_matches_hugging_face() {
    matches_reference(
        "Llama 3 (GGUF llama-bpe)",
        &Tokenizer::from_gguf(&llama3_as_gguf_content()).expect("Llama 3 from GGUF metadata"),
        "llama3.json",
    );
}

#[test]
fn gguf_tokenizer_saved_as_tokenizer_json_reloads_identically() {
    let reference = fixture("smollm2_gguf.json");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    smollm2().inner().save(&path, false).expect("save tokenizer.json");
    let reloaded = Tokenizer::from_file(&path, None).expect("reload");
    assert_clean("SmolLM2 saved and reloaded", check_against(&reloaded, &reference), &reference);
}

#[test]
fn unknown_gguf_pre_tokenizer_is_refused_not_guessed() {
    let mut content = llama3_as_gguf_content();
    content.metadata.insert(
        "tokenizer.ggml.pre".into(),
        candle_core::quantized::gguf_file::Value::String("some-future-bpe".into()),
    );
    let err = Tokenizer::from_gguf(&content).expect_err("unknown pre must fail").to_string();
    assert!(err.contains("some-future-bpe") && err.contains("not supported"), "{err}");
}

#[test]
fn gguf_without_tokenizer_is_a_clear_error() {
    let mut content = llama3_as_gguf_content();
    content.metadata.remove("tokenizer.ggml.model");
    let err = Tokenizer::from_gguf(&content).expect_err("no tokenizer").to_string();
    assert!(err.contains("tokenizer.ggml.model"), "{err}");
    let mut content = llama3_as_gguf_content();
    content.metadata.insert(
        "tokenizer.ggml.merges".into(),
        candle_core::quantized::gguf_file::Value::Array(vec![candle_core::quantized::gguf_file::Value::U8(1)]),
    );
    assert!(Tokenizer::from_gguf(&content).is_err());
}

#[test]
fn chat_prompt_encoding_never_doubles_bos() {
    let tok = llama3();
    let bos = tok.bos_token().unwrap();
    let bos_id = tok.bos_token_id().unwrap();
    let with_bos = format!("{bos}Hello");
    let ids = tok.encode_chat_prompt(&with_bos).unwrap();
    assert_eq!(ids.iter().filter(|&&i| i == bos_id).count(), 1, "{ids:?}");
    assert_eq!(ids, tok.encode(&with_bos, false).unwrap());
    // A template that wrote no BOS gets the tokenizer's own.
    assert_eq!(tok.encode_chat_prompt("Hello").unwrap(), tok.encode("Hello", true).unwrap());
}

#[test]
fn tokenizer_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Tokenizer>();
    check::<rserve_engine::tokenizer::IncrementalDetokenizer>();
}
