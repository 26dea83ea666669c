//! The resolved model configuration every component reads: `ModelParams`, and `ModelDims`, its sizes (hidden, layers,
//! heads, ...) as one type, which the planner's `ModelShape` embeds.
//!
//! Raw formats (`config.json`, GGUF metadata) are parsed in `config/` into serde structs that mirror the files, then
//! checked into `ModelParams`. Code outside `config/` never looks at raw config keys, except the planner's own
//! any-architecture readers (`plan::shape`, `plan::shape_gguf`).

pub mod encoder;
pub mod gguf_meta;
pub mod hf;
pub mod pooling;

use serde::Serialize;
use std::ops::Deref;

use rserve_backend::Activation;

/// Model families the decoder forward pass implements (`model::llama`; what differs is in `ModelParams`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// `LlamaForCausalLM` (Llama 2/3.x, SmolLM2, ...).
    Llama,
    /// `MistralForCausalLM` (llama layout; sliding-window attention when the config sets a window).
    Mistral,
    /// `Qwen2ForCausalLM` (llama layout with bias on q/k/v).
    Qwen2,
    /// `Qwen3ForCausalLM` (llama layout with per-head RMSNorm of q and k before RoPE).
    Qwen3,
    /// `Gemma2ForCausalLM`: scaled embeddings, (1 + w) norms around attention and MLP, GELU-tanh, soft-capping,
    /// alternating sliding-window and global layers.
    Gemma2,
    /// `Gemma3ForCausalLM` (text): Gemma 2's layout with q/k norms instead of soft-capping, 5 local layers (own
    /// RoPE base) to 1 global.
    Gemma3,
    /// `Phi3ForCausalLM`: fused qkv and gate_up projections in the checkpoint, LongRoPE.
    Phi3,
    /// `MixtralForCausalLM`: Mistral's attention, every MLP a mixture of experts (`block_sparse_moe`).
    Mixtral,
    /// `Qwen3MoeForCausalLM`: Qwen3's attention, mixture-of-experts MLPs (`mlp.experts`) on the layers the config
    /// names (`decoder_sparse_step`, `mlp_only_layers`).
    Qwen3Moe,
    /// `GptOssForCausalLM`: biases on every attention projection, per-head attention sinks, alternating sliding-window
    /// and full layers, YaRN; every MLP routed experts with biases and a clamped SwiGLU, stored packed (one tensor per
    /// layer, MXFP4 or 16-bit) and unpacked per expert at load (`weights::gpt_oss`).
    GptOss,
}

impl Architecture {
    /// Every architecture rserve runs.
    pub const ALL: [Architecture; 10] = [
        Architecture::Llama,
        Architecture::Mistral,
        Architecture::Qwen2,
        Architecture::Qwen3,
        Architecture::Gemma2,
        Architecture::Gemma3,
        Architecture::Phi3,
        Architecture::Mixtral,
        Architecture::Qwen3Moe,
        Architecture::GptOss,
    ];

    /// The Hugging Face class names of `ALL`, for error messages.
    pub fn supported_list() -> String {
        Self::ALL.map(Architecture::hf_name).join(", ")
    }

    /// The Hugging Face class name.
    pub fn hf_name(self) -> &'static str {
        match self {
            Architecture::Llama => "LlamaForCausalLM",
            Architecture::Mistral => "MistralForCausalLM",
            Architecture::Qwen2 => "Qwen2ForCausalLM",
            Architecture::Qwen3 => "Qwen3ForCausalLM",
            Architecture::Gemma2 => "Gemma2ForCausalLM",
            Architecture::Gemma3 => "Gemma3ForCausalLM",
            Architecture::Phi3 => "Phi3ForCausalLM",
            Architecture::Mixtral => "MixtralForCausalLM",
            Architecture::Qwen3Moe => "Qwen3MoeForCausalLM",
            Architecture::GptOss => "GptOssForCausalLM",
        }
    }

    /// Gemma's layer layout: RMSNorm weights stored as `w - 1`, norms after attention and after the MLP as well,
    /// embeddings scaled by sqrt(hidden).
    pub fn is_gemma(self) -> bool {
        matches!(self, Architecture::Gemma2 | Architecture::Gemma3)
    }
}

