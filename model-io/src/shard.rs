//! Which part of the model one process holds: its tensor-parallel rank (a slice of the heads, of the MLP and of the
//! vocabulary) and its pipeline stage (a contiguous range of layers), and how it takes each checkpoint tensor
//! (`Shard::cut`, the one place the split is written: loading and upload both follow it).

use std::ops::Range;

use crate::config::{ModelDims, ModelParams};
use crate::error::{ModelError, Result};

/// One process's share of the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    pub tp_rank: usize,
    pub tp_size: usize,
    pub layers: Range<usize>,
    /// This stage embeds the tokens (pipeline stage 0).
    pub first: bool,
    /// This stage computes the logits (last pipeline stage).
    pub last: bool,
    /// Routed experts shared out over the TP ranks (each holds whole experts) instead of each one sliced.
    pub expert_parallel: bool,
}

impl Shard {
    /// The whole model in one process.
    pub fn whole(p: &ModelParams) -> Self {
        Shard { tp_rank: 0, tp_size: 1, layers: 0..p.num_layers, first: true, last: true, expert_parallel: false }
    }

    /// Rank `tp_rank` of `tp` in stage `stage` of `pp`; layers split as evenly as possible (earlier stages take the
    /// remainder).
    pub fn new(p: &ModelParams, tp: usize, pp: usize, tp_rank: usize, stage: usize) -> Result<Self> {
        check_tp(p, tp)?;
        if pp == 0 || pp > p.num_layers {
            return Err(ModelError::InvalidArgument(format!(
                "--pipeline-parallel-size {pp} must be between 1 and the number of layers ({})",
                p.num_layers
            )));
        }
        Ok(Shard {
            tp_rank,
            tp_size: tp,
            layers: stage_layers(p.num_layers, pp, stage),
            first: stage == 0,
            last: stage + 1 == pp,
            expert_parallel: false,
        })
    }

    /// `new` with routed experts shared out over the TP ranks (`expert_parallel`) or each one sliced.
    pub fn with_experts(
        p: &ModelParams,
        tp: usize,
        pp: usize,
        tp_rank: usize,
        stage: usize,
        expert_parallel: bool,
    ) -> Result<Self> {
        Ok(Shard { expert_parallel, ..Self::new(p, tp, pp, tp_rank, stage)? })
    }

    pub fn heads(&self, p: &ModelParams) -> usize {
        p.num_heads / self.tp_size
    }

    pub fn kv_heads(&self, p: &ModelParams) -> usize {
        p.num_kv_heads / self.tp_size
    }

    pub fn intermediate(&self, p: &ModelParams) -> Range<usize> {
        split(p.intermediate_size, self.tp_size, self.tp_rank)
    }

    /// This rank's slice of each expert's intermediate width (routed-experts layers): all of it under expert
    /// parallelism.
    pub fn expert_intermediate(&self, p: &ModelParams) -> Range<usize> {
        let width = p.moe.as_ref().map_or(0, |m| m.expert_intermediate);
        match self.expert_parallel {
            true => 0..width,
            false => split(width, self.tp_size, self.tp_rank),
        }
    }

    /// The routed experts this rank holds: all of them, or its share under expert parallelism (experts differ in
    /// number by at most one between ranks).
    pub fn experts(&self, p: &ModelParams) -> Range<usize> {
        let n = p.moe.as_ref().map_or(0, |m| m.num_experts);
        match self.expert_parallel {
            true => split(n, self.tp_size, self.tp_rank),
            false => 0..n,
        }
    }

    pub fn vocab(&self, p: &ModelParams) -> Range<usize> {
        split(p.vocab_size, self.tp_size, self.tp_rank)
    }

    /// The parameters of this shard's KV cache: its KV heads and its layers.
    pub fn kv_params(&self, p: &ModelParams) -> ModelParams {
        let dims = ModelDims { num_kv_heads: self.kv_heads(p), num_layers: self.layers.len(), ..p.dims };
        ModelParams { dims, ..p.clone() }
    }
}

/// How a shard takes one checkpoint tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cut {
    Whole,
    /// Output features (rows of a `[out, in]` weight, or a bias).
    Rows(Range<usize>),
    /// Input features (columns).
    Cols(Range<usize>),
}

