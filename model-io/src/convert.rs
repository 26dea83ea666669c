//! GGUF -> Hugging Face folder conversion (`rserve convert`): writes `model.safetensors` (HF names, q/k rows in HF
//! order, dequantized to f32 / bf16 / f16), `config.json`, `generation_config.json`, `tokenizer.json` and
//! `tokenizer_config.json` from one `.gguf` file, so the result loads through the safetensors path exactly as the
//! GGUF loads directly.

use std::path::Path;

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::DType;
use serde_json::{json, Map, Value as Json};

use crate::config::gguf_meta::{params_from_gguf, read_gguf_header};
use crate::config::{Architecture, ModelParams, RopeScaling};
use crate::{ModelError, Result};

fn torch_dtype_name(dtype: DType) -> Result<&'static str> {
    match dtype {
        DType::F32 => Ok("float32"),
        DType::BF16 => Ok("bfloat16"),
        DType::F16 => Ok("float16"),
        other => Err(ModelError::InvalidArgument(format!("cannot convert to {other:?}; use f32, bf16 or f16"))),
    }
}

fn token_ids_json(ids: &[u32]) -> Json {
    match ids {
        [] => Json::Null,
        [one] => json!(one),
        many => json!(many),
    }
}

/// The `config.json` transformers would write for a model with these parameters.
pub fn config_json(params: &ModelParams, dtype: DType) -> Result<Json> {
    let (arch, model_type) = match params.architecture {
        Architecture::Llama => ("LlamaForCausalLM", "llama"),
        Architecture::Mistral => ("MistralForCausalLM", "mistral"),
        Architecture::Qwen2 => ("Qwen2ForCausalLM", "qwen2"),
        Architecture::Qwen3 => ("Qwen3ForCausalLM", "qwen3"),
        // GGUF files of these are not read (config::gguf_meta), so no conversion writes them.
        other => return Err(ModelError::UnsupportedArchitecture(format!("{} (GGUF conversion)", other.hf_name()))),
    };
    let mut c = json!({
        "architectures": [arch],
        "model_type": model_type,
        "vocab_size": params.vocab_size,
        "hidden_size": params.hidden_size,
        "intermediate_size": params.intermediate_size,
        "num_hidden_layers": params.num_layers,
        "num_attention_heads": params.num_heads,
        "num_key_value_heads": params.num_kv_heads,
        "head_dim": params.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": params.max_position_embeddings,
        "rms_norm_eps": params.rms_norm_eps,
        "rope_theta": params.rope_theta,
        "rope_scaling": Json::Null,
        "tie_word_embeddings": params.tie_word_embeddings,
        "bos_token_id": params.bos_token_id,
        "eos_token_id": token_ids_json(&params.eos_token_ids),
        "torch_dtype": torch_dtype_name(dtype)?,
        "use_cache": true,
    });
    if let (Json::Object(map), Some(RopeScaling::Llama3(s))) = (&mut c, &params.rope_scaling) {
        map.insert(
            "rope_scaling".into(),
            json!({
                "rope_type": "llama3",
                "factor": s.factor,
                "low_freq_factor": s.low_freq_factor,
                "high_freq_factor": s.high_freq_factor,
                "original_max_position_embeddings": s.original_max_position_embeddings,
            }),
        );
    }
    if let Json::Object(map) = &mut c {
        match params.architecture {
            Architecture::Llama => {
                map.insert("attention_bias".into(), json!(params.attention_bias));
                map.insert("mlp_bias".into(), json!(false));
            }
            Architecture::Qwen2 => {
                map.insert("use_sliding_window".into(), json!(params.sliding_window.is_some()));
                map.insert("sliding_window".into(), json!(params.sliding_window));
            }
            Architecture::Mistral => {
                map.insert("sliding_window".into(), json!(params.sliding_window));
            }
            _ => {}
        }
    }
    Ok(c)
}

/// The `generation_config.json` for these parameters (bos / eos only: GGUF files carry no sampling defaults).
pub fn generation_config_json(params: &ModelParams) -> Json {
    json!({
        "bos_token_id": params.bos_token_id,
        "eos_token_id": token_ids_json(&params.eos_token_ids),
    })
}

