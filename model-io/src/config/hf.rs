//! Hugging Face `config.json` -> `ModelParams`.
//!
//! `RawConfig` mirrors the file (every key optional where transformers has a default); `parse_config_json` checks it
//! and resolves defaults the way transformers' config classes of each architecture do (`LlamaConfig`,
//! `MistralConfig`, `Qwen2Config`, `Qwen3Config`, `Gemma2Config`, `Gemma3TextConfig`, `Phi3Config`). Both the older
//! top-level `rope_theta` / `rope_scaling` keys and transformers 5's `rope_parameters` (also per layer type, Gemma 3)
//! are read.

use std::path::Path;

use serde::Deserialize;

use super::{
    Architecture, LayerAttention, Llama3RopeScaling, LongRopeScaling, ModelDims, ModelParams, MoeParams, Rope,
    RopeScaling, YarnRopeScaling,
};
use crate::{ModelError, Result};
use rserve_backend::Activation;

/// `config.json` as written by transformers, limited to the keys the llama family uses.
#[derive(Debug, Clone, Deserialize)]
pub struct RawConfig {
    #[serde(default)]
    pub architectures: Option<Vec<String>>,
    #[serde(default)]
    pub model_type: Option<String>,
    #[serde(default)]
    pub vocab_size: Option<usize>,
    #[serde(default)]
    pub hidden_size: Option<usize>,
    #[serde(default)]
    pub intermediate_size: Option<usize>,
    #[serde(default)]
    pub num_hidden_layers: Option<usize>,
    #[serde(default)]
    pub num_attention_heads: Option<usize>,
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    #[serde(default)]
    pub head_dim: Option<usize>,
    #[serde(default)]
    pub rms_norm_eps: Option<f64>,
    #[serde(default)]
    pub rope_theta: Option<f64>,
    #[serde(default)]
    pub rope_scaling: Option<RawRopeScaling>,
    /// transformers >= 5 stores `rope_theta` and the scaling parameters here; Gemma 3 keeps one such object per
    /// layer type (`full_attention`, `sliding_attention`).
    #[serde(default)]
    pub rope_parameters: Option<serde_json::Value>,
    /// Gemma 3 (older files): the RoPE base of the sliding-window layers.
    #[serde(default)]
    pub rope_local_base_freq: Option<f64>,
    /// Phi-3: the pretraining length LongRoPE scales from (also inside `rope_scaling` in newer files).
    #[serde(default)]
    pub original_max_position_embeddings: Option<usize>,
    #[serde(default)]
    pub partial_rotary_factor: Option<f64>,
    #[serde(default)]
    pub max_position_embeddings: Option<usize>,
    #[serde(default)]
    pub tie_word_embeddings: Option<bool>,
    #[serde(default)]
    pub attention_bias: Option<bool>,
    #[serde(default)]
    pub bos_token_id: Option<TokenIds>,
    #[serde(default)]
    pub eos_token_id: Option<TokenIds>,
    #[serde(default)]
    pub torch_dtype: Option<String>,
    #[serde(default)]
    pub dtype: Option<String>,
    /// `None`: key absent; `Some(None)`: explicitly `null` (Mistral distinguishes the two).
    #[serde(default, deserialize_with = "present")]
    pub sliding_window: Option<Option<usize>>,
    #[serde(default)]
    pub use_sliding_window: Option<bool>,
    /// Qwen2/3: layers from this index on use the sliding window (when `use_sliding_window`).
    #[serde(default)]
    pub max_window_layers: Option<usize>,
    /// `sliding_attention` / `full_attention` per layer (newer Gemma, Qwen, Mistral files).
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    /// Gemma 3 (older files): every `sliding_window_pattern`-th layer is global.
    #[serde(default)]
    pub sliding_window_pattern: Option<usize>,
    #[serde(default)]
    pub hidden_act: Option<String>,
    /// Gemma's name for `hidden_act`.
    #[serde(default)]
    pub hidden_activation: Option<String>,
    #[serde(default)]
    pub query_pre_attn_scalar: Option<f64>,
    #[serde(default)]
    pub attn_logit_softcapping: Option<f64>,
    #[serde(default)]
    pub final_logit_softcapping: Option<f64>,
    /// Mixtral's expert count (transformers 5 also writes it for Qwen3-MoE).
    #[serde(default)]
    pub num_local_experts: Option<usize>,
    /// Qwen3-MoE's expert count.
    #[serde(default)]
    pub num_experts: Option<usize>,
    #[serde(default)]
    pub num_experts_per_tok: Option<usize>,
    #[serde(default)]
    pub moe_intermediate_size: Option<usize>,
    #[serde(default)]
    pub norm_topk_prob: Option<bool>,
    /// Qwen3-MoE: every `decoder_sparse_step`-th layer has experts ...
    #[serde(default)]
    pub decoder_sparse_step: Option<usize>,
    /// ... except these, which keep a dense MLP.
    #[serde(default)]
    pub mlp_only_layers: Option<Vec<usize>>,
    /// gpt-oss's clamped SwiGLU.
    #[serde(default)]
    pub swiglu_alpha: Option<f64>,
    #[serde(default)]
    pub swiglu_limit: Option<f64>,
}

