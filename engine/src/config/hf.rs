//! Hugging Face `config.json` -> `ModelParams`.
//!
//! `RawConfig` mirrors the file (every key optional where transformers has a default); `parse_config_json` checks it
//! and resolves defaults the way transformers' `LlamaConfig`, `MistralConfig` and `Qwen2Config` do. Both the older
//! top-level `rope_theta` / `rope_scaling` keys and transformers 5's `rope_parameters` are read.

use std::path::Path;

use serde::Deserialize;

use super::{Architecture, Llama3RopeScaling, ModelDims, ModelParams};
use crate::{EngineError, Result};

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
    /// transformers >= 5 stores `rope_theta` and the scaling parameters here.
    #[serde(default)]
    pub rope_parameters: Option<RawRopeScaling>,
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
pub(crate) fn read_config_file<T>(path: &Path, parse: impl FnOnce(&str) -> Result<T>) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(|source| EngineError::Io { path: path.to_path_buf(), source })?;
    parse(&text).map_err(|e| match e {
        EngineError::Config(msg) => EngineError::Config(format!("{}: {msg}", path.display())),
        other => other,
    })
}

/// Parses the text of a `config.json` into checked `ModelParams`.
pub fn parse_config_json(text: &str) -> Result<ModelParams> {
    let raw: RawConfig =
        serde_json::from_str(text).map_err(|e| EngineError::Config(format!("config.json is not valid: {e}")))?;
    resolve(raw)
}

/// Maps `architectures[0]` (or, without it, `model_type`) to a supported family.
fn architecture(raw: &RawConfig) -> Result<Architecture> {
    if let Some(first) = raw.architectures.as_ref().and_then(|a| a.first()) {
        return match first.as_str() {
            "LlamaForCausalLM" => Ok(Architecture::Llama),
            "MistralForCausalLM" => Ok(Architecture::Mistral),
            "Qwen2ForCausalLM" => Ok(Architecture::Qwen2),
            other => Err(EngineError::UnsupportedArchitecture(other.to_string())),
        };
    }
    match raw.model_type.as_deref() {
        Some("llama") => Ok(Architecture::Llama),
        Some("mistral") => Ok(Architecture::Mistral),
        Some("qwen2") => Ok(Architecture::Qwen2),
        Some(other) => Err(EngineError::UnsupportedArchitecture(other.to_string())),
        None => Err(EngineError::UnsupportedArchitecture(
            "(config.json has neither `architectures` nor `model_type`)".to_string(),
        )),
    }
}

/// A size that may be absent but is never 0.
pub(crate) fn positive(value: Option<usize>, field: &str) -> Result<Option<usize>> {
    match value {
        Some(0) => Err(EngineError::Config(format!("`{field}` must be greater than 0"))),
        other => Ok(other),
    }
}

/// A size that must be present and greater than 0.
pub(crate) fn required(value: Option<usize>, field: &str) -> Result<usize> {
    positive(value, field)?.ok_or_else(|| EngineError::Config(format!("`{field}` is missing")))
}

/// Resolves `rope_scaling` into the one scaling type the model implements (`llama3`), or none.
fn rope_scaling(raw: Option<&RawRopeScaling>) -> Result<Option<Llama3RopeScaling>> {
    let Some(s) = raw else { return Ok(None) };
    let kind = s.rope_type.as_deref().or(s.type_.as_deref()).unwrap_or("default");
    match kind {
        "default" => Ok(None),
        "llama3" => {
            let field = |v: Option<f64>, name: &str| {
                v.ok_or_else(|| EngineError::Config(format!("rope_scaling of type llama3 needs `{name}`")))
            };
            let scaling = Llama3RopeScaling {
                factor: field(s.factor, "factor")?,
                low_freq_factor: field(s.low_freq_factor, "low_freq_factor")?,
                high_freq_factor: field(s.high_freq_factor, "high_freq_factor")?,
                original_max_position_embeddings: s.original_max_position_embeddings.ok_or_else(|| {
                    EngineError::Config("rope_scaling of type llama3 needs `original_max_position_embeddings`".into())
                })?,
            };
            if !(scaling.factor > 0.0 && scaling.low_freq_factor > 0.0 && scaling.high_freq_factor > 0.0) {
                return Err(EngineError::Config("rope_scaling factors must be positive".into()));
            }
            if scaling.high_freq_factor <= scaling.low_freq_factor {
                return Err(EngineError::Config(
                    "rope_scaling: `high_freq_factor` must be greater than `low_freq_factor`".into(),
                ));
            }
            if scaling.original_max_position_embeddings == 0 {
                return Err(EngineError::Config(
                    "rope_scaling: `original_max_position_embeddings` must be greater than 0".into(),
                ));
            }
            Ok(Some(scaling))
        }
        other => Err(EngineError::Config(format!(
            "rope_scaling type '{other}' is not supported (supported: default, llama3)"
        ))),
    }
}