fn meta_bool(content: &Content, key: &str) -> Option<bool> {
    match content.metadata.get(key) {
        Some(Value::Bool(b)) => Some(*b),
        _ => None,
    }
}

fn meta_str<'a>(content: &'a Content, key: &str) -> Option<&'a str> {
    match content.metadata.get(key) {
        Some(Value::String(s)) => Some(s.as_str()),
        _ => None,
    }
}

/// The text of token `key`'s id (`tokenizer.ggml.bos_token_id` ...) in the GGUF vocabulary.
fn special_token(content: &Content, key: &str) -> Option<String> {
    let id = content.metadata.get(key)?.to_u32().ok()? as usize;
    match content.metadata.get("tokenizer.ggml.tokens")? {
        Value::Array(tokens) => match tokens.get(id)? {
            Value::String(s) => Some(s.clone()),
            _ => None,
        },
        _ => None,
    }
}

/// The `tokenizer_config.json` for a GGUF: special token strings, `add_bos_token`, the chat template.
pub fn tokenizer_config_json(content: &Content, params: &ModelParams) -> Json {
    let mut map = Map::new();
    for (field, key) in [
        ("bos_token", "tokenizer.ggml.bos_token_id"),
        ("eos_token", "tokenizer.ggml.eos_token_id"),
        ("unk_token", "tokenizer.ggml.unknown_token_id"),
        ("pad_token", "tokenizer.ggml.padding_token_id"),
    ] {
        if let Some(tok) = special_token(content, key) {
            map.insert(field.into(), json!(tok));
        }
    }
    for (field, key) in
        [("add_bos_token", "tokenizer.ggml.add_bos_token"), ("add_eos_token", "tokenizer.ggml.add_eos_token")]
    {
        if let Some(b) = meta_bool(content, key) {
            map.insert(field.into(), json!(b));
        }
    }
    if let Some(t) = meta_str(content, "tokenizer.chat_template") {
        map.insert("chat_template".into(), json!(t));
    }
    map.insert("model_max_length".into(), json!(params.max_position_embeddings));
    map.insert("clean_up_tokenization_spaces".into(), json!(false));
    map.insert("tokenizer_class".into(), json!("PreTrainedTokenizerFast"));
    Json::Object(map)
}

fn write_json(path: &Path, value: &Json) -> Result<()> {
    let mut text = serde_json::to_string_pretty(value)
        .map_err(|e| ModelError::InvalidArgument(format!("cannot serialize {}: {e}", path.display())))?;
    text.push('\n');
    std::fs::write(path, text).map_err(|source| ModelError::Io { path: path.to_path_buf(), source })
}

/// Writes the tokenizer that the tokenizer module builds from the GGUF metadata as `tokenizer.json`.
fn write_tokenizer_json(content: &Content, path: &Path) -> Result<()> {
    let tokenizer = crate::tokenizer::Tokenizer::from_gguf(content)?;
    tokenizer
        .inner()
        .save(path, false)
        .map_err(|e| ModelError::Tokenizer(format!("cannot write {}: {e}", path.display())))
}

/// Converts a `.gguf` file into a Hugging Face model folder at `out_dir` (created if needed), with weights in
/// `dtype` (F32, BF16 or F16).
pub fn gguf_to_hf_dir(gguf: &Path, out_dir: &Path, dtype: DType) -> Result<()> {
    torch_dtype_name(dtype)?;
    let content = read_gguf_header(gguf)?;
    let params = params_from_gguf(&content)?;
    let weights = crate::weights::gguf::load_gguf(gguf, &params, dtype)?;
    std::fs::create_dir_all(out_dir).map_err(|source| ModelError::Io { path: out_dir.to_path_buf(), source })?;

    let st_path = out_dir.join("model.safetensors");
    candle_core::safetensors::save(&weights.into_tensors(), &st_path)
        .map_err(|e| ModelError::Weights(format!("cannot write {}: {e}", st_path.display())))?;
    write_json(&out_dir.join("config.json"), &config_json(&params, dtype)?)?;
    write_json(&out_dir.join("generation_config.json"), &generation_config_json(&params))?;
    write_json(&out_dir.join("tokenizer_config.json"), &tokenizer_config_json(&content, &params))?;
    write_tokenizer_json(&content, &out_dir.join("tokenizer.json"))?;
    Ok(())
}