/// `rope_scaling` (or `rope_parameters`): `type` in older files, `rope_type` in newer ones.
#[derive(Debug, Clone, Deserialize)]
pub struct RawRopeScaling {
    #[serde(default)]
    pub rope_type: Option<String>,
    #[serde(default, rename = "type")]
    pub type_: Option<String>,
    #[serde(default)]
    pub rope_theta: Option<f64>,
    #[serde(default)]
    pub factor: Option<f64>,
    #[serde(default)]
    pub low_freq_factor: Option<f64>,
    #[serde(default)]
    pub high_freq_factor: Option<f64>,
    #[serde(default)]
    pub original_max_position_embeddings: Option<usize>,
    #[serde(default)]
    pub short_factor: Option<Vec<f64>>,
    #[serde(default)]
    pub long_factor: Option<Vec<f64>>,
    #[serde(default)]
    pub beta_fast: Option<f64>,
    #[serde(default)]
    pub beta_slow: Option<f64>,
    #[serde(default)]
    pub mscale: Option<f64>,
    #[serde(default)]
    pub mscale_all_dim: Option<f64>,
    #[serde(default)]
    pub attention_factor: Option<f64>,
    #[serde(default)]
    pub truncate: Option<bool>,
}

/// A token id field that may be one id or a list of ids (`eos_token_id`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum TokenIds {
    One(u32),
    Many(Vec<u32>),
}

impl TokenIds {
    fn into_vec(self) -> Vec<u32> {
        match self {
            TokenIds::One(id) => vec![id],
            TokenIds::Many(ids) => ids,
        }
    }
}

/// Deserializes a key that is present (possibly `null`) as `Some(value)`; absent keys take the field default `None`.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Option<Option<usize>>, D::Error> {
    Option::<usize>::deserialize(d).map(Some)
}

/// Reads and parses a `config.json` file.
pub fn parse_config_file(path: &Path) -> Result<ModelParams> {
    read_config_file(path, parse_config_json)
}

/// Reads a `config.json` and parses its text with `parse`; configuration errors name the file.
pub fn read_config_file<T>(path: &Path, parse: impl FnOnce(&str) -> Result<T>) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io { path: path.to_path_buf(), source })?;
    parse(&text).map_err(|e| match e {
        ModelError::Config(msg) => ModelError::Config(format!("{}: {msg}", path.display())),
        other => other,
    })
}

/// Parses the text of a `config.json` into checked `ModelParams`.
pub fn parse_config_json(text: &str) -> Result<ModelParams> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| ModelError::Config(format!("config.json is not valid: {e}")))?;
    let value = language_model_config(value)?;
    let raw: RawConfig =
        serde_json::from_value(value).map_err(|e| ModelError::Config(format!("config.json is not valid: {e}")))?;
    resolve(raw)
}

/// A multimodal checkpoint whose language model rserve serves on its own (`Gemma3ForConditionalGeneration`, the
/// class of Gemma 3's 4B-27B checkpoints): its `text_config`, with transformers' `Gemma3TextConfig` defaults for the
/// keys the nested config leaves out and the special tokens of the outer config. Other configs pass unchanged.
fn language_model_config(mut value: serde_json::Value) -> Result<serde_json::Value> {
    let first = value.get("architectures").and_then(|a| a.get(0)).and_then(|a| a.as_str());
    if first != Some("Gemma3ForConditionalGeneration") {
        return Ok(value);
    }
    let Some(serde_json::Value::Object(mut text)) = value.get_mut("text_config").map(serde_json::Value::take) else {
        return Err(ModelError::Config("Gemma3ForConditionalGeneration config has no `text_config` object".into()));
    };
    text.insert("architectures".into(), serde_json::json!(["Gemma3ForCausalLM"]));
    text.entry("vocab_size").or_insert(serde_json::json!(262_208));
    text.entry("max_position_embeddings").or_insert(serde_json::json!(131_072));
    for key in ["bos_token_id", "eos_token_id", "torch_dtype", "dtype", "tie_word_embeddings"] {
        if let Some(v) = value.get(key).filter(|v| !v.is_null()) {
            text.entry(key).or_insert(v.clone());
        }
    }
    Ok(serde_json::Value::Object(text))
}

