//! GGUF metadata -> `ModelParams`.
//!
//! `GgufMeta` mirrors the llama.cpp metadata keys the llama family needs (`{arch}.block_count`, ...,
//! `tokenizer.ggml.*`); `params_from_gguf` checks it into `ModelParams`. Supported `general.architecture` values:
//! `llama` (also used by llama.cpp for Mistral and SmolLM2), `qwen2` and `qwen3`.

use std::path::Path;

use candle_core::quantized::gguf_file::{Content, Value};

use super::{uniform_layers, Architecture, ModelDims, ModelParams, RopeScaling};
use crate::{ModelError, Result};
use rserve_backend::Activation;

/// The metadata of a GGUF file that describes the model shape, as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufMeta {
    pub architecture: String,
    pub block_count: Option<u64>,
    pub embedding_length: Option<u64>,
    pub feed_forward_length: Option<u64>,
    pub head_count: Option<u64>,
    pub head_count_kv: Option<u64>,
    /// `{arch}.attention.key_length`: the head dimension when it is not `embedding_length / head_count`.
    pub key_length: Option<u64>,
    pub rope_dimension_count: Option<u64>,
    pub rope_freq_base: Option<f32>,
    pub rms_epsilon: Option<f32>,
    pub context_length: Option<u64>,
    pub vocab_size: Option<u64>,
    /// Length of `tokenizer.ggml.tokens`.
    pub token_count: Option<usize>,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<u32>,
    /// `tokenizer.ggml.eot_token_id` / `eom_token_id`: extra end-of-generation tokens (Llama 3 instruct).
    pub eot_token_id: Option<u32>,
    pub eom_token_id: Option<u32>,
    /// Whether the file has a separate `output.weight` (false: the embeddings are tied).
    pub has_output_weight: bool,
    /// Shape of `token_embd.weight` as `[vocab, hidden]`, when present.
    pub token_embd_shape: Option<Vec<usize>>,
}

/// An unsigned integer key (any integer type the file stores it as).
fn meta_u64(content: &Content, key: &str) -> Result<Option<u64>> {
    match content.metadata.get(key) {
        None => Ok(None),
        Some(v) => {
            let n = match v {
                Value::U8(x) => Some(*x as u64),
                Value::U16(x) => Some(*x as u64),
                Value::U32(x) => Some(*x as u64),
                Value::U64(x) => Some(*x),
                Value::I8(x) => u64::try_from(*x).ok(),
                Value::I16(x) => u64::try_from(*x).ok(),
                Value::I32(x) => u64::try_from(*x).ok(),
                Value::I64(x) => u64::try_from(*x).ok(),
                _ => None,
            };
            n.map(Some).ok_or_else(|| ModelError::Config(format!("GGUF metadata `{key}` is not an unsigned integer")))
        }
    }
}

fn meta_f32(content: &Content, key: &str) -> Result<Option<f32>> {
    match content.metadata.get(key) {
        None => Ok(None),
        Some(Value::F32(x)) => Ok(Some(*x)),
        Some(Value::F64(x)) => Ok(Some(*x as f32)),
        Some(_) => Err(ModelError::Config(format!("GGUF metadata `{key}` is not a float"))),
    }
}

/// An unsigned integer key that must fit `T` (`u32` token ids, `usize` sizes).
pub fn meta_uint<T: TryFrom<u64>>(content: &Content, key: &str) -> Result<Option<T>> {
    meta_u64(content, key)?
        .map(|v| T::try_from(v).map_err(|_| ModelError::Config(format!("GGUF metadata `{key}` is out of range"))))
        .transpose()
}

/// Reads `general.architecture` from GGUF metadata.
pub fn gguf_architecture(content: &Content) -> Result<String> {
    match content.metadata.get("general.architecture") {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(ModelError::Config("GGUF metadata `general.architecture` is not a string".into())),
        None => Err(ModelError::Config("GGUF metadata has no `general.architecture`".into())),
    }
}

impl GgufMeta {
    /// Collects the keys from a parsed GGUF header.
    pub fn from_content(content: &Content) -> Result<Self> {
        let arch = gguf_architecture(content)?;
        let key = |suffix: &str| format!("{arch}.{suffix}");
        let token_count = match content.metadata.get("tokenizer.ggml.tokens") {
            Some(Value::Array(tokens)) => Some(tokens.len()),
            Some(_) => return Err(ModelError::Config("GGUF metadata `tokenizer.ggml.tokens` is not an array".into())),
            None => None,
        };
        Ok(GgufMeta {
            block_count: meta_u64(content, &key("block_count"))?,
            embedding_length: meta_u64(content, &key("embedding_length"))?,
            feed_forward_length: meta_u64(content, &key("feed_forward_length"))?,
            head_count: meta_u64(content, &key("attention.head_count"))?,
            head_count_kv: meta_u64(content, &key("attention.head_count_kv"))?,
            key_length: meta_u64(content, &key("attention.key_length"))?,
            rope_dimension_count: meta_u64(content, &key("rope.dimension_count"))?,
            rope_freq_base: meta_f32(content, &key("rope.freq_base"))?,
            rms_epsilon: meta_f32(content, &key("attention.layer_norm_rms_epsilon"))?,
            context_length: meta_u64(content, &key("context_length"))?,
            vocab_size: meta_u64(content, &key("vocab_size"))?,
            token_count,
            bos_token_id: meta_uint(content, "tokenizer.ggml.bos_token_id")?,
            eos_token_id: meta_uint(content, "tokenizer.ggml.eos_token_id")?,
            eot_token_id: meta_uint(content, "tokenizer.ggml.eot_token_id")?,
            eom_token_id: meta_uint(content, "tokenizer.ggml.eom_token_id")?,
            has_output_weight: content.tensor_infos.contains_key("output.weight"),
            token_embd_shape: content.tensor_infos.get("token_embd.weight").map(|t| t.shape.dims().to_vec()),
            architecture: arch,
        })
    }

