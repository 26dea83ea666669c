//! Tensor names and shapes: the Hugging Face names a model needs (`expected_tensors`), the names its checkpoint
//! stores them under (`checkpoint_tensors`: Phi-3 fuses q/k/v and gate/up, `unfuse` splits them) and the llama.cpp
//! GGUF name of each (`hf_to_gguf`, `gguf_to_hf`).

use crate::config::{Architecture, ModelParams};
use crate::{ModelError, Result};

pub const EMBED_TOKENS: &str = "model.embed_tokens.weight";
pub const FINAL_NORM: &str = "model.norm.weight";
pub const LM_HEAD: &str = "lm_head.weight";

/// A tensor the model needs, with its expected shape (`[out, in]` for linear layers, as Hugging Face stores them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub shape: Vec<usize>,
}

impl TensorSpec {
    fn new(name: impl Into<String>, shape: &[usize]) -> Self {
        TensorSpec { name: name.into(), shape: shape.to_vec() }
    }

    /// Checks a found shape against the expected one; the error names the tensor and the config values.
    pub fn check(&self, found: &[usize], params: &ModelParams) -> Result<()> {
        if found == self.shape.as_slice() {
            return Ok(());
        }
        Err(ModelError::Weights(format!(
            "tensor `{}` has shape {found:?}, but the config implies {:?} (vocab_size={}, hidden_size={}, \
             intermediate_size={}, num_heads={}, num_kv_heads={}, head_dim={})",
            self.name,
            self.shape,
            params.vocab_size,
            params.hidden_size,
            params.intermediate_size,
            params.num_heads,
            params.num_kv_heads,
            params.head_dim
        )))
    }
}

/// Every tensor a llama-family model with `params` needs, in a stable order.
pub fn expected_tensors(params: &ModelParams) -> Vec<TensorSpec> {
    let h = params.hidden_size;
    let q = params.num_heads * params.head_dim;
    let kv = params.num_kv_heads * params.head_dim;
    let i = params.intermediate_size;
    let mut out = vec![TensorSpec::new(EMBED_TOKENS, &[params.vocab_size, h])];
    for l in 0..params.num_layers {
        let p = format!("model.layers.{l}");
        out.push(TensorSpec::new(format!("{p}.input_layernorm.weight"), &[h]));
        out.push(TensorSpec::new(format!("{p}.self_attn.q_proj.weight"), &[q, h]));
        out.push(TensorSpec::new(format!("{p}.self_attn.k_proj.weight"), &[kv, h]));
        out.push(TensorSpec::new(format!("{p}.self_attn.v_proj.weight"), &[kv, h]));
        if params.attention_bias {
            out.push(TensorSpec::new(format!("{p}.self_attn.q_proj.bias"), &[q]));
            out.push(TensorSpec::new(format!("{p}.self_attn.k_proj.bias"), &[kv]));
            out.push(TensorSpec::new(format!("{p}.self_attn.v_proj.bias"), &[kv]));
        }
        if params.qk_norm {
            out.push(TensorSpec::new(format!("{p}.self_attn.q_norm.weight"), &[params.head_dim]));
            out.push(TensorSpec::new(format!("{p}.self_attn.k_norm.weight"), &[params.head_dim]));
        }
        out.push(TensorSpec::new(format!("{p}.self_attn.o_proj.weight"), &[h, q]));
        if params.o_proj_bias {
            out.push(TensorSpec::new(format!("{p}.self_attn.o_proj.bias"), &[h]));
        }
        if params.attention_sinks {
            out.push(TensorSpec::new(format!("{p}.self_attn.sinks"), &[params.num_heads]));
        }
        out.push(TensorSpec::new(format!("{p}.post_attention_layernorm.weight"), &[h]));
        if params.architecture.is_gemma() {
            out.push(TensorSpec::new(format!("{p}.pre_feedforward_layernorm.weight"), &[h]));
            out.push(TensorSpec::new(format!("{p}.post_feedforward_layernorm.weight"), &[h]));
        }
        if let Some(m) = params.moe.as_ref().filter(|m| m.is_moe_layer(l)) {
            let names = moe_names(params, l);
            let ei = m.expert_intermediate;
            out.push(TensorSpec::new(format!("{}.weight", names.router), &[m.num_experts, h]));
            if m.bias {
                out.push(TensorSpec::new(format!("{}.bias", names.router), &[m.num_experts]));
            }
            for [gate, up, down] in &names.experts {
                out.push(TensorSpec::new(format!("{gate}.weight"), &[ei, h]));
                out.push(TensorSpec::new(format!("{up}.weight"), &[ei, h]));
                out.push(TensorSpec::new(format!("{down}.weight"), &[h, ei]));
                if m.bias {
                    out.push(TensorSpec::new(format!("{gate}.bias"), &[ei]));
                    out.push(TensorSpec::new(format!("{up}.bias"), &[ei]));
                    out.push(TensorSpec::new(format!("{down}.bias"), &[h]));
                }
            }
            continue;
        }
        out.push(TensorSpec::new(format!("{p}.mlp.gate_proj.weight"), &[i, h]));
        out.push(TensorSpec::new(format!("{p}.mlp.up_proj.weight"), &[i, h]));
        out.push(TensorSpec::new(format!("{p}.mlp.down_proj.weight"), &[h, i]));
    }
    out.push(TensorSpec::new(FINAL_NORM, &[h]));
    if !params.tie_word_embeddings {
        out.push(TensorSpec::new(LM_HEAD, &[params.vocab_size, h]));
    }
    out
}