impl Shard {
    /// How this shard takes the tensor `name` (Hugging Face naming); None when it does not need it at all. The one
    /// place the split is written: model upload and shard-aware loading both follow it.
    pub fn cut(&self, p: &ModelParams, name: &str) -> Option<Cut> {
        if let Some(rest) = name.strip_prefix("model.layers.") {
            let (i, tail) = rest.split_once('.')?;
            if !self.layers.contains(&i.parse::<usize>().ok()?) {
                return None;
            }
            let (hd, r) = (p.head_dim, self.tp_rank);
            let q = r * self.heads(p) * hd..(r + 1) * self.heads(p) * hd;
            let kv = r * self.kv_heads(p) * hd..(r + 1) * self.kv_heads(p) * hd;
            // Routed experts: each expert split like a dense MLP, or whole on the rank that holds it under expert
            // parallelism; the router is whole.
            if let Some((e, leaf)) = tail.split_once(".experts.").and_then(|(_, e)| e.split_once('.')) {
                use crate::weights::names::{EXPERT_COL_SPLIT, EXPERT_ONCE, EXPERT_ROW_SPLIT};
                if self.expert_parallel {
                    return self.experts(p).contains(&e.parse::<usize>().ok()?).then_some(Cut::Whole);
                }
                return if EXPERT_ROW_SPLIT.contains(&leaf) {
                    Some(Cut::Rows(self.expert_intermediate(p)))
                } else if EXPERT_COL_SPLIT.contains(&leaf) {
                    Some(Cut::Cols(self.expert_intermediate(p)))
                } else if EXPERT_ONCE.contains(&leaf) {
                    (self.tp_rank == 0).then_some(Cut::Whole)
                } else {
                    Some(Cut::Whole)
                };
            }
            return Some(match tail {
                "self_attn.q_proj.weight" | "self_attn.q_proj.bias" => Cut::Rows(q),
                "self_attn.k_proj.weight" | "self_attn.k_proj.bias" => Cut::Rows(kv),
                "self_attn.v_proj.weight" | "self_attn.v_proj.bias" => Cut::Rows(kv),
                "self_attn.o_proj.weight" => Cut::Cols(q),
                // Added once after the rows are summed over the ranks: rank 0 holds it.
                "self_attn.o_proj.bias" => return (r == 0).then_some(Cut::Whole),
                "self_attn.sinks" => Cut::Rows(r * self.heads(p)..(r + 1) * self.heads(p)),
                "mlp.gate_proj.weight" | "mlp.up_proj.weight" => Cut::Rows(self.intermediate(p)),
                "mlp.down_proj.weight" => Cut::Cols(self.intermediate(p)),
                _ => Cut::Whole,
            });
        }
        match name {
            // Token lookup needs every row; a tied LM head is cut from it on the last stage.
            "model.embed_tokens.weight" => (self.first || (self.last && p.tie_word_embeddings)).then_some(Cut::Whole),
            "lm_head.weight" => (self.last && !p.tie_word_embeddings).then(|| Cut::Rows(self.vocab(p))),
            "model.norm.weight" => self.last.then_some(Cut::Whole),
            _ => Some(Cut::Whole),
        }
    }
}

/// `t` as `cut` takes it (contiguous).
pub fn apply_cut(t: &candle_core::Tensor, cut: &Cut) -> Result<candle_core::Tensor> {
    // A cut that keeps everything is the tensor itself (not a copy), so a weight kept only as GGUF blocks keeps them.
    let whole = |dim: usize, r: &Range<usize>| -> Result<bool> { Ok(r.start == 0 && r.len() == t.dim(dim)?) };
    Ok(match cut {
        Cut::Whole => t.clone(),
        Cut::Rows(r) if whole(0, r)? => t.clone(),
        Cut::Cols(r) if whole(1, r)? => t.clone(),
        Cut::Rows(r) => t.narrow(0, r.start, r.len())?.contiguous()?,
        Cut::Cols(r) => t.narrow(1, r.start, r.len())?.contiguous()?,
    })
}

/// Layers of pipeline stage `stage` of `pp`.
pub fn stage_layers(n: usize, pp: usize, stage: usize) -> Range<usize> {
    split(n, pp, stage)
}

/// Part `i` of `parts` of `0..n`, sizes differing by at most one (earlier parts larger).
fn split(n: usize, parts: usize, i: usize) -> Range<usize> {
    let (base, rem) = (n / parts, n % parts);
    let start = i * base + i.min(rem);
    start..start + base + usize::from(i < rem)
}

/// TP sizes that divide the attention and KV heads (so no KV head is duplicated).
pub fn valid_tp_sizes(p: &ModelParams) -> Vec<usize> {
    (1..=p.num_heads).filter(|t| p.num_heads.is_multiple_of(*t) && p.num_kv_heads.is_multiple_of(*t)).collect()
}

