//! `ModelShape`: the sizes the planner reads (the model's `ModelDims` plus what the layers look like), taken from any
//! decoder `config.json` (the raw JSON: standard keys and their common aliases), from a checked `ModelParams`, or (in
//! `shape_gguf`) from GGUF metadata.
//!
//! Unlike `config::hf`, this reader refuses no architecture: it needs only the hidden size, layer count, head count
//! and vocabulary size, and records what the per-token KV formula does not fit — multi-head latent attention,
//! sliding-window / interleaved local-global layers, layer kinds without a KV cache — so the plan can warn instead
//! of printing a wrong number. Boundary: sizes only; no arithmetic on memory happens here.

use std::collections::BTreeMap;
use std::ops::Deref;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::config::hf::{positive, required as required_size};
use crate::config::{ModelDims, ModelParams};
use rserve_model_io::{ModelError, Result};

/// How the attention layers cache keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Attention {
    /// Multi-head or grouped-query attention: K and V of `num_kv_heads x head_dim` per layer and token.
    Standard,
    /// Multi-head latent attention (DeepSeek-V2/V3): one compressed latent per layer and token.
    Latent(LatentAttention),
}

/// The sizes of multi-head latent attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LatentAttention {
    pub kv_lora_rank: usize,
    pub q_lora_rank: Option<usize>,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
}

/// Layers that attend to a window of recent tokens only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SlidingWindow {
    pub window: usize,
    pub sliding_layers: usize,
}

/// Mixture-of-experts MLP sizes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Moe {
    pub experts: usize,
    pub experts_per_token: usize,
    pub expert_intermediate: usize,
    /// Total intermediate size of the always-on shared experts (0: none).
    pub shared_intermediate: usize,
    /// A sigmoid gate (hidden x 1) in front of the shared expert (Qwen2-MoE).
    pub shared_expert_gate: bool,
    /// Layers with a routed MLP; the others have a dense MLP of `intermediate_size`.
    pub moe_layers: usize,
    /// Per layer: routed (true) or dense.
    #[serde(skip)]
    pub routed: Vec<bool>,
    /// The router and every expert's projections have biases (gpt-oss).
    pub bias: bool,
}

/// A SigLIP vision tower and the projector that maps its output into the decoder (multimodal wrappers read through
/// their `text_config`, such as Gemma 3's `Gemma3ForConditionalGeneration`): counted in the parameters, no KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct VisionTower {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_channels: usize,
    pub image_size: usize,
    pub patch_size: usize,
    /// SigLIP's attention-pooling head (`vision_use_head`, default true).
    pub pooling_head: bool,
    pub projector: VisionProjector,
}

/// How the vision tower's output reaches the decoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VisionProjector {
    /// Gemma 3: an RMS norm over the vision hidden size and a `vision hidden x text hidden` matrix, no bias.
    Gemma3,
}

/// The model sizes the planner works from. It reads as its `dims` (`shape.num_heads`) through `Deref`, and its JSON
/// lists their fields inline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelShape {
    /// `architectures[0]`, else `model_type`, else the GGUF architecture.
    pub architecture: String,
    pub model_type: String,
    #[serde(flatten)]
    pub dims: ModelDims,
    pub max_position_embeddings: Option<usize>,
    pub tie_word_embeddings: bool,
    /// `dtype` / `torch_dtype` as written in the config.
    pub torch_dtype: Option<String>,
    /// gate + up + down projections (llama family); false: up + down only (GPT-2 style).
    pub gated_mlp: bool,
    pub qkv_bias: bool,
    pub o_bias: bool,
    pub mlp_bias: bool,
    pub norms_per_layer: usize,
    /// Per-head RMS norms on q and k (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// One learned sink logit per attention head and layer (gpt-oss).
    pub attention_sinks: bool,
    pub attention: Attention,
    pub sliding: Option<SlidingWindow>,
    /// Layers whose kind is neither full nor sliding attention (linear attention, mamba, ...), by kind.
    pub other_layers: BTreeMap<String, usize>,
    pub moe: Option<Moe>,
    /// The vision tower of a multimodal wrapper, when the planner knows its layout (else not counted; see `notes`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vision: Option<VisionTower>,
    /// `quantization_config.quant_method`, when the checkpoint is quantized.
    pub quantization: Option<String>,
    /// What the reader assumed or where it looked (shown with the plan).
    pub notes: Vec<String>,
}