/// Maps `architectures[0]` (or, without it, `model_type`) to a supported family.
fn architecture(raw: &RawConfig) -> Result<Architecture> {
    if let Some(first) = raw.architectures.as_ref().and_then(|a| a.first()) {
        return Architecture::ALL
            .into_iter()
            .find(|a| a.hf_name() == first)
            .ok_or_else(|| ModelError::UnsupportedArchitecture(first.clone()));
    }
    match raw.model_type.as_deref() {
        Some("llama") => Ok(Architecture::Llama),
        Some("mistral") => Ok(Architecture::Mistral),
        Some("qwen2") => Ok(Architecture::Qwen2),
        Some("qwen3") => Ok(Architecture::Qwen3),
        Some("gemma2") => Ok(Architecture::Gemma2),
        Some("gemma3_text") => Ok(Architecture::Gemma3),
        Some("phi3") => Ok(Architecture::Phi3),
        Some("mixtral") => Ok(Architecture::Mixtral),
        Some("qwen3_moe") => Ok(Architecture::Qwen3Moe),
        Some("gpt_oss") => Ok(Architecture::GptOss),
        Some(other) => Err(ModelError::UnsupportedArchitecture(other.to_string())),
        None => Err(ModelError::UnsupportedArchitecture(
            "(config.json has neither `architectures` nor `model_type`)".to_string(),
        )),
    }
}

/// A size that may be absent but is never 0.
pub fn positive(value: Option<usize>, field: &str) -> Result<Option<usize>> {
    match value {
        Some(0) => Err(ModelError::Config(format!("`{field}` must be greater than 0"))),
        other => Ok(other),
    }
}

/// A size that must be present and greater than 0.
pub fn required(value: Option<usize>, field: &str) -> Result<usize> {
    positive(value, field)?.ok_or_else(|| ModelError::Config(format!("`{field}` is missing")))
}

fn config_err<T>(msg: String) -> Result<T> {
    Err(ModelError::Config(msg))
}

/// A float that must be finite and positive when present.
fn positive_f64(value: Option<f64>, field: &str) -> Result<Option<f64>> {
    match value {
        Some(v) if !(v.is_finite() && v > 0.0) => config_err(format!("`{field}` ({v}) must be a positive number")),
        other => Ok(other),
    }
}

/// transformers' `get_mscale` of YaRN.
fn yarn_mscale(scale: f64, m: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * m * scale.ln() + 1.0
    }
}