    /// The full name of a per-architecture key: `{architecture}.{suffix}`.
    pub fn key(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.architecture)
    }

    /// `attention.head_count_kv`, or `num_heads` when absent (no grouped-query attention).
    pub fn kv_heads(&self, num_heads: usize) -> Result<usize> {
        match self.head_count_kv {
            None => Ok(num_heads),
            some => required(some, &self.key("attention.head_count_kv")),
        }
    }
}

/// GGUF stores floats as f32; go back to the shortest decimal that gives the same f32 (1e-5, not 9.99999974e-6),
/// which is the value the original `config.json` held.
fn f32_to_f64_decimal(x: f32) -> f64 {
    x.to_string().parse::<f64>().unwrap_or(x as f64)
}

/// A size the metadata must give, greater than 0.
pub fn required(value: Option<u64>, key: &str) -> Result<usize> {
    match value {
        None => Err(ModelError::Config(format!("GGUF metadata has no `{key}`"))),
        Some(0) => Err(ModelError::Config(format!("GGUF metadata `{key}` must be greater than 0"))),
        Some(v) => usize::try_from(v).map_err(|_| ModelError::Config(format!("GGUF metadata `{key}` is too large"))),
    }
}

/// Resolves GGUF metadata into `ModelParams`.
/// (The header alone: a `rope_freqs.weight` tensor is read by `params_from_gguf_file`.)
pub fn params_from_gguf(content: &Content) -> Result<ModelParams> {
    resolve(&GgufMeta::from_content(content)?)
}

/// Reads the header of a `.gguf` file and resolves its `ModelParams`, with the per-frequency RoPE factors of a
/// `rope_freqs.weight` tensor (Llama 3.1+ files carry their llama3 scaling that way).
pub fn params_from_gguf_file(path: &Path) -> Result<ModelParams> {
    let content = read_gguf_header(path)?;
    let mut params = resolve(&GgufMeta::from_content(&content)?)?;
    if content.tensor_infos.contains_key(ROPE_FREQS) {
        let file = std::fs::File::open(path).map_err(|source| ModelError::Io { path: path.to_path_buf(), source })?;
        let mut reader = std::io::BufReader::new(file);
        let factors: Vec<f64> = content
            .tensor(&mut reader, ROPE_FREQS, &candle_core::Device::Cpu)
            .and_then(|t| t.dequantize(&candle_core::Device::Cpu))
            .and_then(|t| t.flatten_all()?.to_vec1::<f32>())
            .map_err(|e| ModelError::Config(format!("{}: cannot read {ROPE_FREQS}: {e}", path.display())))?
            .into_iter()
            .map(f64::from)
            .collect();
        if factors.len() != params.head_dim / 2 || factors.iter().any(|f| !(f.is_finite() && *f > 0.0)) {
            return Err(ModelError::Config(format!(
                "{}: {ROPE_FREQS} has {} entries (the head needs {} positive factors)",
                path.display(),
                factors.len(),
                params.head_dim / 2
            )));
        }
        params.rope_scaling = Some(RopeScaling::Factors(factors));
    }
    Ok(params)
}

/// llama.cpp's per-frequency RoPE factors.
const ROPE_FREQS: &str = "rope_freqs.weight";

/// Parses the metadata and tensor directory of a GGUF file (tensor data is not read).
pub fn read_gguf_header(path: &Path) -> Result<Content> {
    let file = std::fs::File::open(path).map_err(|source| ModelError::Io { path: path.to_path_buf(), source })?;
    parse_gguf_header(&mut std::io::BufReader::new(file))
        .map_err(|e| ModelError::Config(format!("{}: not a readable GGUF file: {e}", path.display())))
}

/// candle's GGUF header reader, made total: it divides by `general.alignment` without checking it (a file with
/// alignment 0 panicked it, `tests/hostile_files.rs`), so that panic is caught and becomes an error. The reader is
/// pure parsing over `reader`: nothing it leaves half-done outlives the call.
pub fn parse_gguf_header<R: std::io::Read + std::io::Seek>(reader: &mut R) -> std::result::Result<Content, String> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| Content::read(reader))) {
        Ok(Ok(content)) => Ok(content),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("the header is malformed (e.g. general.alignment 0)".into()),
    }
}