const HIDDEN: &[&str] = &["hidden_size", "n_embd", "d_model"];
const LAYERS: &[&str] = &["num_hidden_layers", "n_layer", "num_layers"];
const HEADS: &[&str] = &["num_attention_heads", "n_head", "num_heads"];
const KV_HEADS: &[&str] = &["num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num"];
const INTERMEDIATE: &[&str] = &["intermediate_size", "ffn_hidden_size", "n_inner"];
const VOCAB: &[&str] = &["vocab_size", "padded_vocab_size"];
const MAX_POS: &[&str] = &["max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"];

/// Model types whose transformers config ties the embeddings unless told otherwise.
const TIED_BY_DEFAULT: &[&str] =
    &["gemma", "gemma2", "gemma3", "gemma3_text", "gpt2", "opt", "bloom", "falcon", "gpt_bigcode"];
/// Model types whose MLP is up + down without a gate.
const UNGATED_MLP: &[&str] =
    &["gpt2", "gpt_neox", "gptj", "opt", "bloom", "falcon", "phi", "gpt_bigcode", "starcoder2", "mpt"];

/// transformers' config-class defaults the planner needs when a config leaves a key out (the published Gemma 3
/// multimodal configs give no `vocab_size` or `max_position_embeddings` in `text_config`): `Gemma3TextConfig`.
fn class_default(model_type: &str, key: &str) -> Option<usize> {
    match (model_type, key) {
        ("gemma3_text", "vocab_size") => Some(262_208),
        ("gemma3_text", "max_position_embeddings") => Some(131_072),
        _ => None,
    }
}

/// The first of `keys` present in `cfg`, else the config class's default for `keys[0]` (noted).
fn get_or_default(
    cfg: &Map<String, Value>,
    keys: &[&str],
    model_type: &str,
    notes: &mut Vec<String>,
) -> Result<Option<usize>> {
    if let Some(n) = get_usize(cfg, keys)? {
        return Ok(Some(n));
    }
    let default = class_default(model_type, keys[0]);
    if let Some(n) = default {
        notes.push(format!("no `{}`: transformers' {model_type} default {n}", keys[0]));
    }
    Ok(default)
}

/// Reads `key` (the first of `keys` that is present and not null) as a non-negative integer.
fn get_usize(cfg: &Map<String, Value>, keys: &[&str]) -> Result<Option<usize>> {
    for key in keys {
        match cfg.get(*key) {
            None | Some(Value::Null) => continue,
            Some(v) => {
                let n = v.as_u64().or_else(|| v.as_f64().filter(|f| *f >= 0.0 && f.fract() == 0.0).map(|f| f as u64));
                return match n.and_then(|n| usize::try_from(n).ok()) {
                    Some(n) => Ok(Some(n)),
                    None => Err(ModelError::Config(format!("`{key}` must be a non-negative integer, got {v}"))),
                };
            }
        }
    }
    Ok(None)
}

/// The first of `keys` that is present, which must be greater than 0; errors name `keys[0]`.
fn required(cfg: &Map<String, Value>, keys: &[&str]) -> Result<usize> {
    required_size(get_usize(cfg, keys)?, keys[0])
}

/// RMS norms per decoder layer: 4 for Gemma 2 and 3 (before and after both attention and the MLP), else 2.
pub(super) fn norms_per_layer(model_type: &str) -> usize {
    if model_type.starts_with("gemma2") || model_type.starts_with("gemma3") {
        4
    } else {
        2
    }
}

fn get_bool(cfg: &Map<String, Value>, key: &str) -> Option<bool> {
    cfg.get(key).and_then(Value::as_bool)
}

fn get_str<'a>(cfg: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    cfg.get(key).and_then(Value::as_str)
}

impl ModelShape {
    /// Reads the text of a `config.json`. Multimodal wrappers are read through their `text_config`.
    pub fn from_config_json(text: &str) -> Result<Self> {
        let root: Value = serde_json::from_str(text)
            .map_err(|e| ModelError::Config(format!("config.json is not valid JSON: {e}")))?;
        let top = root.as_object().ok_or_else(|| ModelError::Config("config.json is not a JSON object".into()))?;
        let mut notes = Vec::new();
        let has_hidden = HIDDEN.iter().any(|k| top.get(*k).is_some_and(|v| !v.is_null()));
        let (cfg, vision) = match top.get("text_config").and_then(Value::as_object) {
            Some(text_cfg) if !has_hidden => {
                let vision = vision_tower(top)?;
                notes.push(match vision {
                    Some(_) => "read the decoder from `text_config`; the SigLIP vision tower and projector \
                                (`vision_config`) are counted in the parameters"
                        .to_string(),
                    None => "read the decoder from `text_config` (vision/audio encoders are not counted)".to_string(),
                });
                (text_cfg, vision)
            }
            _ => (top, None),
        };
        let mut shape = Self::from_map(top, cfg, notes)?;
        shape.vision = vision;
        Ok(shape)
    }