/// The checkpoint names (without `.weight`) of one layer's routed experts: the router, and each expert's gate, up
/// and down projections.
pub struct MoeNames {
    pub router: String,
    pub experts: Vec<[String; 3]>,
}

/// Mixtral's `block_sparse_moe.gate` and `block_sparse_moe.experts.{e}.w1 / w3 / w2`; Qwen3-MoE's `mlp.gate` and
/// `mlp.experts.{e}.gate_proj / up_proj / down_proj`; gpt-oss's `mlp.router` and the same expert names (its checkpoint
/// packs each layer's experts into one tensor, which `weights::gpt_oss` unpacks to these).
pub fn moe_names(params: &ModelParams, layer: usize) -> MoeNames {
    let experts = params.moe.as_ref().map_or(0, |m| m.num_experts);
    let (block, router, [gate, up, down]) = match params.architecture {
        Architecture::Mixtral => ("block_sparse_moe", "gate", ["w1", "w3", "w2"]),
        Architecture::GptOss => ("mlp", "router", ["gate_proj", "up_proj", "down_proj"]),
        _ => ("mlp", "gate", ["gate_proj", "up_proj", "down_proj"]),
    };
    let p = format!("model.layers.{layer}.{block}");
    MoeNames {
        router: format!("{p}.{router}"),
        experts: (0..experts).map(|e| [gate, up, down].map(|n| format!("{p}.experts.{e}.{n}"))).collect(),
    }
}

/// The expert projections' cut (shard.rs): the gate/up suffixes (and biases) split by rows, the down suffixes by
/// columns; the down bias is added once, by TP rank 0.
pub const EXPERT_ROW_SPLIT: &[&str] =
    &["w1.weight", "w3.weight", "gate_proj.weight", "up_proj.weight", "gate_proj.bias", "up_proj.bias"];
pub const EXPERT_COL_SPLIT: &[&str] = &["w2.weight", "down_proj.weight"];
pub const EXPERT_ONCE: &[&str] = &["down_proj.bias"];

/// The fused projections of a checkpoint: (fused suffix, its parts in row order).
const FUSED: &[(&str, &[&str])] = &[
    ("self_attn.qkv_proj", &["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"]),
    ("mlp.gate_up_proj", &["mlp.gate_proj", "mlp.up_proj"]),
];

/// Whether the checkpoint stores q/k/v and gate/up fused (Phi-3's `qkv_proj`, `gate_up_proj`).
pub fn has_fused_projections(params: &ModelParams) -> bool {
    params.architecture == Architecture::Phi3
}

/// The tensors as the checkpoint stores them: `expected_tensors`, with Phi-3's fused projections in place of their
/// parts.
pub fn checkpoint_tensors(params: &ModelParams) -> Vec<TensorSpec> {
    let specs = expected_tensors(params);
    if !has_fused_projections(params) {
        return specs;
    }
    let mut out = Vec::with_capacity(specs.len());
    for spec in specs {
        let fused = FUSED.iter().find_map(|(fused, parts)| {
            let (layer, part) = spec.name.strip_suffix(".weight")?.rsplit_once(".self_attn.").map_or_else(
                || spec.name.strip_suffix(".weight")?.rsplit_once(".mlp.").map(|(l, p)| (l, format!("mlp.{p}"))),
                |(l, p)| Some((l, format!("self_attn.{p}"))),
            )?;
            let at = parts.iter().position(|p| *p == part)?;
            Some((at, format!("{layer}.{fused}.weight")))
        });
        match fused {
            // The fused tensor stands where its first part was, with the parts' rows summed below.
            Some((0, name)) => out.push(TensorSpec::new(name, &spec.shape)),
            Some((_, name)) => {
                let f = out.iter_mut().rev().find(|s| s.name == name).expect("the first part comes first");
                f.shape[0] += spec.shape[0];
            }
            None => out.push(spec),
        }
    }
    out
}