/// Checks the raw config and fills defaults into `ModelParams`.
pub fn resolve(raw: RawConfig) -> Result<ModelParams> {
    let architecture = architecture(&raw)?;
    let vocab_size = required(raw.vocab_size, "vocab_size")?;
    let hidden_size = required(raw.hidden_size, "hidden_size")?;
    let intermediate_size = required(raw.intermediate_size, "intermediate_size")?;
    let num_layers = required(raw.num_hidden_layers, "num_hidden_layers")?;
    let num_heads = required(raw.num_attention_heads, "num_attention_heads")?;
    let num_kv_heads = positive(raw.num_key_value_heads, "num_key_value_heads")?.unwrap_or(num_heads);
    if num_heads % num_kv_heads != 0 {
        return Err(EngineError::Config(format!(
            "`num_attention_heads` ({num_heads}) must be a multiple of `num_key_value_heads` ({num_kv_heads})"
        )));
    }
    let head_dim = match positive(raw.head_dim, "head_dim")? {
        Some(d) => d,
        None => {
            if hidden_size % num_heads != 0 {
                return Err(EngineError::Config(format!(
                    "`hidden_size` ({hidden_size}) is not a multiple of `num_attention_heads` ({num_heads}) \
                     and no `head_dim` is given"
                )));
            }
            hidden_size / num_heads
        }
    };
    if head_dim % 2 != 0 {
        return Err(EngineError::Config(format!("`head_dim` ({head_dim}) must be even for rotary embeddings")));
    }

    // Mistral's transformers defaults differ from llama's for two keys.
    let (default_max_pos, default_window) = match architecture {
        Architecture::Mistral => (4096 * 32, Some(4096)),
        Architecture::Llama | Architecture::Qwen2 => (2048, None),
    };
    let max_position_embeddings =
        positive(raw.max_position_embeddings, "max_position_embeddings")?.unwrap_or(default_max_pos);
    let rope_theta =
        raw.rope_theta.or_else(|| raw.rope_parameters.as_ref().and_then(|p| p.rope_theta)).unwrap_or(10_000.0);
    if !(rope_theta.is_finite() && rope_theta > 0.0) {
        return Err(EngineError::Config(format!("`rope_theta` ({rope_theta}) must be a positive number")));
    }
    let rms_norm_eps = raw.rms_norm_eps.unwrap_or(1e-6);
    if !(rms_norm_eps.is_finite() && rms_norm_eps > 0.0) {
        return Err(EngineError::Config(format!("`rms_norm_eps` ({rms_norm_eps}) must be a positive number")));
    }
    let rope_scaling = rope_scaling(raw.rope_scaling.as_ref().or(raw.rope_parameters.as_ref()))?;
    let attention_bias = match architecture {
        // Qwen2 always has q/k/v biases (its config has no key for it).
        Architecture::Qwen2 => true,
        Architecture::Llama | Architecture::Mistral => raw.attention_bias.unwrap_or(false),
    };
    let sliding_window = match architecture {
        Architecture::Mistral => raw.sliding_window.unwrap_or(default_window),
        Architecture::Qwen2 if raw.use_sliding_window == Some(true) => raw.sliding_window.flatten(),
        Architecture::Qwen2 | Architecture::Llama => None,
    };
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
        max_position_embeddings,
        tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
        attention_bias,
        bos_token_id,
        eos_token_ids,
        torch_dtype: raw.dtype.or(raw.torch_dtype),
        sliding_window,
    })
}