    fn from_map(top: &Map<String, Value>, cfg: &Map<String, Value>, mut notes: Vec<String>) -> Result<Self> {
        let architecture = top
            .get("architectures")
            .and_then(Value::as_array)
            .and_then(|a| a.first())
            .and_then(Value::as_str)
            .or_else(|| get_str(cfg, "model_type"))
            .or_else(|| get_str(top, "model_type"))
            .unwrap_or("unknown")
            .to_string();
        let model_type = get_str(cfg, "model_type").or_else(|| get_str(top, "model_type")).unwrap_or("").to_lowercase();
        let hidden_size = required(cfg, HIDDEN)?;
        let num_layers = required(cfg, LAYERS)?;
        let num_heads = required(cfg, HEADS)?;
        let dims = ModelDims {
            vocab_size: required_size(get_or_default(cfg, VOCAB, &model_type, &mut notes)?, VOCAB[0])?,
            num_kv_heads: match positive(get_usize(cfg, KV_HEADS)?, "num_key_value_heads")? {
                Some(n) => n,
                None if get_bool(cfg, "multi_query") == Some(true) => 1,
                None => num_heads,
            },
            head_dim: match positive(get_usize(cfg, &["head_dim"])?, "head_dim")? {
                Some(d) => d,
                None if hidden_size < num_heads => {
                    return Err(ModelError::Config(format!(
                        "`hidden_size` ({hidden_size}) is smaller than `num_attention_heads` ({num_heads}) and no \
                         `head_dim` is given"
                    )))
                }
                None => hidden_size / num_heads,
            },
            intermediate_size: match get_usize(cfg, INTERMEDIATE)? {
                Some(n) => n,
                None => {
                    notes.push(format!(
                        "no `intermediate_size`: assumed 4 x hidden = {}",
                        hidden_size.saturating_mul(4)
                    ));
                    hidden_size.saturating_mul(4)
                }
            },
            hidden_size,
            num_layers,
            num_heads,
        };
        dims.check_limits()?;
        let tie_word_embeddings = get_bool(cfg, "tie_word_embeddings")
            .or_else(|| get_bool(top, "tie_word_embeddings"))
            .unwrap_or(TIED_BY_DEFAULT.contains(&model_type.as_str()));
        let attention_bias = get_bool(cfg, "attention_bias").unwrap_or(false);
        let qwen = matches!(model_type.as_str(), "qwen2" | "qwen2_moe");
        let attention = latent_attention(cfg)?.map_or(Attention::Standard, Attention::Latent);
        let (sliding, other_layers) = sliding_layers(cfg, &model_type, num_layers, &mut notes)?;
        let moe = moe(cfg, num_layers, dims.intermediate_size)?.map(|m| Moe { bias: model_type == "gpt_oss", ..m });
        let torch_dtype = get_str(cfg, "dtype")
            .or_else(|| get_str(cfg, "torch_dtype"))
            .or_else(|| get_str(top, "dtype"))
            .or_else(|| get_str(top, "torch_dtype"))
            .map(str::to_string);
        let quantization = top
            .get("quantization_config")
            .or_else(|| cfg.get("quantization_config"))
            .map(|q| q.get("quant_method").and_then(Value::as_str).unwrap_or("unknown").to_string());
        let max_position_embeddings = get_or_default(cfg, MAX_POS, &model_type, &mut notes)?.filter(|n| *n > 0);
        Ok(ModelShape {
            architecture,
            dims,
            max_position_embeddings,
            tie_word_embeddings,
            torch_dtype,
            gated_mlp: !UNGATED_MLP.contains(&model_type.as_str()),
            qkv_bias: attention_bias || qwen || get_bool(cfg, "qkv_bias") == Some(true),
            o_bias: attention_bias,
            mlp_bias: get_bool(cfg, "mlp_bias").unwrap_or(false),
            norms_per_layer: norms_per_layer(&model_type),
            qk_norm: matches!(model_type.as_str(), "qwen3" | "qwen3_moe" | "gemma3" | "gemma3_text"),
            attention_sinks: model_type == "gpt_oss",
            attention,
            sliding,
            other_layers,
            moe,
            vision: None,
            quantization,
            notes,
            model_type,
        })
    }

