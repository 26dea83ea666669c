//! The resolved model configuration every component reads: `ModelParams`, and `ModelDims`, its sizes (hidden, layers,
//! heads, ...) as one type, which the planner's `ModelShape` embeds.
//!
//! Raw formats (`config.json`, GGUF metadata) are parsed in `config/` into serde structs that mirror the files, then
//! checked into `ModelParams`. Code outside `config/` never looks at raw config keys, except the planner's own
//! any-architecture readers (`plan::shape`, `plan::shape_gguf`).

pub mod gguf_meta;
pub mod hf;

use serde::Serialize;
use std::ops::Deref;

/// Model families the llama forward pass implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// `LlamaForCausalLM` (Llama 2/3.x, SmolLM2, ...).
    Llama,
    /// `MistralForCausalLM` (llama layout; sliding window ignored up to `max_model_len` <= window).
    Mistral,
    /// `Qwen2ForCausalLM` (llama layout with bias on q/k/v).
    Qwen2,
}

/// Llama 3.x `rope_scaling` of type `llama3`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3RopeScaling {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: usize,
}

/// The sizes that fix every weight and KV-cache shape of a decoder; `ModelParams` and the planner's `ModelShape`
/// embed them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ModelDims {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    /// Explicit `head_dim`, or `hidden_size / num_heads` when absent.
    pub head_dim: usize,
}

/// The checked model configuration. Invariants: `num_heads % num_kv_heads == 0`, `head_dim > 0`, all sizes > 0.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelParams {
    pub architecture: Architecture,
    /// The sizes; read through `Deref` as `params.hidden_size`.
    pub dims: ModelDims,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: Option<Llama3RopeScaling>,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// Bias on q/k/v projections (Qwen2).
    pub attention_bias: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// `torch_dtype` / `dtype` from the config, e.g. "bfloat16"; None for GGUF.
    pub torch_dtype: Option<String>,
    /// Mistral-style sliding window, if the config sets one.
    pub sliding_window: Option<usize>,
}

impl Deref for ModelParams {
    type Target = ModelDims;

    fn deref(&self) -> &ModelDims {
        &self.dims
    }
}