/// Resolves `rope_scaling` (or a `rope_parameters` entry) into one of the kinds rserve implements, or none.
/// `max_position_embeddings` and the top-level `original_max_position_embeddings` are the defaults transformers
/// takes for YaRN and LongRoPE.
fn rope_scaling(
    raw: Option<&RawRopeScaling>,
    head_dim: usize,
    max_position_embeddings: usize,
    top_original: Option<usize>,
) -> Result<Option<RopeScaling>> {
    let Some(s) = raw else { return Ok(None) };
    let kind = s.rope_type.as_deref().or(s.type_.as_deref()).unwrap_or("default");
    let factor = |kind: &str| -> Result<f64> {
        positive_f64(s.factor, "rope_scaling.factor")?
            .ok_or_else(|| ModelError::Config(format!("rope_scaling of type {kind} needs `factor`")))
    };
    match kind {
        "default" => Ok(None),
        "linear" => Ok(Some(RopeScaling::Linear { factor: factor(kind)? })),
        "dynamic" => Ok(Some(RopeScaling::Dynamic { factor: factor(kind)? })),
        "llama3" => {
            let field = |v: Option<f64>, name: &str| {
                v.ok_or_else(|| ModelError::Config(format!("rope_scaling of type llama3 needs `{name}`")))
            };
            let scaling = Llama3RopeScaling {
                factor: field(s.factor, "factor")?,
                low_freq_factor: field(s.low_freq_factor, "low_freq_factor")?,
                high_freq_factor: field(s.high_freq_factor, "high_freq_factor")?,
                original_max_position_embeddings: s.original_max_position_embeddings.ok_or_else(|| {
                    ModelError::Config("rope_scaling of type llama3 needs `original_max_position_embeddings`".into())
                })?,
            };
            if !(scaling.factor > 0.0 && scaling.low_freq_factor > 0.0 && scaling.high_freq_factor > 0.0) {
                return config_err("rope_scaling factors must be positive".into());
            }
            if scaling.high_freq_factor <= scaling.low_freq_factor {
                return config_err("rope_scaling: `high_freq_factor` must be greater than `low_freq_factor`".into());
            }
            if scaling.original_max_position_embeddings == 0 {
                return config_err("rope_scaling: `original_max_position_embeddings` must be greater than 0".into());
            }
            Ok(Some(RopeScaling::Llama3(scaling)))
        }
        "yarn" => {
            let factor = factor(kind)?;
            let original =
                positive(s.original_max_position_embeddings, "rope_scaling.original_max_position_embeddings")?
                    .unwrap_or(max_position_embeddings);
            let attention_factor = match positive_f64(s.attention_factor, "rope_scaling.attention_factor")? {
                Some(a) => a,
                None => match (s.mscale, s.mscale_all_dim) {
                    (Some(m), Some(all)) => yarn_mscale(factor, m) / yarn_mscale(factor, all),
                    _ => yarn_mscale(factor, 1.0),
                },
            };
            Ok(Some(RopeScaling::Yarn(YarnRopeScaling {
                factor,
                original_max_position_embeddings: original,
                beta_fast: s.beta_fast.unwrap_or(32.0),
                beta_slow: s.beta_slow.unwrap_or(1.0),
                attention_factor,
                truncate: s.truncate.unwrap_or(true),
            })))
        }
        "longrope" | "su" => {
            let (Some(short), Some(long)) = (&s.short_factor, &s.long_factor) else {
                return config_err("rope_scaling of type longrope needs `short_factor` and `long_factor`".into());
            };
            if short.len() != head_dim / 2 || long.len() != head_dim / 2 {
                return config_err(format!(
                    "rope_scaling: longrope factors have {} and {} entries, the head needs {}",
                    short.len(),
                    long.len(),
                    head_dim / 2
                ));
            }
            if short.iter().chain(long).any(|f| !(f.is_finite() && *f > 0.0)) {
                return config_err("rope_scaling: longrope factors must be positive".into());
            }
            let original =
                positive(s.original_max_position_embeddings, "rope_scaling.original_max_position_embeddings")?
                    .or(top_original)
                    .ok_or_else(|| {
                        ModelError::Config(
                            "rope_scaling of type longrope needs `original_max_position_embeddings`".into(),
                        )
                    })?;
            let factor = max_position_embeddings as f64 / original as f64;
            let attention_factor = match positive_f64(s.attention_factor, "rope_scaling.attention_factor")? {
                Some(a) => a,
                None if factor <= 1.0 => 1.0,
                None => (1.0 + factor.ln() / (original as f64).ln()).sqrt(),
            };
            Ok(Some(RopeScaling::LongRope(LongRopeScaling {
                short_factor: short.clone(),
                long_factor: long.clone(),
                original_max_position_embeddings: original,
                attention_factor,
            })))
        }
        other => config_err(format!(
            "rope_scaling type '{other}' is not supported (supported: default, linear, dynamic, llama3, yarn, longrope)"
        )),
    }
}

/// The `rope_parameters` object of one layer type (transformers 5 writes one per type for Gemma 3), or the flat one.
fn rope_parameters(raw: &RawConfig, layer_type: &str) -> Result<Option<RawRopeScaling>> {
    let Some(v) = &raw.rope_parameters else { return Ok(None) };
    let v = match v.get(layer_type) {
        Some(per_type) if per_type.is_object() => per_type,
        _ => v,
    };
    serde_json::from_value(v.clone())
        .map(Some)
        .map_err(|e| ModelError::Config(format!("`rope_parameters` is not valid: {e}")))
}