    /// The shape of a checked llama-family `ModelParams` (what the server's start-up sizing has).
    pub fn from_params(p: &ModelParams) -> Self {
        let architecture = format!("{:?}", p.architecture);
        ModelShape {
            model_type: architecture.to_lowercase(),
            architecture,
            dims: p.dims,
            max_position_embeddings: Some(p.max_position_embeddings),
            tie_word_embeddings: p.tie_word_embeddings,
            torch_dtype: p.torch_dtype.clone(),
            gated_mlp: true,
            qkv_bias: p.attention_bias,
            o_bias: p.o_proj_bias,
            mlp_bias: false,
            norms_per_layer: if p.architecture.is_gemma() { 4 } else { 2 },
            qk_norm: p.qk_norm,
            attention_sinks: p.attention_sinks,
            attention: Attention::Standard,
            sliding: p.sliding_window.map(|window| SlidingWindow {
                window,
                sliding_layers: p.layers.iter().filter(|l| l.window.is_some()).count(),
            }),
            other_layers: BTreeMap::new(),
            moe: p.moe.as_ref().map(|m| Moe {
                experts: m.num_experts,
                experts_per_token: m.top_k,
                expert_intermediate: m.expert_intermediate,
                shared_intermediate: 0,
                shared_expert_gate: false,
                moe_layers: m.layers.iter().filter(|r| **r).count(),
                routed: m.layers.clone(),
                bias: m.bias,
            }),
            vision: None,
            quantization: None,
            notes: Vec::new(),
        }
    }

    /// Layers that keep a KV cache entry per token (every layer except linear-attention / state-space layers).
    pub fn kv_layers(&self) -> usize {
        let without_cache: usize = self
            .other_layers
            .iter()
            .filter(|(kind, _)| !kind.contains("attention") || kind.contains("linear"))
            .map(|(_, n)| n)
            .sum();
        self.num_layers.saturating_sub(without_cache)
    }
}

impl Deref for ModelShape {
    type Target = ModelDims;

    fn deref(&self) -> &ModelDims {
        &self.dims
    }
}

/// The vision tower of a multimodal wrapper whose layout the planner knows: a SigLIP `vision_config` under Gemma 3's
/// `Gemma3ForConditionalGeneration` (`model_type` "gemma3"), with `SiglipVisionConfig`'s defaults for absent keys.
fn vision_tower(top: &Map<String, Value>) -> Result<Option<VisionTower>> {
    let Some(v) = top.get("vision_config").and_then(Value::as_object) else { return Ok(None) };
    let siglip = get_str(v, "model_type").is_none_or(|t| t == "siglip_vision_model");
    if get_str(top, "model_type") != Some("gemma3") || !siglip {
        return Ok(None);
    }
    let size = |key: &str, default: usize| -> Result<usize> { Ok(get_usize(v, &[key])?.unwrap_or(default)) };
    Ok(Some(VisionTower {
        hidden_size: size("hidden_size", 768)?,
        intermediate_size: size("intermediate_size", 3072)?,
        num_layers: size("num_hidden_layers", 12)?,
        num_channels: size("num_channels", 3)?,
        image_size: size("image_size", 224)?,
        patch_size: positive(Some(size("patch_size", 16)?), "vision_config.patch_size")?.unwrap_or(16),
        pooling_head: get_bool(v, "vision_use_head").unwrap_or(true),
        projector: VisionProjector::Gemma3,
    }))
}

/// Multi-head latent attention, recognised by `kv_lora_rank`.
fn latent_attention(cfg: &Map<String, Value>) -> Result<Option<LatentAttention>> {
    let Some(kv_lora_rank) = get_usize(cfg, &["kv_lora_rank"])? else { return Ok(None) };
    Ok(Some(LatentAttention {
        kv_lora_rank,
        q_lora_rank: get_usize(cfg, &["q_lora_rank"])?,
        qk_nope_head_dim: get_usize(cfg, &["qk_nope_head_dim"])?.unwrap_or(128),
        qk_rope_head_dim: get_usize(cfg, &["qk_rope_head_dim"])?.unwrap_or(64),
        v_head_dim: get_usize(cfg, &["v_head_dim"])?.unwrap_or(128),
    }))
}

