//! Parameter counts from a `ModelShape`: per layer (attention, MLP or experts, norms), embeddings, output head,
//! a multimodal model's vision tower and projector, and the split into pipeline stages. Exact for the llama family (checked against transformers in
//! tests/plan_params.rs); other layer layouts are estimates built from the same standard keys.

use serde::Serialize;

use super::shape::{Attention, ModelShape, Moe, VisionProjector, VisionTower};

/// Where the parameters are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ParamCount {
    pub embedding: u64,
    /// The output projection (0 when tied to the embeddings).
    pub lm_head: u64,
    pub final_norm: u64,
    /// The vision tower and its projector into the decoder (0: a text-only model); held by the first stage.
    pub vision: u64,
    /// Every decoder layer's parameters, in order.
    #[serde(skip)]
    pub per_layer: Vec<u64>,
    pub layers: u64,
    pub total: u64,
    /// Parameters one token uses: `total` less, in each routed layer, the experts it is not routed to (equal to
    /// `total` for a dense model).
    pub active: u64,
}

fn attention_params(s: &ModelShape) -> u64 {
    let h = s.hidden_size as u64;
    let heads = s.num_heads as u64;
    match s.attention {
        Attention::Standard => {
            let q = heads * s.head_dim as u64;
            let kv = s.num_kv_heads as u64 * s.head_dim as u64;
            let mut n = h * q + 2 * h * kv + q * h;
            if s.qkv_bias {
                n += q + 2 * kv;
            }
            if s.o_bias {
                n += h;
            }
            if s.qk_norm {
                n += 2 * s.head_dim as u64;
            }
            if s.attention_sinks {
                n += heads;
            }
            n
        }
        Attention::Latent(m) => {
            let qk_head = (m.qk_nope_head_dim + m.qk_rope_head_dim) as u64;
            let q = match m.q_lora_rank {
                Some(r) => h * r as u64 + r as u64 + r as u64 * heads * qk_head,
                None => h * heads * qk_head,
            };
            let rank = m.kv_lora_rank as u64;
            let kv_a = h * (rank + m.qk_rope_head_dim as u64) + rank;
            let kv_b = rank * heads * (m.qk_nope_head_dim + m.v_head_dim) as u64;
            let o = heads * m.v_head_dim as u64 * h;
            q + kv_a + kv_b + o
        }
    }
}

fn dense_mlp(s: &ModelShape, intermediate: u64) -> u64 {
    mlp_params(s, intermediate, s.mlp_bias)
}

/// One gated (or up/down) MLP of `intermediate` width, with biases on every projection when `bias`.
fn mlp_params(s: &ModelShape, intermediate: u64, bias: bool) -> u64 {
    let h = s.hidden_size as u64;
    let mats = if s.gated_mlp { 3 } else { 2 };
    let bias = if bias { (mats - 1) * intermediate + h } else { 0 };
    mats * h * intermediate + bias
}

/// One routed expert's parameters.
fn expert_params(s: &ModelShape, m: &Moe) -> u64 {
    mlp_params(s, m.expert_intermediate as u64, m.bias)
}

fn layer_params(s: &ModelShape, i: usize) -> u64 {
    let h = s.hidden_size as u64;
    let mlp = match &s.moe {
        Some(m) if m.routed.get(i).copied().unwrap_or(false) => {
            let experts = m.experts as u64 * expert_params(s, m);
            let shared = if m.shared_intermediate > 0 { dense_mlp(s, m.shared_intermediate as u64) } else { 0 };
            let gate = if m.shared_expert_gate { h } else { 0 };
            let router_bias = if m.bias { m.experts as u64 } else { 0 };
            h * m.experts as u64 + router_bias + experts + shared + gate
        }
        _ => dense_mlp(s, s.intermediate_size as u64),
    };
    attention_params(s) + mlp + s.norms_per_layer as u64 * h
}

/// A SigLIP vision tower (as transformers' `SiglipVisionModel` builds it) plus the projector into a decoder of
/// `text_hidden`: patch convolution with bias, one position embedding per patch, per layer two layer norms (weight
/// and bias), q / k / v / out projections with biases and a biased fc1 / fc2 MLP, the post layer norm, and the
/// attention-pooling head when `vision_use_head`.
pub fn vision_params(v: &VisionTower, text_hidden: usize) -> u64 {
    let h = v.hidden_size as u64;
    let i = v.intermediate_size as u64;
    let patches = (v.image_size / v.patch_size.max(1)).pow(2) as u64;
    let patch_embedding = v.num_channels as u64 * (v.patch_size as u64).pow(2) * h + h;
    let position_embedding = patches * h;
    let mlp = h * i + i + i * h + h;
    let layer = 2 * (2 * h) + 4 * (h * h + h) + mlp;
    let post_norm = 2 * h;
    // Probe, multi-head attention (packed in-projection with bias, out-projection with bias), layer norm, MLP.
    let head = if v.pooling_head { h + (3 * h * h + 3 * h) + (h * h + h) + 2 * h + mlp } else { 0 };
    let projector = match v.projector {
        VisionProjector::Gemma3 => h + h * text_hidden as u64,
    };
    patch_embedding + position_embedding + v.num_layers as u64 * layer + post_norm + head + projector
}

/// Counts the parameters the config describes.
pub fn count_params(s: &ModelShape) -> ParamCount {
    let embedding = s.vocab_size as u64 * s.hidden_size as u64;
    let lm_head = if s.tie_word_embeddings { 0 } else { embedding };
    let final_norm = s.hidden_size as u64;
    let per_layer: Vec<u64> = (0..s.num_layers).map(|i| layer_params(s, i)).collect();
    let layers = per_layer.iter().sum();
    let vision = s.vision.map_or(0, |v| vision_params(&v, s.hidden_size));
    let idle_experts = s.moe.as_ref().map_or(0, |m| {
        let idle = m.experts.saturating_sub(m.experts_per_token) as u64;
        m.moe_layers as u64 * idle * expert_params(s, m)
    });
    let total = embedding + lm_head + final_norm + vision + layers;
    ParamCount { embedding, lm_head, final_norm, vision, per_layer, layers, total, active: total - idle_experts }
}

impl ParamCount {
    /// Parameters held by each of `pp` pipeline stages of equal layer counts: the first stage also holds the
    /// embeddings (and a multimodal model's vision tower), the last the final norm and the output head (with tied
    /// embeddings and `pp > 1`, its own copy).
    pub fn stages(&self, pp: usize) -> Vec<u64> {
        let pp = pp.max(1);
        let per_stage = self.per_layer.len().div_ceil(pp).max(1);
        let mut stages: Vec<u64> = self.per_layer.chunks(per_stage).map(|c| c.iter().sum()).collect();
        stages.resize(pp, 0);
        stages[0] += self.embedding + self.vision;
        let head = if self.lm_head == 0 && pp > 1 { self.embedding } else { self.lm_head };
        stages[pp - 1] += head + self.final_norm;
        stages
    }
}