/// Which layers attend through a sliding window: `layer_types` when the file has it, else each architecture's
/// rule in transformers.
fn sliding_layers(raw: &RawConfig, architecture: Architecture, num_layers: usize) -> Result<Vec<bool>> {
    if let Some(types) = &raw.layer_types {
        if types.len() != num_layers {
            return config_err(format!("`layer_types` has {} entries for {num_layers} layers", types.len()));
        }
        return types
            .iter()
            .map(|t| match t.as_str() {
                "sliding_attention" => Ok(true),
                "full_attention" => Ok(false),
                other => config_err(format!("layer type '{other}' is not supported")),
            })
            .collect();
    }
    Ok(match architecture {
        Architecture::Gemma2 | Architecture::GptOss => (0..num_layers).map(|i| (i + 1) % 2 != 0).collect(),
        Architecture::Gemma3 => {
            let pattern = positive(raw.sliding_window_pattern, "sliding_window_pattern")?.unwrap_or(6);
            (0..num_layers).map(|i| (i + 1) % pattern != 0).collect()
        }
        Architecture::Qwen2 | Architecture::Qwen3 => {
            let from = raw.max_window_layers.unwrap_or(28);
            (0..num_layers).map(|i| raw.use_sliding_window == Some(true) && i >= from).collect()
        }
        // transformers' Qwen3-MoE applies its window (when `use_sliding_window`) to every layer.
        Architecture::Qwen3Moe => vec![raw.use_sliding_window == Some(true); num_layers],
        Architecture::Mistral | Architecture::Phi3 | Architecture::Mixtral => vec![true; num_layers],
        Architecture::Llama => vec![false; num_layers],
    })
}