/// Llama 3.x `rope_scaling` of type `llama3`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3RopeScaling {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: usize,
}

/// `rope_scaling` of type `yarn` (transformers' `_compute_yarn_parameters`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct YarnRopeScaling {
    pub factor: f64,
    pub original_max_position_embeddings: usize,
    pub beta_fast: f64,
    pub beta_slow: f64,
    /// cos/sin multiplier: the config's `attention_factor`, else derived from `factor`, `mscale`, `mscale_all_dim`.
    pub attention_factor: f64,
    pub truncate: bool,
}

/// `rope_scaling` of type `longrope` (older name `su`): per-dimension factors for sequences up to and beyond the
/// original length.
#[derive(Debug, Clone, PartialEq)]
pub struct LongRopeScaling {
    pub short_factor: Vec<f64>,
    pub long_factor: Vec<f64>,
    pub original_max_position_embeddings: usize,
    /// cos/sin multiplier (`attention_factor`, else sqrt(1 + ln(factor) / ln(original)) for factor = max / original).
    pub attention_factor: f64,
}

/// The RoPE frequency scaling kinds of the checkpoints rserve serves.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    Llama3(Llama3RopeScaling),
    /// Position interpolation: every frequency divided by `factor`.
    Linear {
        factor: f64,
    },
    /// Dynamic NTK, as vLLM applies it: the base scaled once for `max_position_embeddings x factor` positions.
    Dynamic {
        factor: f64,
    },
    Yarn(YarnRopeScaling),
    LongRope(LongRopeScaling),
    /// Every frequency divided by its own factor (GGUF's `rope_freqs.weight`: llama.cpp's form of llama3 scaling).
    Factors(Vec<f64>),
}

/// One rotary embedding: base and scaling.
#[derive(Debug, Clone, PartialEq)]
pub struct Rope {
    pub theta: f64,
    pub scaling: Option<RopeScaling>,
}

/// What a layer's attention looks like beyond the shared shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerAttention {
    /// Sliding window in tokens (a query sees itself and the `window - 1` tokens before it), or global attention.
    pub window: Option<usize>,
    /// The layer uses `ModelParams::local_rope` (Gemma 3's sliding layers) instead of the model's RoPE.
    pub local_rope: bool,
}

/// A mixture-of-experts MLP (Mixtral, Qwen3-MoE): its shape, its routing and the layers that have one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoeParams {
    pub num_experts: usize,
    /// Experts each token is routed to (`num_experts_per_tok`).
    pub top_k: usize,
    /// Each expert's gate/up width (Qwen3-MoE's `moe_intermediate_size`; Mixtral's `intermediate_size`).
    pub expert_intermediate: usize,
    /// The chosen experts' probabilities are divided by their sum (Mixtral always; Qwen3-MoE's `norm_topk_prob`).
    pub renormalize: bool,
    /// One entry per layer: the layer's MLP is routed experts (else the dense `intermediate_size` MLP).
    pub layers: Vec<bool>,
    /// The router and the experts' projections have biases (gpt-oss).
    pub bias: bool,
}

