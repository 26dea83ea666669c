//! Shared helpers of the tokenizer and chat-template tests: their fixtures (`tests/fixtures/tokenizer/`), and how to
//! load the two reference tokenizers (SmolLM2 from its GGUF, Llama 3 from tokenizer.json, and Llama 3 re-described
//! as GGUF metadata) from the test models `rserve_tests` locates.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use candle_core::quantized::gguf_file::{Content, Value, VersionedMagic};
use rserve_engine::tokenizer::Tokenizer;

/// `<repo>/tests/fixtures/tokenizer/<name>`.
pub fn fixture_path(name: &str) -> PathBuf {
    rserve_tests::fixture("tokenizer").join(name)
}

/// A JSON fixture made by scripts/reference/tokenizer_refs.py.
pub fn fixture(name: &str) -> serde_json::Value {
    let path = fixture_path(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!("fixture {}: {e} (regenerate with scripts/reference/tokenizer_refs.py)", path.display())
    });
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()))
}

pub fn smollm2_gguf_content() -> &'static Content {
    static CONTENT: OnceLock<Content> = OnceLock::new();
    CONTENT.get_or_init(|| {
        let path = rserve_tests::smollm2_gguf();
        let mut file = std::fs::File::open(&path).expect("open GGUF");
        Content::read(&mut file).expect("read GGUF metadata")
    })
}

pub fn smollm2() -> Arc<Tokenizer> {
    static TOK: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOK.get_or_init(|| Arc::new(Tokenizer::from_gguf(smollm2_gguf_content()).expect("SmolLM2 tokenizer from GGUF")))
        .clone()
}

pub fn llama3() -> Arc<Tokenizer> {
    static TOK: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOK.get_or_init(|| {
        let dir = rserve_tests::llama3_tokenizer_dir();
        let tok = Tokenizer::from_file(&dir.join("tokenizer.json"), Some(&dir.join("tokenizer_config.json")))
            .expect("Llama 3 tokenizer.json");
        Arc::new(tok)
    })
    .clone()
}

/// GGUF metadata describing the Llama 3 tokenizer the way llama.cpp's converter writes it (`gpt2` model,
/// `llama-bpe` pre-tokenizer, added special tokens as control tokens, BOS added), built from tokenizer.json.
pub fn llama3_as_gguf_content() -> Content {
    let dir = rserve_tests::llama3_tokenizer_dir();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer.json")).expect("read tokenizer.json"))
            .expect("parse tokenizer.json");
    let mut by_id: HashMap<u64, (String, i32)> = HashMap::new();
    for (token, id) in json["model"]["vocab"].as_object().expect("vocab") {
        by_id.insert(id.as_u64().expect("id"), (token.clone(), 1));
    }
    for added in json["added_tokens"].as_array().expect("added_tokens") {
        let id = added["id"].as_u64().expect("id");
        let kind = if added["special"].as_bool() == Some(true) { 3 } else { 4 };
        by_id.insert(id, (added["content"].as_str().expect("content").to_owned(), kind));
    }
    let n = by_id.len() as u64;
    let (tokens, types): (Vec<Value>, Vec<Value>) = (0..n)
        .map(|id| {
            let (token, kind) = by_id.remove(&id).expect("dense ids");
            (Value::String(token), Value::I32(kind))
        })
        .unzip();
    let merges: Vec<Value> = json["model"]["merges"]
        .as_array()
        .expect("merges")
        .iter()
        .map(|m| match m {
            serde_json::Value::String(s) => Value::String(s.clone()),
            serde_json::Value::Array(pair) => {
                Value::String(format!("{} {}", pair[0].as_str().expect("merge"), pair[1].as_str().expect("merge")))
            }
            other => panic!("unexpected merge {other}"),
        })
        .collect();
    let reference = fixture("llama3.json");
    let id_of = |key: &str| Value::U32(reference[key].as_u64().expect("fixture id") as u32);
    let mut metadata = HashMap::new();
    metadata.insert("tokenizer.ggml.model".to_owned(), Value::String("gpt2".into()));
    metadata.insert("tokenizer.ggml.pre".to_owned(), Value::String("llama-bpe".into()));
    metadata.insert("tokenizer.ggml.tokens".to_owned(), Value::Array(tokens));
    metadata.insert("tokenizer.ggml.token_type".to_owned(), Value::Array(types));
    metadata.insert("tokenizer.ggml.merges".to_owned(), Value::Array(merges));
    metadata.insert("tokenizer.ggml.bos_token_id".to_owned(), id_of("bos_token_id"));
    metadata.insert("tokenizer.ggml.eos_token_id".to_owned(), id_of("eos_token_id"));
    metadata.insert("tokenizer.ggml.add_bos_token".to_owned(), Value::Bool(true));
    Content { magic: VersionedMagic::GgufV3, metadata, tensor_infos: HashMap::new(), tensor_data_offset: 0 }
}