/// Checks the raw config and fills defaults into `ModelParams`.
pub fn resolve(raw: RawConfig) -> Result<ModelParams> {
    use Architecture::*;
    let architecture = architecture(&raw)?;
    let vocab_size = required(raw.vocab_size, "vocab_size")?;
    let hidden_size = required(raw.hidden_size, "hidden_size")?;
    let intermediate_size = required(raw.intermediate_size, "intermediate_size")?;
    let num_layers = required(raw.num_hidden_layers, "num_hidden_layers")?;
    let num_heads = required(raw.num_attention_heads, "num_attention_heads")?;
    let num_kv_heads = positive(raw.num_key_value_heads, "num_key_value_heads")?.unwrap_or(num_heads);
    if num_heads % num_kv_heads != 0 {
        return config_err(format!(
            "`num_attention_heads` ({num_heads}) must be a multiple of `num_key_value_heads` ({num_kv_heads})"
        ));
    }
    // transformers' defaults where a config leaves `head_dim` out: Gemma 256, Qwen3 128, others hidden / heads.
    let default_head_dim = match architecture {
        Gemma2 | Gemma3 => Some(256),
        Qwen3 => Some(128),
        _ => None,
    };
    let head_dim = match positive(raw.head_dim, "head_dim")?.or(default_head_dim) {
        Some(d) => d,
        None => {
            if hidden_size % num_heads != 0 {
                return config_err(format!(
                    "`hidden_size` ({hidden_size}) is not a multiple of `num_attention_heads` ({num_heads}) \
                     and no `head_dim` is given"
                ));
            }
            hidden_size / num_heads
        }
    };
    if head_dim % 2 != 0 {
        return config_err(format!("`head_dim` ({head_dim}) must be even for rotary embeddings"));
    }
    if let Some(f) = raw.partial_rotary_factor.filter(|f| *f != 1.0) {
        return config_err(format!("partial rotary embeddings (`partial_rotary_factor` {f}) are not supported"));
    }

    // transformers' per-class defaults for the keys a config may leave out.
    let (default_max_pos, default_window, default_theta, default_eps) = match architecture {
        Mistral => (4096 * 32, Some(4096), 10_000.0, 1e-6),
        Gemma2 => (8192, Some(4096), 10_000.0, 1e-6),
        Gemma3 => (131_072, Some(4096), 1_000_000.0, 1e-6),
        Qwen3 => (32_768, Some(4096), 10_000.0, 1e-6),
        Qwen2 => (2048, Some(4096), 10_000.0, 1e-6),
        Phi3 => (4096, None, 10_000.0, 1e-5),
        Mixtral => (4096 * 32, None, 1_000_000.0, 1e-5),
        Qwen3Moe => (32_768, None, 10_000.0, 1e-6),
        GptOss => (131_072, Some(128), 150_000.0, 1e-5),
        Llama => (2048, None, 10_000.0, 1e-6),
    };
    let max_position_embeddings =
        positive(raw.max_position_embeddings, "max_position_embeddings")?.unwrap_or(default_max_pos);
    let global_params = rope_parameters(&raw, "full_attention")?;
    let local_params = rope_parameters(&raw, "sliding_attention")?;
    let rope_theta = raw.rope_theta.or(global_params.as_ref().and_then(|p| p.rope_theta)).unwrap_or(default_theta);
    if !(rope_theta.is_finite() && rope_theta > 0.0) {
        return config_err(format!("`rope_theta` ({rope_theta}) must be a positive number"));
    }
    let rms_norm_eps = raw.rms_norm_eps.unwrap_or(default_eps);
    if !(rms_norm_eps.is_finite() && rms_norm_eps > 0.0) {
        return config_err(format!("`rms_norm_eps` ({rms_norm_eps}) must be a positive number"));
    }
    // gpt-oss's class default when the file names no scaling: YaRN x32 from 4096 positions, not truncated.
    let gpt_oss_yarn = serde_json::from_value(serde_json::json!({
        "rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": false,
        "original_max_position_embeddings": 4096
    }))
    .ok()
    .filter(|_| architecture == GptOss);
    let scaling_given = raw.rope_scaling.as_ref().or(global_params.as_ref());
    let rope_scaling = rope_scaling(
        scaling_given
            .filter(|s| s.rope_type.is_some() || s.type_.is_some() || architecture != GptOss)
            .or(gpt_oss_yarn.as_ref()),
        head_dim,
        max_position_embeddings,
        raw.original_max_position_embeddings,
    )?;
    // Gemma 3's sliding layers: their own base, no scaling.
    let local_rope = match architecture {
        Gemma3 => {
            let theta =
                raw.rope_local_base_freq.or(local_params.as_ref().and_then(|p| p.rope_theta)).unwrap_or(10_000.0);
            positive_f64(Some(theta), "rope_local_base_freq")?;
            Some(Rope { theta, scaling: None })
        }
        _ => None,
    };
    let attention_bias = match architecture {
        // Qwen2 always has q/k/v biases (its config has no key for it).
        Qwen2 => true,
        GptOss => raw.attention_bias.unwrap_or(true),
        _ => raw.attention_bias.unwrap_or(false),
    };
    if architecture == GptOss {
        for (value, field, want) in [(raw.swiglu_alpha, "swiglu_alpha", 1.702), (raw.swiglu_limit, "swiglu_limit", 7.0)]
        {
            if value.is_some_and(|v| v != want) {
                return config_err(format!(
                    "`{field}` {} is not supported (only gpt-oss's {want})",
                    value.unwrap_or(want)
                ));
            }
        }
    }
    let window = match architecture {
        // Mistral distinguishes an absent key (the class default) from an explicit null (no window).
        Mistral | Mixtral => raw.sliding_window.unwrap_or(default_window),
        _ => raw.sliding_window.flatten().or(default_window),
    };
    let window = positive(window, "sliding_window")?;
    ModelDims { vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, head_dim }
        .check_limits()?;
    let sliding = sliding_layers(&raw, architecture, num_layers)?;
    let layers: Vec<LayerAttention> = sliding
        .iter()
        .map(|&s| LayerAttention { window: if s { window } else { None }, local_rope: s && local_rope.is_some() })
        .collect();
    let sliding_window = layers.iter().find_map(|l| l.window);
    let act_name = raw.hidden_activation.as_deref().or(raw.hidden_act.as_deref());
    let activation = match (architecture, act_name) {
        // gpt-oss's experts ignore `hidden_act` (its config says silu).
        (GptOss, _) => Activation::SwigluOai,
        (Gemma2 | Gemma3, None) => Activation::GeluTanh,
        (_, None | Some("silu" | "swish")) => Activation::Silu,
        (_, Some("gelu_pytorch_tanh" | "gelu_new" | "gelu_fast")) => Activation::GeluTanh,
        (_, Some(other)) => {
            return config_err(format!("activation '{other}' is not supported (silu, gelu_pytorch_tanh)"))
        }
    };
    let attn_scale = match architecture {
        Gemma2 | Gemma3 => {
            let q = positive_f64(raw.query_pre_attn_scalar, "query_pre_attn_scalar")?.unwrap_or(256.0);
            1.0 / q.sqrt()
        }
        _ => 1.0 / (head_dim as f64).sqrt(),
    };
    let (attn_softcap, final_softcap) = match architecture {
        Gemma2 => (
            positive_f64(raw.attn_logit_softcapping, "attn_logit_softcapping")?.or(Some(50.0)),
            positive_f64(raw.final_logit_softcapping, "final_logit_softcapping")?.or(Some(30.0)),
        ),
        _ => (
            positive_f64(raw.attn_logit_softcapping, "attn_logit_softcapping")?,
            positive_f64(raw.final_logit_softcapping, "final_logit_softcapping")?,
        ),
    };
    let moe = moe_params(&raw, architecture, num_layers, intermediate_size)?;
    let eos_token_ids = raw.eos_token_id.map(TokenIds::into_vec).unwrap_or_default();
    let bos_token_id = match raw.bos_token_id {
        None => None,
        Some(TokenIds::One(id)) => Some(id),
        Some(TokenIds::Many(ids)) => ids.first().copied(),
    };
    Ok(ModelParams {
        architecture,
        dims: ModelDims { vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, head_dim },
        rms_norm_eps,
        rope_theta,
        rope_scaling,
        local_rope,
        layers,
        qk_norm: matches!(architecture, Qwen3 | Qwen3Moe | Gemma3),
        activation,
        attn_scale,
        attn_softcap,
        final_softcap,
        max_position_embeddings,
        // Gemma ties its embeddings unless the file says otherwise (transformers' class default).
        tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(architecture.is_gemma()),
        attention_bias,
        o_proj_bias: architecture == GptOss && attention_bias,
        attention_sinks: architecture == GptOss,
        bos_token_id,
        eos_token_ids,
        torch_dtype: raw.dtype.or(raw.torch_dtype),
        sliding_window,
        moe,
    })
}