impl MoeParams {
    /// Whether layer `i` has routed experts.
    pub fn is_moe_layer(&self, i: usize) -> bool {
        self.layers.get(i).copied().unwrap_or(false)
    }
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

impl ModelDims {
    /// The largest value each size may take: far above every released model (the widest have hidden sizes near 16k,
    /// vocabularies near 260k, 126 layers), and small enough that no shape, parameter or byte count built from them
    /// overflows a u64. A config or GGUF header that lies about a size (`num_hidden_layers: 1e12`) is refused here,
    /// before anything is allocated per layer or per row.
    pub const LIMITS: [(&'static str, usize); 7] = [
        ("vocab_size", 1 << 24),
        ("hidden_size", 1 << 18),
        ("intermediate_size", 1 << 20),
        ("num_layers", 4096),
        ("num_heads", 4096),
        ("num_kv_heads", 4096),
        ("head_dim", 4096),
    ];

    /// Checks every size against [`ModelDims::LIMITS`].
    pub fn check_limits(&self) -> crate::Result<()> {
        let values = [
            self.vocab_size,
            self.hidden_size,
            self.intermediate_size,
            self.num_layers,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
        ];
        for ((name, max), value) in Self::LIMITS.iter().zip(values) {
            if value > *max {
                return Err(crate::ModelError::Config(format!(
                    "{name} {value} is larger than any model rserve can serve (at most {max}): the file is corrupt"
                )));
            }
        }
        Ok(())
    }
}

/// The checked model configuration. Invariants: `num_heads % num_kv_heads == 0`, `head_dim > 0`, all sizes > 0.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelParams {
    pub architecture: Architecture,
    /// The sizes; read through `Deref` as `params.hidden_size`.
    pub dims: ModelDims,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: Option<RopeScaling>,
    /// Gemma 3's RoPE of the sliding-window layers (`rope_local_base_freq`, no scaling).
    pub local_rope: Option<Rope>,
    /// One entry per layer.
    pub layers: Vec<LayerAttention>,
    /// Per-head RMSNorm of q and k before RoPE (`q_norm` / `k_norm`: Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// The gated MLP's activation (`hidden_act` / `hidden_activation`).
    pub activation: Activation,
    /// Attention scores are `q . k * attn_scale` (`query_pre_attn_scalar ** -0.5` for Gemma, else
    /// `head_dim ** -0.5`).
    pub attn_scale: f64,
    /// Gemma 2's `attn_logit_softcapping`.
    pub attn_softcap: Option<f64>,
    /// Gemma 2's `final_logit_softcapping`.
    pub final_softcap: Option<f64>,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// Bias on q/k/v projections (Qwen2, gpt-oss).
    pub attention_bias: bool,
    /// Bias on the attention output projection (gpt-oss).
    pub o_proj_bias: bool,
    /// Per-head learned sink logits in each attention softmax (gpt-oss's `self_attn.sinks`).
    pub attention_sinks: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// `torch_dtype` / `dtype` from the config, e.g. "bfloat16"; None for GGUF.
    pub torch_dtype: Option<String>,
    /// The sliding window of the model's sliding-window layers, if it has any (`layers` says which).
    pub sliding_window: Option<usize>,
    /// Routed-experts MLPs (Mixtral, Qwen3-MoE).
    pub moe: Option<MoeParams>,
}

impl ModelParams {
    /// The RoPE of the model's (global) layers.
    pub fn rope(&self) -> Rope {
        Rope { theta: self.rope_theta, scaling: self.rope_scaling.clone() }
    }

    /// Whether layer `i`'s MLP is routed experts.
    pub fn is_moe_layer(&self, i: usize) -> bool {
        self.moe.as_ref().is_some_and(|m| m.is_moe_layer(i))
    }

    /// The token embedding multiplier (Gemma: sqrt(hidden_size)).
    pub fn embed_scale(&self) -> f32 {
        if self.architecture.is_gemma() {
            (self.hidden_size as f32).sqrt()
        } else {
            1.0
        }
    }
}

/// `num_layers` layers with the same attention: a sliding window on every layer, or none.
pub fn uniform_layers(num_layers: usize, window: Option<usize>) -> Vec<LayerAttention> {
    vec![LayerAttention { window, local_rope: false }; num_layers]
}

impl Deref for ModelParams {
    type Target = ModelDims;

    fn deref(&self) -> &ModelDims {
        &self.dims
    }
}