type LayerKinds = (Option<SlidingWindow>, BTreeMap<String, usize>);

/// Which layers use a sliding window, following transformers' rule for each family; `layer_types` wins when present.
fn sliding_layers(
    cfg: &Map<String, Value>,
    model_type: &str,
    layers: usize,
    notes: &mut Vec<String>,
) -> Result<LayerKinds> {
    let window = get_usize(cfg, &["sliding_window"])?;
    let mut others = BTreeMap::new();
    let sliding = if let Some(types) = cfg.get("layer_types").and_then(Value::as_array) {
        let mut sliding = 0;
        for t in types {
            match t.as_str().unwrap_or("unknown") {
                "full_attention" | "attention" | "global_attention" => {}
                "sliding_attention" | "local_attention" => sliding += 1,
                other => *others.entry(other.to_string()).or_insert(0) += 1,
            }
        }
        if sliding > 0 && window.is_none() {
            notes.push(format!("{sliding} layers are marked sliding_attention but no `sliding_window` is given"));
        }
        sliding
    } else {
        match model_type {
            // Gemma 2: even-numbered layers are local.
            "gemma2" => layers.div_ceil(2),
            // Gemma 3: every `sliding_window_pattern`-th layer is global, the others local.
            "gemma3" | "gemma3_text" => {
                let pattern = get_usize(cfg, &["sliding_window_pattern"])?.unwrap_or(6).max(1);
                layers - layers / pattern
            }
            // Qwen: only with `use_sliding_window`, and only from `max_window_layers` on.
            "qwen2" | "qwen2_moe" | "qwen3" | "qwen3_moe" => {
                if get_bool(cfg, "use_sliding_window") == Some(true) {
                    layers - get_usize(cfg, &["max_window_layers"])?.unwrap_or(28).min(layers)
                } else {
                    0
                }
            }
            _ if get_bool(cfg, "use_sliding_window") == Some(false) => 0,
            _ => {
                if window.is_some() {
                    layers
                } else {
                    0
                }
            }
        }
    };
    let sliding = match window {
        Some(window) if sliding > 0 && window > 0 => {
            Some(SlidingWindow { window, sliding_layers: sliding.min(layers) })
        }
        _ => None,
    };
    Ok((sliding, others))
}

/// Mixture-of-experts sizes (DeepSeek, Mixtral and Qwen-MoE key names).
fn moe(cfg: &Map<String, Value>, layers: usize, intermediate: usize) -> Result<Option<Moe>> {
    let experts = get_usize(cfg, &["n_routed_experts", "num_local_experts", "num_experts"])?;
    let Some(experts) = experts.filter(|e| *e > 1) else { return Ok(None) };
    let expert_intermediate = get_usize(cfg, &["moe_intermediate_size"])?.unwrap_or(intermediate);
    let (shared_intermediate, shared_expert_gate) = match get_usize(cfg, &["n_shared_experts"])? {
        Some(n) => (n * expert_intermediate, false),
        None => match get_usize(cfg, &["shared_expert_intermediate_size"])? {
            Some(s) if s > 0 => (s, true),
            _ => (0, false),
        },
    };
    let first = get_usize(cfg, &["first_k_dense_replace"])?.unwrap_or(0);
    let freq = get_usize(cfg, &["moe_layer_freq", "decoder_sparse_step"])?.unwrap_or(1).max(1);
    let dense_only: Vec<usize> = cfg
        .get("mlp_only_layers")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_u64).map(|x| x as usize).collect())
        .unwrap_or_default();
    let decoder_sparse = cfg.get("decoder_sparse_step").is_some_and(|v| !v.is_null());
    let is_moe = |i: usize| {
        let step = if decoder_sparse { (i + 1).is_multiple_of(freq) } else { i.is_multiple_of(freq) };
        i >= first && step && !dense_only.contains(&i)
    };
    let routed: Vec<bool> = (0..layers).map(is_moe).collect();
    Ok(Some(Moe {
        experts,
        experts_per_token: get_usize(cfg, &["num_experts_per_tok", "num_experts_per_token", "moe_topk"])?.unwrap_or(1),
        expert_intermediate,
        shared_intermediate,
        shared_expert_gate,
        moe_layers: routed.iter().filter(|r| **r).count(),
        bias: false,
        routed,
    }))
}