/// The routed experts of Mixtral (every layer) and Qwen3-MoE (layers `(i + 1) % decoder_sparse_step == 0` outside
/// `mlp_only_layers`), with transformers' defaults; None for the dense architectures.
fn moe_params(
    raw: &RawConfig,
    architecture: Architecture,
    num_layers: usize,
    intermediate_size: usize,
) -> Result<Option<MoeParams>> {
    let (experts, expert_intermediate, renormalize, layers) = match architecture {
        Architecture::Mixtral => {
            let experts = positive(raw.num_local_experts, "num_local_experts")?.unwrap_or(8);
            (experts, intermediate_size, true, vec![true; num_layers])
        }
        Architecture::Qwen3Moe => {
            let experts = positive(raw.num_experts.or(raw.num_local_experts), "num_experts")?.unwrap_or(128);
            let step = positive(raw.decoder_sparse_step, "decoder_sparse_step")?.unwrap_or(1);
            let dense = raw.mlp_only_layers.clone().unwrap_or_default();
            let layers = (0..num_layers).map(|i| !dense.contains(&i) && (i + 1) % step == 0).collect();
            let inter = positive(raw.moe_intermediate_size, "moe_intermediate_size")?.unwrap_or(768);
            (experts, inter, raw.norm_topk_prob.unwrap_or(false), layers)
        }
        // gpt-oss: softmax over the top-k logits, which is the renormalised top-k of the softmax over all.
        Architecture::GptOss => {
            let experts = positive(raw.num_local_experts, "num_local_experts")?.unwrap_or(128);
            (experts, intermediate_size, true, vec![true; num_layers])
        }
        _ => return Ok(None),
    };
    let top_k = positive(raw.num_experts_per_tok, "num_experts_per_tok")?.unwrap_or(match architecture {
        Architecture::Mixtral => 2,
        Architecture::GptOss => 4,
        _ => 8,
    });
    if top_k > experts {
        return config_err(format!("`num_experts_per_tok` ({top_k}) is more than the {experts} experts"));
    }
    let max = rserve_kernels::launch::MOE_MAX_EXPERTS;
    if experts > max {
        return config_err(format!("{experts} experts: at most {max} are supported"));
    }
    let max_top_k = rserve_kernels::launch::MOE_MAX_TOP_K;
    if top_k > max_top_k {
        return config_err(format!("`num_experts_per_tok` ({top_k}): at most {max_top_k} are supported"));
    }
    let bias = architecture == Architecture::GptOss;
    Ok(Some(MoeParams { num_experts: experts, top_k, expert_intermediate, renormalize, layers, bias }))
}