/// A TP size that does not divide the heads is a start-up error listing the valid sizes.
pub fn check_tp(p: &ModelParams, tp: usize) -> Result<()> {
    if tp == 0 || !p.num_heads.is_multiple_of(tp) || !p.num_kv_heads.is_multiple_of(tp) {
        return Err(ModelError::InvalidArgument(format!(
            "--tensor-parallel-size {tp} must divide the {} attention heads and {} KV heads; valid sizes: {:?}",
            p.num_heads,
            p.num_kv_heads,
            valid_tp_sizes(p)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Over the ranks of a TP x PP layout, every checkpoint tensor is held by exactly the stage(s) that need it, and
    /// its TP slices tile its cut dimension exactly once.
    #[test]
    fn cuts_tile_every_tensor_once() {
        let cfg = include_str!("../../tests/fixtures/configs/smollm2_135m_instruct.json");
        let base = crate::config::hf::parse_config_json(cfg).unwrap();
        for tied in [true, false] {
            let p = ModelParams { tie_word_embeddings: tied, ..base.clone() };
            for tp in valid_tp_sizes(&p) {
                for pp in [1, 2, 4, 30] {
                    for spec in crate::weights::names::expected_tensors(&p) {
                        let mut stages_holding = 0;
                        for stage in 0..pp {
                            let cuts: Vec<Option<Cut>> = (0..tp)
                                .map(|r| Shard::new(&p, tp, pp, r, stage).unwrap().cut(&p, &spec.name))
                                .collect();
                            if cuts.iter().all(Option::is_none) {
                                continue;
                            }
                            stages_holding += 1;
                            let (mut rows, mut cols) = (Vec::new(), Vec::new());
                            for c in cuts {
                                match c.expect("all TP ranks of a stage hold the same tensors") {
                                    Cut::Whole => {}
                                    Cut::Rows(r) => rows.push(r),
                                    Cut::Cols(r) => cols.push(r),
                                }
                            }
                            for (parts, dim) in [(rows, 0), (cols, 1)] {
                                if parts.is_empty() {
                                    continue;
                                }
                                assert_eq!(parts.len(), tp, "{}", spec.name);
                                let mut at = 0;
                                for r in parts {
                                    assert_eq!(r.start, at, "{} tp={tp}", spec.name);
                                    at = r.end;
                                }
                                assert_eq!(at, spec.shape[dim], "{} tp={tp}", spec.name);
                            }
                        }
                        let want = match spec.name.as_str() {
                            // The first stage embeds; a tied head is cut from the embedding on the last stage too.
                            "model.embed_tokens.weight" if tied && pp > 1 => 2,
                            _ => 1,
                        };
                        assert_eq!(stages_holding, want, "{} tp={tp} pp={pp} tied={tied}", spec.name);
                    }
                }
            }
        }
    }

    /// Under expert parallelism every expert tensor is held whole by exactly one TP rank, each rank holds the experts
    /// of its `experts()` range and nothing else changes hands (attention and the router are cut as without it).
    #[test]
    fn expert_parallel_holds_each_expert_once() {
        let cfg = include_str!("../../tests/fixtures/configs/mixtral_8x7b_instruct.json");
        let p = crate::config::hf::parse_config_json(cfg).unwrap();
        for tp in [2, 4, 8] {
            let ranks: Vec<Shard> = (0..tp).map(|r| Shard::with_experts(&p, tp, 1, r, 0, true).unwrap()).collect();
            let mut next = 0;
            for s in &ranks {
                assert_eq!(s.experts(&p).start, next);
                assert_eq!(s.expert_intermediate(&p), 0..14336);
                next = s.experts(&p).end;
            }
            assert_eq!(next, 8);
            for spec in crate::weights::names::expected_tensors(&p) {
                let cuts: Vec<Option<Cut>> = ranks.iter().map(|s| s.cut(&p, &spec.name)).collect();
                let expert = spec.name.split_once(".experts.").map(|(_, e)| e.split('.').next().unwrap());
                match expert {
                    Some(e) => {
                        let e: usize = e.parse().unwrap();
                        let holders: Vec<usize> = (0..tp).filter(|&r| cuts[r].is_some()).collect();
                        assert_eq!(holders.len(), 1, "{} tp={tp}", spec.name);
                        assert!(ranks[holders[0]].experts(&p).contains(&e));
                        assert_eq!(cuts[holders[0]], Some(Cut::Whole));
                    }
                    None => {
                        let plain: Vec<Option<Cut>> = (0..tp)
                            .map(|r| Shard::with_experts(&p, tp, 1, r, 0, false).unwrap().cut(&p, &spec.name))
                            .collect();
                        assert_eq!(cuts, plain, "{}", spec.name);
                    }
                }
            }
        }
    }

    #[test]
    fn splits_cover_everything_evenly() {
        let parts: Vec<_> = (0..4).map(|i| split(30, 4, i)).collect();
        assert_eq!(parts, vec![0..8, 8..16, 16..23, 23..30]);
        assert_eq!(split(30, 2, 1), 15..30);
        assert_eq!(split(49152, 3, 2), 32768..49152);
    }
}