/// Splits fused projections (`checkpoint_tensors`' names) into the parts the model reads (`expected_tensors`).
pub fn unfuse(
    tensors: &mut std::collections::HashMap<String, candle_core::Tensor>,
    params: &ModelParams,
) -> Result<()> {
    if !has_fused_projections(params) {
        return Ok(());
    }
    let expected = expected_tensors(params);
    let rows = |name: &str| expected.iter().find(|s| s.name == name).map(|s| s.shape[0]);
    for l in 0..params.num_layers {
        for (fused, parts) in FUSED {
            let name = format!("model.layers.{l}.{fused}.weight");
            let Some(t) = tensors.remove(&name) else { continue };
            let mut at = 0;
            for part in *parts {
                let part_name = format!("model.layers.{l}.{part}.weight");
                let n = rows(&part_name).unwrap_or(0);
                if at + n > t.dim(0)? {
                    return Err(ModelError::Weights(format!("`{name}` has {} rows, too few for its parts", t.dim(0)?)));
                }
                tensors.insert(part_name, t.narrow(0, at, n)?.contiguous()?);
                at += n;
            }
        }
    }
    Ok(())
}

/// Per-layer name pairs: (Hugging Face suffix after `model.layers.{i}.`, llama.cpp suffix after `blk.{i}.`).
const LAYER_NAMES: &[(&str, &str)] = &[
    ("self_attn.q_proj", "attn_q"),
    ("self_attn.k_proj", "attn_k"),
    ("self_attn.v_proj", "attn_v"),
    ("self_attn.o_proj", "attn_output"),
    ("mlp.gate_proj", "ffn_gate"),
    ("mlp.up_proj", "ffn_up"),
    ("mlp.down_proj", "ffn_down"),
    ("input_layernorm", "attn_norm"),
    ("post_attention_layernorm", "ffn_norm"),
    ("self_attn.q_norm", "attn_q_norm"),
    ("self_attn.k_norm", "attn_k_norm"),
];

/// Top-level name pairs (Hugging Face, llama.cpp), without the `.weight` suffix.
const GLOBAL_NAMES: &[(&str, &str)] =
    &[("model.embed_tokens", "token_embd"), ("model.norm", "output_norm"), ("lm_head", "output")];

/// Splits `base.weight` / `base.bias` into `(base, suffix)`.
fn split_kind(name: &str) -> Option<(&str, &str)> {
    name.strip_suffix(".weight").map(|b| (b, "weight")).or_else(|| name.strip_suffix(".bias").map(|b| (b, "bias")))
}

/// The llama.cpp name of a Hugging Face tensor name, e.g. `model.layers.3.mlp.up_proj.weight` -> `blk.3.ffn_up.weight`.
pub fn hf_to_gguf(name: &str) -> Option<String> {
    translate(name, ["model.layers.", "blk."], |&(hf, gguf)| (hf, gguf))
}

/// The Hugging Face name of a llama.cpp tensor name, e.g. `blk.0.attn_q.weight` -> `model.layers.0.self_attn.q_proj.weight`.
pub fn gguf_to_hf(name: &str) -> Option<String> {
    translate(name, ["blk.", "model.layers."], |&(hf, gguf)| (gguf, hf))
}

/// One direction of the name tables: `side` orders each (Hugging Face, llama.cpp) pair as (from, to);
/// `[from_prefix, to_prefix]` are the per-layer prefixes.
fn translate(
    name: &str,
    [from_prefix, to_prefix]: [&str; 2],
    side: fn(&(&'static str, &'static str)) -> (&'static str, &'static str),
) -> Option<String> {
    let (base, kind) = split_kind(name)?;
    if let Some((_, to)) = GLOBAL_NAMES.iter().map(side).find(|(from, _)| *from == base) {
        return Some(format!("{to}.{kind}"));
    }
    let (layer, suffix) = base.strip_prefix(from_prefix)?.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (_, to) = LAYER_NAMES.iter().map(side).find(|(from, _)| *from == suffix)?;
    Some(format!("{to_prefix}{layer}.{to}.{kind}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for (hf, gg) in [
            ("model.embed_tokens.weight", "token_embd.weight"),
            ("model.norm.weight", "output_norm.weight"),
            ("lm_head.weight", "output.weight"),
            ("model.layers.12.self_attn.q_proj.bias", "blk.12.attn_q.bias"),
            ("model.layers.0.self_attn.o_proj.weight", "blk.0.attn_output.weight"),
            ("model.layers.7.post_attention_layernorm.weight", "blk.7.ffn_norm.weight"),
        ] {
            assert_eq!(hf_to_gguf(hf).as_deref(), Some(gg));
            assert_eq!(gguf_to_hf(gg).as_deref(), Some(hf));
        }
        assert_eq!(gguf_to_hf("rope_freqs.weight"), None);
        assert_eq!(hf_to_gguf("model.layers.x.mlp.up_proj.weight"), None);
    }
}
