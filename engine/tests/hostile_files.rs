//! Hostile model files (issue #28 item 4): property tests that feed corrupted GGUF files, safetensors files and
//! config.json texts to the loaders. Every input must give a model or a clear error: never a panic, an allocation
//! sized by a lying length field, or a read past the file. The cases are few and the files tiny, so the suite runs in
//! seconds; the inputs that once crashed are pinned as named regression tests below.

#[path = "weights_support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device, Tensor};
use proptest::prelude::*;
use rserve_engine::config::gguf_meta::{params_from_gguf_file, read_gguf_header};
use rserve_engine::config::hf::parse_config_json;
use rserve_engine::config::{Architecture, ModelDims, ModelParams};
use rserve_engine::tokenizer::Tokenizer;
use rserve_engine::weights::gguf::load_gguf;
use rserve_engine::weights::safetensors::load_safetensors;
use rserve_engine::weights::safetensors_param_count;
use support::{random_hf_tensors, tiny_params, write_gguf};

/// A llama of a few KB: hidden 32, 2 layers, vocabulary 16.
fn micro_params() -> ModelParams {
    let mut p = tiny_params(Architecture::Llama, true);
    p.dims = ModelDims {
        vocab_size: 16,
        hidden_size: 32,
        intermediate_size: 64,
        num_layers: 2,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 8,
    };
    p.attn_scale = 1.0 / 8f64.sqrt();
    p
}

fn valid_gguf() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    let params = micro_params();
    write_gguf(&path, "llama", &params, &random_hf_tensors(&params), |name| {
        if name.contains("norm") {
            GgmlDType::F32
        } else {
            GgmlDType::Q8_0
        }
    });
    std::fs::read(path).unwrap()
}

fn valid_safetensors() -> (Vec<u8>, ModelParams) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    let params = micro_params();
    let tensors: HashMap<String, Tensor> = random_hf_tensors(&params);
    candle_core::safetensors::save(&tensors, &path).unwrap();
    (std::fs::read(path).unwrap(), params)
}

/// One way to damage a file.
#[derive(Debug, Clone)]
enum Damage {
    /// Cut the file to this fraction of its length.
    Truncate(f64),
    /// Write this little-endian u64 at this fraction of the file (a lying length, count, offset or dimension).
    Word(f64, u64),
    /// XOR these bytes at these fractions.
    Flip(Vec<(f64, u8)>),
}

fn damage() -> impl Strategy<Value = Damage> {
    let lie = prop_oneof![
        Just(0u64),
        Just(1u64),
        Just(u64::MAX),
        Just(u64::MAX / 2 + 1),
        Just(1u64 << 32),
        Just(1u64 << 40),
        Just(u32::MAX as u64),
        any::<u64>(),
    ];
    prop_oneof![
        (0.0f64..1.0).prop_map(Damage::Truncate),
        (0.0f64..1.0, lie).prop_map(|(at, v)| Damage::Word(at, v)),
        prop::collection::vec((0.0f64..1.0, 1u8..=255), 1..8).prop_map(Damage::Flip),
    ]
}

/// Damages mostly the header (the first `header` bytes), where lengths and offsets live, else anywhere.
fn apply(bytes: &[u8], d: &Damage, header: usize) -> Vec<u8> {
    let mut b = bytes.to_vec();
    let len = b.len();
    let span = |f: f64| ((f * header.min(len) as f64) as usize).min(len.saturating_sub(1));
    match d {
        Damage::Truncate(f) => b.truncate((f * bytes.len() as f64) as usize),
        Damage::Word(f, v) => {
            let at = span(*f).min(len.saturating_sub(8));
            let n = 8.min(len - at);
            b[at..at + n].copy_from_slice(&v.to_le_bytes()[..n]);
        }
        Damage::Flip(flips) => {
            for (f, x) in flips {
                let at = span(*f);
                b[at] ^= x;
            }
        }
    }
    b
}

/// Loads a GGUF file the way start-up does: header, parameters, tokenizer, weights. Any error is fine.
fn load_all_gguf(path: &Path) {
    let Ok(content) = read_gguf_header(path) else { return };
    let _ = Tokenizer::from_gguf(&content);
    let Ok(params) = params_from_gguf_file(path) else { return };
    let _ = load_gguf(path, &params, DType::F32);
}

/// Damaged files per property: each case loads a whole (small) model file, so CI runs fewer than proptest's 256.
const CASES: u32 = 96;

