//! GGUF metadata -> `ModelParams`: the SmolLM2 GGUF against the config transformers derives from the same file
//! (tests/fixtures/weights/smollm2_q4_1_refs.json), and synthetic files for qwen2, tied / untied embeddings, extra
//! end-of-generation tokens and missing or unsupported metadata.

#[path = "weights_support/mod.rs"]
mod support;

use std::path::PathBuf;

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::GgmlDType;
use rserve_engine::config::gguf_meta::{params_from_gguf, params_from_gguf_file, read_gguf_header, resolve, GgufMeta};
use rserve_engine::config::Architecture;
use rserve_model_io::ModelError;
use rserve_tests::smollm2_gguf;
use support::*;

#[test]
fn smollm2_params_match_transformers() {
    let params = params_from_gguf_file(&smollm2_gguf()).unwrap();
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/weights/smollm2_q4_1_refs.json");
    let refs: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let c = &refs["config"];
    let u = |k: &str| c[k].as_u64().unwrap_or_else(|| panic!("{k}")) as usize;
    assert_eq!(params.architecture, Architecture::Llama);
    assert_eq!(params.vocab_size, u("vocab_size"));
    assert_eq!(params.hidden_size, u("hidden_size"));
    assert_eq!(params.intermediate_size, u("intermediate_size"));
    assert_eq!(params.num_layers, u("num_hidden_layers"));
    assert_eq!(params.num_heads, u("num_attention_heads"));
    assert_eq!(params.num_kv_heads, u("num_key_value_heads"));
    assert_eq!(params.head_dim, u("head_dim"));
    assert_eq!(params.max_position_embeddings, u("max_position_embeddings"));
    assert_eq!(params.tie_word_embeddings, c["tie_word_embeddings"].as_bool().unwrap());
    assert_eq!(params.bos_token_id, Some(u("bos_token_id") as u32));
    assert_eq!(params.eos_token_ids, vec![u("eos_token_id") as u32]);
    // transformers keeps the f32 value of the file (9.99999974e-06); rserve restores the decimal 1e-5. Equal as f32.
    assert_eq!(params.rms_norm_eps as f32, c["rms_norm_eps"].as_f64().unwrap() as f32);
    assert_eq!(params.rope_theta, c["rope_theta"].as_f64().unwrap());
    assert_eq!(params.rope_scaling, None);
    assert!(!params.attention_bias);
    assert_eq!(params.torch_dtype, None);
}

fn write_tiny(arch: &str, architecture: Architecture, tie: bool) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let params = tiny_params(architecture, tie);
    let path = dir.path().join("m.gguf");
    write_gguf(&path, arch, &params, &random_hf_tensors(&params), |_| GgmlDType::F32);
    (dir, path)
}

#[test]
fn qwen2_and_tied_embeddings() {
    let (_d, path) = write_tiny("qwen2", Architecture::Qwen2, false);
    let p = params_from_gguf_file(&path).unwrap();
    assert_eq!(p, tiny_params(Architecture::Qwen2, false));
    assert!(p.attention_bias && !p.tie_word_embeddings);
    let (_d, path) = write_tiny("llama", Architecture::Llama, true);
    let p = params_from_gguf_file(&path).unwrap();
    assert_eq!(p, tiny_params(Architecture::Llama, true));
}

fn meta_of(path: &std::path::Path) -> (Content, GgufMeta) {
    let content = read_gguf_header(path).unwrap();
    let meta = GgufMeta::from_content(&content).unwrap();
    (content, meta)
}

#[test]
fn end_of_turn_tokens_join_eos() {
    let (_d, path) = write_tiny("llama", Architecture::Llama, true);
    let (mut content, _) = meta_of(&path);
    content.metadata.insert("tokenizer.ggml.eot_token_id".into(), Value::U32(7));
    content.metadata.insert("tokenizer.ggml.eom_token_id".into(), Value::U32(2));
    assert_eq!(params_from_gguf(&content).unwrap().eos_token_ids, vec![2, 7]);
    content.metadata.insert("tokenizer.ggml.eot_token_id".into(), Value::U32(640));
    let err = params_from_gguf(&content).unwrap_err().to_string();
    assert!(err.contains("640"), "{err}");
}

#[test]
fn missing_or_unsupported_metadata() {
    let (_d, path) = write_tiny("llama", Architecture::Llama, true);
    let (_, meta) = meta_of(&path);

    let mut m = meta.clone();
    m.block_count = None;
    match resolve(&m) {
        Err(ModelError::Config(msg)) => assert!(msg.contains("llama.block_count"), "{msg}"),
        other => panic!("{other:?}"),
    }
    let mut m = meta.clone();
    m.head_count_kv = Some(3);
    assert!(resolve(&m).unwrap_err().to_string().contains("head_count_kv"));
    let mut m = meta.clone();
    m.rope_dimension_count = Some(32);
    assert!(resolve(&m).unwrap_err().to_string().contains("partial rotary"));
    let mut m = meta.clone();
    m.architecture = "phi3".into();
    assert!(matches!(resolve(&m), Err(ModelError::UnsupportedArchitecture(ref a)) if a.contains("phi3")));

    let (mut content, _) = meta_of(&path);
    content.metadata.remove("general.architecture");
    assert!(params_from_gguf(&content).unwrap_err().to_string().contains("general.architecture"));
    let (mut content, _) = meta_of(&path);
    content.metadata.insert("llama.embedding_length".into(), Value::String("wide".into()));
    assert!(params_from_gguf(&content).unwrap_err().to_string().contains("llama.embedding_length"));
}