/// Checks `GgufMeta` into `ModelParams`.
pub fn resolve(meta: &GgufMeta) -> Result<ModelParams> {
    let arch = meta.architecture.as_str();
    let architecture = match arch {
        "llama" => Architecture::Llama,
        "qwen2" => Architecture::Qwen2,
        "qwen3" => Architecture::Qwen3,
        other => return Err(ModelError::UnsupportedArchitecture(format!("{other} (GGUF general.architecture)"))),
    };
    let hidden_size = required(meta.embedding_length, &meta.key("embedding_length"))?;
    let intermediate_size = required(meta.feed_forward_length, &meta.key("feed_forward_length"))?;
    let num_layers = required(meta.block_count, &meta.key("block_count"))?;
    let num_heads = required(meta.head_count, &meta.key("attention.head_count"))?;
    let num_kv_heads = meta.kv_heads(num_heads)?;
    if num_heads % num_kv_heads != 0 {
        return Err(ModelError::Config(format!(
            "GGUF head_count ({num_heads}) must be a multiple of head_count_kv ({num_kv_heads})"
        )));
    }
    let head_dim = match meta.key_length {
        Some(_) => required(meta.key_length, &meta.key("attention.key_length"))?,
        None => {
            if hidden_size % num_heads != 0 {
                return Err(ModelError::Config(format!(
                    "GGUF embedding_length ({hidden_size}) is not a multiple of head_count ({num_heads})"
                )));
            }
            hidden_size / num_heads
        }
    };
    if head_dim % 2 != 0 {
        return Err(ModelError::Config(format!("head dimension ({head_dim}) must be even for rotary embeddings")));
    }
    if let Some(rot) = meta.rope_dimension_count {
        if rot as usize != head_dim {
            return Err(ModelError::Config(format!(
                "partial rotary embeddings are not supported ({} = {rot}, head dimension {head_dim})",
                meta.key("rope.dimension_count")
            )));
        }
    }
    // The vocabulary is the number of embedding rows (what the logits cover; llama.cpp pads the token list to it),
    // else the token list, else the `vocab_size` key.
    let vocab_size = match (meta.token_embd_shape.as_deref(), meta.token_count, meta.vocab_size) {
        (Some([v, _]), _, _) if *v > 0 => *v,
        (_, Some(n), _) if n > 0 => n,
        (_, _, Some(n)) if n > 0 => n as usize,
        _ => return Err(ModelError::Config("GGUF file gives no vocabulary size (no tokenizer.ggml.tokens)".into())),
    };
    ModelDims { vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, head_dim }
        .check_limits()?;
    let max_position_embeddings = required(meta.context_length, &meta.key("context_length"))?;
    let rms_norm_eps = match meta.rms_epsilon {
        Some(e) if e.is_finite() && e > 0.0 => f32_to_f64_decimal(e),
        Some(e) => return Err(ModelError::Config(format!("GGUF rms epsilon ({e}) must be positive"))),
        None => {
            return Err(ModelError::Config(format!(
                "GGUF metadata has no `{}`",
                meta.key("attention.layer_norm_rms_epsilon")
            )))
        }
    };
    let rope_theta = match meta.rope_freq_base {
        Some(t) if t.is_finite() && t > 0.0 => f32_to_f64_decimal(t),
        Some(t) => return Err(ModelError::Config(format!("GGUF rope.freq_base ({t}) must be positive"))),
        None => 10_000.0,
    };
    let mut eos_token_ids = Vec::new();
    for id in [meta.eos_token_id, meta.eot_token_id, meta.eom_token_id].into_iter().flatten() {
        if !eos_token_ids.contains(&id) {
            eos_token_ids.push(id);
        }
    }
    for id in meta.bos_token_id.iter().chain(&eos_token_ids) {
        if *id as usize >= vocab_size {
            return Err(ModelError::Config(format!(
                "GGUF special token id {id} is outside the vocabulary ({vocab_size})"
            )));
        }
    }
    Ok(ModelParams {
        architecture,
        dims: ModelDims { vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, head_dim },
        rms_norm_eps,
        rope_theta,
        rope_scaling: None,
        local_rope: None,
        layers: uniform_layers(num_layers, None),
        qk_norm: architecture == Architecture::Qwen3,
        activation: Activation::Silu,
        attn_scale: 1.0 / (head_dim as f64).sqrt(),
        attn_softcap: None,
        final_softcap: None,
        max_position_embeddings,
        tie_word_embeddings: !meta.has_output_weight,
        attention_bias: architecture == Architecture::Qwen2,
        o_proj_bias: false,
        attention_sinks: false,
        bos_token_id: meta.bos_token_id,
        eos_token_ids,
        torch_dtype: None,
        sliding_window: None,
        moe: None,
    })
}