proptest! {
    #![proptest_config(ProptestConfig { cases: CASES, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn damaged_gguf_files_load_or_fail_cleanly(d in damage()) {
        thread_local!(static VALID: Vec<u8> = valid_gguf());
        let bad = VALID.with(|v| apply(v, &d, 2048));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.gguf");
        std::fs::write(&path, bad).unwrap();
        load_all_gguf(&path);
    }

    #[test]
    fn damaged_safetensors_files_load_or_fail_cleanly(d in damage()) {
        thread_local!(static VALID: (Vec<u8>, ModelParams) = valid_safetensors());
        let (bad, params) = VALID.with(|(v, p)| (apply(v, &d, 4096), p.clone()));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.safetensors");
        std::fs::write(&path, bad).unwrap();
        let _ = safetensors_param_count(std::slice::from_ref(&path));
        let _ = load_safetensors(std::slice::from_ref(&path), &params, DType::F32);
    }

    #[test]
    fn hostile_config_json_parses_or_fails_cleanly(cfg in config_json()) {
        if let Ok(p) = parse_config_json(&cfg.to_string()) {
            // A config that is accepted has sizes the rest of the engine can divide by and multiply.
            prop_assert!(p.num_heads > 0 && p.num_kv_heads > 0 && p.head_dim > 0 && p.num_layers > 0, "{p:?}");
            prop_assert!(p.num_heads % p.num_kv_heads == 0, "{p:?}");
        }
    }
}

/// config.json texts with every size field drawn from hostile values (0, 1, huge, negative, wrong types).
fn config_json() -> impl Strategy<Value = serde_json::Value> {
    let num = prop_oneof![
        Just(serde_json::json!(0)),
        Just(serde_json::json!(1)),
        Just(serde_json::json!(-1)),
        Just(serde_json::json!(u64::MAX)),
        Just(serde_json::json!(1u64 << 40)),
        Just(serde_json::json!(1.5)),
        Just(serde_json::json!("32")),
        Just(serde_json::Value::Null),
        (1u64..300).prop_map(|v| serde_json::json!(v)),
    ];
    let arch = prop::sample::select(vec![
        "LlamaForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",
        "MistralForCausalLM",
        "Gemma2ForCausalLM",
        "Gemma3ForCausalLM",
        "Phi3ForCausalLM",
        "MixtralForCausalLM",
        "Qwen3MoeForCausalLM",
    ]);
    let keys = [
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "vocab_size",
        "max_position_embeddings",
        "sliding_window",
        "num_local_experts",
        "num_experts_per_tok",
        "num_experts",
        "moe_intermediate_size",
        "rope_theta",
        "rms_norm_eps",
    ];
    let rope = prop_oneof![
        Just(serde_json::Value::Null),
        Just(serde_json::json!({"rope_type": "llama3", "factor": 0, "low_freq_factor": 0, "high_freq_factor": 0,
                                "original_max_position_embeddings": 0})),
        Just(serde_json::json!({"rope_type": "yarn", "factor": -1, "original_max_position_embeddings": 0})),
        Just(serde_json::json!({"rope_type": "longrope", "short_factor": [], "long_factor": [1.0]})),
        Just(serde_json::json!({"rope_type": "dynamic", "factor": 1e308})),
        Just(serde_json::json!({"type": "linear", "factor": 0})),
    ];
    let layer_types = prop_oneof![
        Just(serde_json::Value::Null),
        Just(serde_json::json!([])),
        Just(serde_json::json!(["sliding_attention"])),
        Just(serde_json::json!(["full_attention", "bogus"])),
    ];
    (arch, prop::collection::vec(num, keys.len()), rope, layer_types, 0u32..(1 << keys.len())).prop_map(
        move |(arch, values, rope, layer_types, keep)| {
            let mut m = serde_json::Map::new();
            m.insert("architectures".into(), serde_json::json!([arch]));
            m.insert("model_type".into(), serde_json::json!(arch.trim_end_matches("ForCausalLM").to_lowercase()));
            for (i, (k, v)) in keys.iter().zip(values).enumerate() {
                if keep & (1 << i) != 0 {
                    m.insert((*k).into(), v);
                }
            }
            if !rope.is_null() {
                m.insert("rope_scaling".into(), rope);
            }
            if !layer_types.is_null() {
                m.insert("layer_types".into(), layer_types);
            }
            serde_json::Value::Object(m)
        },
    )
}

