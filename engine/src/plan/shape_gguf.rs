//! `ModelShape` from a GGUF header (metadata and tensor directory; no tensor data is read), for any
//! `general.architecture`, plus the parameter count of the tensor directory (the GGUF analogue of reading
//! safetensors headers).

use std::collections::BTreeMap;

use candle_core::quantized::gguf_file::Content;

use super::shape::{norms_per_layer, Attention, LatentAttention, ModelShape, Moe, SlidingWindow};
use crate::config::gguf_meta::{meta_uint, required, GgufMeta};
use crate::config::ModelDims;
use rserve_model_io::{ModelError, Result};

/// Number of elements in every tensor of the directory.
pub fn gguf_param_count(content: &Content) -> u64 {
    content.tensor_infos.values().map(|t| t.shape.elem_count() as u64).sum()
}

/// Reads the model sizes from GGUF metadata.
pub fn shape_from_gguf(content: &Content) -> Result<ModelShape> {
    let meta = GgufMeta::from_content(content)?;
    let arch = meta.architecture.as_str();
    // A per-architecture size key (`{arch}.{suffix}`), when present.
    let meta_usize = |suffix: &str| meta_uint::<usize>(content, &meta.key(suffix));
    let hidden_size = required(meta.embedding_length, &meta.key("embedding_length"))?;
    let num_layers = required(meta.block_count, &meta.key("block_count"))?;
    let num_heads = required(meta.head_count, &meta.key("attention.head_count"))?;
    let mut notes = Vec::new();
    let dims = ModelDims {
        num_kv_heads: meta.kv_heads(num_heads)?,
        head_dim: match meta.key_length.map(|d| d as usize).unwrap_or(hidden_size / num_heads) {
            0 => return Err(ModelError::Config("GGUF head dimension is 0".into())),
            d => d,
        },
        vocab_size: meta
            .vocab_size
            .map(|v| v as usize)
            .or(meta.token_count)
            .or_else(|| meta.token_embd_shape.as_ref().and_then(|s| s.iter().copied().max()))
            .ok_or_else(|| {
                ModelError::Config("GGUF has no vocabulary size (no tokens, no token_embd.weight)".into())
            })?,
        intermediate_size: match meta.feed_forward_length {
            Some(n) => n as usize,
            None => {
                notes.push(format!("no `{}`: assumed 4 x hidden", meta.key("feed_forward_length")));
                hidden_size.saturating_mul(4)
            }
        },
        hidden_size,
        num_layers,
        num_heads,
    };
    dims.check_limits()?;
    let head_dim = dims.head_dim;
    let attention = match meta_usize("attention.kv_lora_rank")? {
        Some(kv_lora_rank) => {
            let rope = meta_usize("rope.dimension_count")?.unwrap_or(64);
            Attention::Latent(LatentAttention {
                kv_lora_rank,
                q_lora_rank: meta_usize("attention.q_lora_rank")?,
                qk_nope_head_dim: head_dim.saturating_sub(rope),
                qk_rope_head_dim: rope,
                v_head_dim: meta_usize("attention.value_length")?.unwrap_or(head_dim),
            })
        }
        None => Attention::Standard,
    };
    let sliding = meta_usize("attention.sliding_window")?.filter(|w| *w > 0).map(|window| {
        let sliding_layers = match arch {
            "gemma2" => num_layers.div_ceil(2),
            "gemma3" => num_layers - num_layers / 6,
            _ => num_layers,
        };
        SlidingWindow { window, sliding_layers }
    });
    let moe = match meta_usize("expert_count")?.filter(|e| *e > 1) {
        Some(experts) => {
            let first = meta_usize("leading_dense_block_count")?.unwrap_or(0).min(num_layers);
            let expert_intermediate = meta_usize("expert_feed_forward_length")?.unwrap_or(dims.intermediate_size);
            let shared = meta_usize("expert_shared_count")?.unwrap_or(0) * expert_intermediate;
            let routed: Vec<bool> = (0..num_layers).map(|i| i >= first).collect();
            Some(Moe {
                experts,
                experts_per_token: meta_usize("expert_used_count")?.unwrap_or(1),
                expert_intermediate,
                shared_intermediate: shared,
                shared_expert_gate: false,
                moe_layers: num_layers - first,
                routed,
                bias: false,
            })
        }
        None => None,
    };
    Ok(ModelShape {
        architecture: format!("{arch} (GGUF)"),
        model_type: arch.to_string(),
        dims,
        max_position_embeddings: meta.context_length.map(|n| n as usize).filter(|n| *n > 0),
        tie_word_embeddings: !meta.has_output_weight,
        torch_dtype: None,
        gated_mlp: content.tensor_infos.contains_key("blk.0.ffn_gate.weight") || moe.is_some(),
        qkv_bias: content.tensor_infos.contains_key("blk.0.attn_q.bias"),
        o_bias: content.tensor_infos.contains_key("blk.0.attn_output.bias"),
        mlp_bias: content.tensor_infos.contains_key("blk.0.ffn_up.bias"),
        norms_per_layer: norms_per_layer(arch),
        qk_norm: content.tensor_infos.contains_key("blk.0.attn_q_norm.weight"),
        attention_sinks: false,
        attention,
        sliding,
        other_layers: BTreeMap::new(),
        moe,
        vision: None,
        quantization: None,
        notes,
    })
}
