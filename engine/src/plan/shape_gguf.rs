//! `ModelShape` from a GGUF header (metadata and tensor directory; no tensor data is read), for any
//! `general.architecture`, plus the parameter count of the tensor directory (the GGUF analogue of reading
//! safetensors headers).

use std::collections::BTreeMap;

use candle_core::quantized::gguf_file::{Content, Value};

use super::shape::{Attention, LatentAttention, ModelShape, Moe, SlidingWindow};
use crate::config::gguf_meta::GgufMeta;
use crate::{EngineError, Result};

fn meta_usize(content: &Content, key: &str) -> Result<Option<usize>> {
    let n = match content.metadata.get(key) {
        None => return Ok(None),
        Some(Value::U8(x)) => Some(*x as u64),
        Some(Value::U16(x)) => Some(*x as u64),
        Some(Value::U32(x)) => Some(*x as u64),
        Some(Value::U64(x)) => Some(*x),
        Some(Value::I32(x)) => u64::try_from(*x).ok(),
        Some(Value::I64(x)) => u64::try_from(*x).ok(),
        Some(_) => None,
    };
    n.and_then(|n| usize::try_from(n).ok())
        .map(Some)
        .ok_or_else(|| EngineError::Config(format!("GGUF metadata `{key}` is not an unsigned integer")))
}

fn need(v: Option<u64>, key: &str) -> Result<usize> {
    match v.and_then(|v| usize::try_from(v).ok()) {
        Some(0) => Err(EngineError::Config(format!("GGUF metadata `{key}` must be greater than 0"))),
        Some(n) => Ok(n),
        None => Err(EngineError::Config(format!("GGUF metadata has no `{key}`"))),
    }
}

/// Number of elements in every tensor of the directory.
pub fn gguf_param_count(content: &Content) -> u64 {
    content.tensor_infos.values().map(|t| t.shape.elem_count() as u64).sum()
}

/// Reads the model sizes from GGUF metadata.
pub fn shape_from_gguf(content: &Content) -> Result<ModelShape> {
    let meta = GgufMeta::from_content(content)?;
    let arch = meta.architecture.clone();
    let k = |suffix: &str| format!("{arch}.{suffix}");
    let hidden_size = need(meta.embedding_length, &k("embedding_length"))?;
    let num_layers = need(meta.block_count, &k("block_count"))?;
    let num_heads = need(meta.head_count, &k("attention.head_count"))?;
    let num_kv_heads = match meta.head_count_kv {
        Some(0) => {
            return Err(EngineError::Config(format!(
                "GGUF metadata `{}` must be greater than 0",
                k("attention.head_count_kv")
            )))
        }
        Some(n) => n as usize,
        None => num_heads,
    };
    let head_dim = meta.key_length.map(|d| d as usize).unwrap_or(hidden_size / num_heads);
    if head_dim == 0 {
        return Err(EngineError::Config("GGUF head dimension is 0".into()));
    }
    let vocab_size = meta
        .vocab_size
        .map(|v| v as usize)
        .or(meta.token_count)
        .or_else(|| meta.token_embd_shape.as_ref().and_then(|s| s.iter().copied().max()))
        .ok_or_else(|| EngineError::Config("GGUF has no vocabulary size (no tokens, no token_embd.weight)".into()))?;
    let mut notes = Vec::new();
    let intermediate_size = match meta.feed_forward_length {
        Some(n) => n as usize,
        None => {
            notes.push(format!("no `{}`: assumed 4 x hidden", k("feed_forward_length")));
            4 * hidden_size
        }
    };
    let attention = match meta_usize(content, &k("attention.kv_lora_rank"))? {
        Some(kv_lora_rank) => {
            let rope = meta_usize(content, &k("rope.dimension_count"))?.unwrap_or(64);
            Attention::Latent(LatentAttention {
                kv_lora_rank,
                q_lora_rank: meta_usize(content, &k("attention.q_lora_rank"))?,
                qk_nope_head_dim: head_dim.saturating_sub(rope),
                qk_rope_head_dim: rope,
                v_head_dim: meta_usize(content, &k("attention.value_length"))?.unwrap_or(head_dim),
            })
        }
        None => Attention::Standard,
    };
    let sliding = meta_usize(content, &k("attention.sliding_window"))?.filter(|w| *w > 0).map(|window| {
        let sliding_layers = match arch.as_str() {
            "gemma2" => num_layers.div_ceil(2),
            "gemma3" => num_layers - num_layers / 6,
            _ => num_layers,
        };
        SlidingWindow { window, sliding_layers }
    });
    let moe = match meta_usize(content, &k("expert_count"))?.filter(|e| *e > 1) {
        Some(experts) => {
            let first = meta_usize(content, &k("leading_dense_block_count"))?.unwrap_or(0).min(num_layers);
            let expert_intermediate =
                meta_usize(content, &k("expert_feed_forward_length"))?.unwrap_or(intermediate_size);
            let shared = meta_usize(content, &k("expert_shared_count"))?.unwrap_or(0) * expert_intermediate;
            let routed: Vec<bool> = (0..num_layers).map(|i| i >= first).collect();
            Some(Moe {
                experts,
                experts_per_token: meta_usize(content, &k("expert_used_count"))?.unwrap_or(1),
                expert_intermediate,
                shared_intermediate: shared,
                shared_expert_gate: false,
                moe_layers: num_layers - first,
                routed,
            })
        }
        None => None,
    };
    Ok(ModelShape {
        architecture: format!("{arch} (GGUF)"),
        model_type: arch.clone(),
        vocab_size,
        hidden_size,
        intermediate_size,
        num_layers,
        num_heads,
        num_kv_heads,
        head_dim,
        max_position_embeddings: meta.context_length.map(|n| n as usize).filter(|n| *n > 0),
        tie_word_embeddings: !meta.has_output_weight,
        torch_dtype: None,
        gated_mlp: content.tensor_infos.contains_key("blk.0.ffn_gate.weight") || moe.is_some(),
        qkv_bias: content.tensor_infos.contains_key("blk.0.attn_q.bias"),
        o_bias: content.tensor_infos.contains_key("blk.0.attn_output.bias"),
        mlp_bias: content.tensor_infos.contains_key("blk.0.ffn_up.bias"),
        norms_per_layer: if arch.starts_with("gemma2") || arch.starts_with("gemma3") { 4 } else { 2 },
        qk_norm: content.tensor_infos.contains_key("blk.0.attn_q_norm.weight"),
        attention,
        sliding,
        other_layers: BTreeMap::new(),
        moe,
        quantization: None,
        notes,
    })
}