#[test]
fn the_valid_files_load() {
    // The properties damage these files: they must load when intact, or the damage proves nothing.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ok.gguf");
    std::fs::write(&path, valid_gguf()).unwrap();
    let params = params_from_gguf_file(&path).unwrap();
    assert_eq!(params.hidden_size, 32);
    load_gguf(&path, &params, DType::F32).unwrap();
    let (bytes, params) = valid_safetensors();
    let path = dir.path().join("ok.safetensors");
    std::fs::write(&path, bytes).unwrap();
    load_safetensors(std::slice::from_ref(&path), &params, DType::F32).unwrap();
    let _ = Device::Cpu;
}

/// Regression: `general.alignment = 0` made candle's header reader divide by zero (a panic while reading the file).
#[test]
fn gguf_alignment_zero_is_an_error() {
    use candle_core::quantized::gguf_file::{self, Value};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("align0.gguf");
    let arch = Value::String("llama".into());
    let align = Value::U32(0);
    let mut f = std::fs::File::create(&path).unwrap();
    gguf_file::write(&mut f, &[("general.architecture", &arch), ("general.alignment", &align)], &[]).unwrap();
    drop(f);
    let err = read_gguf_header(&path).unwrap_err().to_string();
    assert!(err.contains("alignment"), "{err}");
    load_all_gguf(&path);
}

/// A llama config.json whose one lie is `key: value`.
fn lying_config(key: &str, value: u64) -> String {
    let mut cfg = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 16,
        "max_position_embeddings": 128, "rms_norm_eps": 1e-5
    });
    cfg[key] = serde_json::json!(value);
    cfg.to_string()
}

/// Regression: sizes are bounded before anything is allocated per layer or per row. A config.json with
/// `num_hidden_layers: 2^40` made the resolver and the planner build per-layer vectors of a terabyte (the process
/// aborted instead of reporting the corrupt file); `intermediate_size` left out with a huge `hidden_size` overflowed
/// the planner's `4 x hidden` default.
#[test]
fn config_sizes_beyond_any_model_are_errors() {
    use rserve_engine::plan::shape::ModelShape;
    assert!(parse_config_json(&lying_config("hidden_size", 32)).is_ok());
    for (key, value) in [
        ("num_hidden_layers", 1u64 << 40),
        ("vocab_size", 1 << 40),
        ("hidden_size", u64::MAX),
        ("intermediate_size", 1 << 40),
        ("num_attention_heads", 1 << 40),
    ] {
        let text = lying_config(key, value);
        let err = parse_config_json(&text).unwrap_err().to_string();
        assert!(err.contains("larger than any model") || err.contains("multiple"), "{key}: {err}");
        assert!(ModelShape::from_config_json(&text).is_err(), "{key}: the planner accepted it");
    }
    let mut no_ffn: serde_json::Value = serde_json::from_str(&lying_config("hidden_size", u64::MAX)).unwrap();
    no_ffn.as_object_mut().unwrap().remove("intermediate_size");
    assert!(ModelShape::from_config_json(&no_ffn.to_string()).is_err());
}

/// Regression: a GGUF header with `llama.block_count = u32::MAX` (4 billion layers) is refused before per-layer
/// vectors are built, by the loader and by the planner.
#[test]
fn gguf_sizes_beyond_any_model_are_errors() {
    use candle_core::quantized::gguf_file::{self, Value};
    use rserve_engine::plan::shape_gguf::shape_from_gguf;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("layers.gguf");
    let meta: Vec<(&str, Value)> = vec![
        ("general.architecture", Value::String("llama".into())),
        ("llama.block_count", Value::U32(u32::MAX)),
        ("llama.context_length", Value::U32(128)),
        ("llama.embedding_length", Value::U32(32)),
        ("llama.feed_forward_length", Value::U32(64)),
        ("llama.attention.head_count", Value::U32(4)),
        ("llama.attention.head_count_kv", Value::U32(2)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.tokens", Value::Array((0..16).map(|i| Value::String(format!("<t{i}>"))).collect())),
    ];
    let refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (*k, v)).collect();
    let mut f = std::fs::File::create(&path).unwrap();
    gguf_file::write(&mut f, &refs, &[]).unwrap();
    drop(f);
    let err = params_from_gguf_file(&path).unwrap_err().to_string();
    assert!(err.contains("num_layers") && err.contains("larger than any model"), "{err}");
    let content = read_gguf_header(&path).unwrap();
    assert!(shape_from_gguf(&content).is_err());
    load_all_gguf(&path);
}
