//! The decoder on any `Backend`, for every architecture rserve serves (Llama 3.x, SmolLM2, Mistral, Qwen2/3,
//! Gemma 2/3, Phi-3, Mixtral, Qwen3-MoE): pre-norm attention with rotary embeddings and grouped-query heads reading
//! the paged KV cache, a gated MLP or routed experts, and logits for the last token of each sequence of a flattened
//! batch. What differs between them is data in `ModelParams`: per-head q/k norms (Qwen3, Gemma 3), Gemma's norms
//! after attention and MLP and its scaled embeddings, sliding-window layers and their own RoPE (Gemma 3),
//! soft-capping (Gemma 2), GELU-tanh, LongRoPE, and which layers route each token to its top-k experts.

use crate::backend::{
    moe_max_tiles, moe_pairs_ungrouped, AttnShape, Backend, HeldExperts, MoeInput, MoeTiles, Op, QkNorm, RopeIo,
};
use crate::config::{Architecture, ModelParams};
use crate::error::{EngineError, ModelError, Result};
use crate::model::flat::{DeviceBatch, FlatBatch};
use crate::model::kv_cache::PagedKvCache;
use crate::model::rope;
use crate::model::rope::RopeTable;
use crate::model::shard::{apply_cut, Shard, TpCollective};
use crate::weights::Weights;
use candle_core::Tensor;
use rserve_scheduler::ScheduledSeq;
use std::ops::Range;

struct Linear<B: Backend> {
    w: B::Buffer,
    bias: Option<B::Buffer>,
    out_features: usize,
}

/// A layer's MLP: dense (gate/up fused, then down) or routed experts.
enum Mlp<B: Backend> {
    Dense {
        gate_up: Linear<B>,
        down: Linear<B>,
    },
    /// `router` `[experts, hidden]` (every expert); `gate_up` each held expert's gate rows then up rows, stacked
    /// (`[held * 2 * width, hidden]`); `down` their `[hidden, width]` stacked (`[held * hidden, width]`), `width`
    /// this shard's slice of the expert intermediate size, `held` the experts this shard holds (all, or its share
    /// under expert parallelism).
    Experts {
        router: Linear<B>,
        gate_up: B::Buffer,
        down: B::Buffer,
        width: usize,
        held: std::ops::Range<usize>,
        /// gpt-oss: the held experts' gate/up biases `[held, 2 * width]` (f32) and down biases `[held, hidden]` (on
        /// the rank that adds them once: TP rank 0, or every rank under expert parallelism).
        bias: Option<(B::Buffer, Option<B::Buffer>)>,
    },
}

/// The buffers of one routed-experts layer (`Mlp::Experts`), as `LlamaModel::experts` reads them.
struct ExpertWeights<'a, B: Backend> {
    router: &'a Linear<B>,
    gate_up: &'a B::Buffer,
    down: &'a B::Buffer,
    bias: Option<&'a (B::Buffer, Option<B::Buffer>)>,
}

/// One decoder layer. q/k/v are one fused projection (rows: q, then k, then v) and gate/up another (gate rows, then
/// up rows): one matrix multiply each, so a decode step launches two instead of five and reads its activations
/// twice instead of five times.
///
/// Norms: `input_norm` before attention and `post_norm` before the MLP (llama layout); Gemma also normalises the
/// attention output (`attn_out_norm`, its `post_attention_layernorm`, with `post_norm` its
/// `pre_feedforward_layernorm`) and the MLP output (`mlp_out_norm`).
struct Layer<B: Backend> {
    input_norm: B::Buffer,
    post_norm: B::Buffer,
    attn_out_norm: Option<B::Buffer>,
    mlp_out_norm: Option<B::Buffer>,
    /// Per-head RMSNorm weights of q and k (Qwen3, Gemma 3).
    qk_norm: Option<(B::Buffer, B::Buffer)>,
    qkv: Linear<B>,
    o: Linear<B>,
    mlp: Mlp<B>,
    /// Sliding window of this layer's attention.
    window: Option<usize>,
    /// Index into `LlamaModel::ropes`.
    rope: usize,
    /// This rank's heads' attention sink logits (gpt-oss), f32.
    sinks: Option<B::Buffer>,
}

/// One RoPE's frequencies on the device and its cos/sin multiplier.
struct RopeBuf<B: Backend> {
    inv_freq: B::Buffer,
    mscale: f32,
}

/// A loaded llama-family model (or one shard of it): weights on the backend plus the rotary table.
pub struct LlamaModel<B: Backend> {
    params: ModelParams,
    shard: Shard,
    /// Present on the first pipeline stage.
    embed: Option<B::Buffer>,
    layers: Vec<Layer<B>>,
    /// Final norm and this rank's vocabulary slice of the LM head, on the last stage.
    norm: Option<B::Buffer>,
    lm_head: Option<B::Buffer>,
    /// The model's RoPE, then Gemma 3's local one.
    ropes: Vec<RopeBuf<B>>,
    /// LongRoPE: sequences longer than this read the long factors (`FlatBatch::mark_long_rope`).
    long_rope_after: Option<usize>,
}

/// What one stage's device part leaves on the device.
pub enum DeviceOutput<B: Backend> {
    /// Not the last stage: the hidden state is `residual + delta`.
    Hidden { residual: B::Buffer, delta: Option<B::Buffer> },
    /// `[rows, vocab slice]` logits of the batch's `FlatBatch::last_rows`: each sequence's last token, then any prompt
    /// rows the step scores.
    Logits(B::Buffer),
}

/// What one pipeline stage produces.
pub enum StageOutput {
    /// Hidden states `[tokens, hidden]` for the next stage.
    Hidden(Vec<f32>),
    /// `[rows, vocab]` logits of each sequence's last token, then of the step's prompt rows (full vocabulary,
    /// gathered over TP ranks).
    Logits(Vec<f32>),
}

fn rows(t: &Tensor, r: Range<usize>) -> Result<Tensor> {
    if r.start == 0 && r.len() == t.dim(0)? {
        // The tensor itself, so a weight kept only as GGUF blocks keeps them (a copy would have none).
        return Ok(t.clone());
    }
    Ok(t.narrow(0, r.start, r.len())?.contiguous()?)
}

/// The projections `names` (checkpoint prefixes) stacked by output rows into one linear layer.
fn linear<B: Backend>(
    b: &B,
    upload_time: &std::cell::Cell<std::time::Duration>,
    take: &dyn Fn(&str) -> Result<Tensor>,
    names: &[String],
    bias: bool,
) -> Result<Linear<B>> {
    // The projections' weights (or biases), stacked by rows on the device; with the number of rows.
    let stack = |suffix: &str| -> Result<(B::Buffer, usize)> {
        let parts = names.iter().map(|n| take(&format!("{n}.{suffix}"))).collect::<Result<Vec<_>>>()?;
        let rows = parts.iter().map(|p| p.dim(0)).sum::<candle_core::Result<usize>>()?;
        let t0 = std::time::Instant::now();
        let buf = match parts.as_slice() {
            [one] => b.upload_weight(one)?,
            // Biases are short vectors: stacked on the host.
            [first, ..] if first.rank() == 1 => b.upload_weight(&Tensor::cat(&parts, 0)?)?,
            _ => b.upload_weight_rows(&parts.iter().collect::<Vec<_>>())?,
        };
        upload_time.set(upload_time.get() + t0.elapsed());
        Ok((buf, rows))
    };
    let (w, out_features) = stack("weight")?;
    let bias = if bias { Some(stack("bias")?.0) } else { None };
    Ok(Linear { w, bias, out_features })
}

/// Layer `layer`'s routed experts: the router, and every expert's projections stacked into one matrix each.
fn load_experts<B: Backend>(
    b: &B,
    upload_time: &std::cell::Cell<std::time::Duration>,
    take: &dyn Fn(&str) -> Result<Tensor>,
    p: &ModelParams,
    layer: usize,
    shard: &Shard,
) -> Result<Mlp<B>> {
    let names = crate::weights::names::moe_names(p, layer);
    let with_bias = p.moe.as_ref().is_some_and(|m| m.bias);
    let router = linear(b, upload_time, take, std::slice::from_ref(&names.router), with_bias)?;
    let weight = |n: &String| take(&format!("{n}.weight"));
    let held = shard.experts(p);
    let mut gate_up = Vec::with_capacity(2 * held.len());
    let mut down = Vec::with_capacity(held.len());
    for [gate, up, d] in &names.experts[held.clone()] {
        gate_up.push(weight(gate)?);
        gate_up.push(weight(up)?);
        down.push(weight(d)?);
    }
    // Biases as f32 rows, one per held expert (the down bias only where this rank adds it: `Shard::cut`).
    let bias_rows = |parts: &[&str]| -> Result<Vec<f32>> {
        let mut out = Vec::new();
        for [gate, up, d] in &names.experts[held.clone()] {
            for part in parts {
                let name = match *part {
                    "gate" => gate,
                    "up" => up,
                    _ => d,
                };
                out.extend(take(&format!("{name}.bias"))?.to_dtype(candle_core::DType::F32)?.to_vec1::<f32>()?);
            }
        }
        Ok(out)
    };
    let bias = match with_bias {
        false => None,
        true => {
            let down_here = shard.cut(p, &format!("{}.bias", names.experts[held.start][2])).is_some();
            let down_bias = if down_here { Some(b.upload_f32(&bias_rows(&["down"])?)?) } else { None };
            Some((b.upload_f32(&bias_rows(&["gate", "up"])?)?, down_bias))
        }
    };
    let t0 = std::time::Instant::now();
    let gate_up = b.upload_weight_rows(&gate_up.iter().collect::<Vec<_>>())?;
    let down = b.upload_weight_rows(&down.iter().collect::<Vec<_>>())?;
    upload_time.set(upload_time.get() + t0.elapsed());
    Ok(Mlp::Experts { router, gate_up, down, width: shard.expert_intermediate(p).len(), held, bias })
}

impl<B: Backend> LlamaModel<B> {
    /// Uploads the whole model (Hugging Face names) to the backend.
    pub fn load(backend: &B, p: &ModelParams, w: &Weights) -> Result<Self> {
        Self::load_shard(backend, p, w, &Shard::whole(p))
    }

    /// Uploads this process's shard: its heads / MLP columns / vocabulary slice of its stage's layers.
    pub fn load_shard(backend: &B, p: &ModelParams, w: &Weights, shard: &Shard) -> Result<Self> {
        if !p.head_dim.is_multiple_of(2) {
            return Err(EngineError::Model(ModelError::Config(format!(
                "head_dim {} must be even for rotary embeddings",
                p.head_dim
            ))));
        }
        crate::model::shard::check_tp(p, shard.tp_size)?;
        let bias = p.attention_bias || p.architecture == Architecture::Qwen2;
        let o_bias = p.o_proj_bias && shard.cut(p, "model.layers.0.self_attn.o_proj.bias").is_some();
        // This shard's slice of a checkpoint tensor (`Shard::cut`), unless loading already cut it.
        let take = |name: &str| -> Result<Tensor> {
            let t = w.get(name)?;
            if w.is_cut() {
                return Ok(t.clone());
            }
            match shard.cut(p, name) {
                Some(cut) => Ok(apply_cut(t, &cut)?),
                None => Err(EngineError::Model(ModelError::Weights(format!("`{name}` is not part of this shard")))),
            }
        };
        // Time spent handing tensors to the device, apart from reading and stacking them (start-up phases).
        let upload_time = std::cell::Cell::new(std::time::Duration::ZERO);
        let upload = |t: &Tensor| -> Result<B::Buffer> {
            let t0 = std::time::Instant::now();
            let r = backend.upload_weight(t);
            upload_time.set(upload_time.get() + t0.elapsed());
            Ok(r?)
        };
        // Gemma stores its RMSNorm weights as w - 1 (its norm multiplies by 1 + w): the 1 is added here, in f32 as
        // transformers computes it.
        let gemma = p.architecture.is_gemma();
        let norm = |name: &str| -> Result<B::Buffer> {
            let t = take(name)?;
            if gemma {
                upload(&t.to_dtype(candle_core::DType::F32)?.affine(1.0, 1.0)?)
            } else {
                upload(&t)
            }
        };
        let local_rope = p.local_rope.is_some();
        let t0 = std::time::Instant::now();
        let layers = shard
            .layers
            .clone()
            .map(|i| {
                let pre = format!("model.layers.{i}");
                let attn = |n: &[&str]| n.iter().map(|n| format!("{pre}.self_attn.{n}")).collect::<Vec<_>>();
                let mlpn = |n: &[&str]| n.iter().map(|n| format!("{pre}.mlp.{n}")).collect::<Vec<_>>();
                let layer_norm = |n: &str| norm(&format!("{pre}.{n}.weight"));
                let (post_norm, attn_out_norm, mlp_out_norm) = if gemma {
                    (
                        layer_norm("pre_feedforward_layernorm")?,
                        Some(layer_norm("post_attention_layernorm")?),
                        Some(layer_norm("post_feedforward_layernorm")?),
                    )
                } else {
                    (layer_norm("post_attention_layernorm")?, None, None)
                };
                let qk_norm = if p.qk_norm {
                    Some((layer_norm("self_attn.q_norm")?, layer_norm("self_attn.k_norm")?))
                } else {
                    None
                };
                let kind = p.layers[i];
                Ok(Layer {
                    input_norm: layer_norm("input_layernorm")?,
                    post_norm,
                    attn_out_norm,
                    mlp_out_norm,
                    qk_norm,
                    window: kind.window,
                    rope: usize::from(kind.local_rope && local_rope),
                    sinks: match p.attention_sinks {
                        true => {
                            let t = take(&format!("{pre}.self_attn.sinks"))?.to_dtype(candle_core::DType::F32)?;
                            Some(backend.upload_f32(&t.to_vec1::<f32>()?)?)
                        }
                        false => None,
                    },
                    qkv: linear(backend, &upload_time, &take, &attn(&["q_proj", "k_proj", "v_proj"]), bias)?,
                    // The output bias is added once, by the rank that holds it (`Shard::cut`).
                    o: linear(backend, &upload_time, &take, &attn(&["o_proj"]), o_bias)?,
                    mlp: if p.is_moe_layer(i) {
                        load_experts(backend, &upload_time, &take, p, i, shard)?
                    } else {
                        Mlp::Dense {
                            gate_up: linear(backend, &upload_time, &take, &mlpn(&["gate_proj", "up_proj"]), false)?,
                            down: linear(backend, &upload_time, &take, &mlpn(&["down_proj"]), false)?,
                        }
                    },
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let embed_needed = shard.first || (shard.last && p.tie_word_embeddings);
        let embed_t = if embed_needed { Some(take("model.embed_tokens.weight")?) } else { None };
        let (norm, lm_head) = if shard.last {
            let head = match (&embed_t, p.tie_word_embeddings) {
                (Some(e), true) => rows(e, shard.vocab(p))?,
                _ => take("lm_head.weight")?,
            };
            (Some(norm("model.norm.weight")?), Some(upload(&head)?))
        } else {
            (None, None)
        };
        let embed = match (&embed_t, shard.first) {
            (Some(e), true) => Some(upload(e)?),
            _ => None,
        };
        tracing::debug!(
            "model weights: {:.2} s copying to the device, {:.2} s reading and stacking tensors",
            upload_time.get().as_secs_f64(),
            (t0.elapsed() - upload_time.get()).as_secs_f64()
        );
        let tables: Vec<RopeTable> = std::iter::once(p.rope())
            .chain(p.local_rope.clone())
            .map(|r| rope::table(p.head_dim, &r, p.max_position_embeddings))
            .collect();
        let long_rope_after = tables[0].long_after;
        let ropes = tables
            .into_iter()
            .map(|t| Ok(RopeBuf { inv_freq: backend.upload_f32(&t.inv_freq)?, mscale: t.mscale }))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { params: p.clone(), shard: shard.clone(), embed, layers, norm, lm_head, ropes, long_rope_after })
    }

    pub fn params(&self) -> &ModelParams {
        &self.params
    }

    /// Checks and flattens a step's batch for this model and `cache` (`FlatBatch::new` against its first
    /// `num_blocks` blocks, the sequences' whole tables from `tables`, then LongRoPE's choice of factors per
    /// sequence).
    pub fn flatten(
        &self,
        batch: &[ScheduledSeq],
        tables: &rserve_scheduler::BlockTables,
        cache: &PagedKvCache<B>,
        num_blocks: usize,
        max_blocks: usize,
    ) -> Result<FlatBatch> {
        let mut flat = FlatBatch::new(batch, tables, cache.block_size, num_blocks, cache.num_groups, max_blocks)?;
        self.mark(&mut flat);
        Ok(flat)
    }

    /// What this model marks on a flattened batch's positions (LongRoPE's long factors); a batch refilled in place
    /// (`FlatBatch::refill_decode`) is marked again.
    pub fn mark(&self, flat: &mut FlatBatch) {
        if let Some(after) = self.long_rope_after {
            flat.mark_long_rope(after);
        }
    }

    fn project(&self, b: &B, l: &Linear<B>, x: &B::Buffer, m: usize, k: usize) -> Result<B::Buffer> {
        let out = b.alloc_f32_scratch(m * l.out_features)?;
        b.run(Op::MatMul { x, w: &l.w, bias: l.bias.as_ref(), out: &out, m, k, n: l.out_features })?;
        Ok(out)
    }

    /// One routed-experts MLP over `n` normed rows: route, group the pairs by expert, the grouped gate/up multiply,
    /// the activation over the tiles' rows, the grouped down multiply and the weighted combine into `[n, hidden]`;
    /// or, for pairs few enough to be mostly of distinct experts (decode), route and the two ungrouped ops
    /// (this shard's partial sum under TP: its slice of every expert, or under expert parallelism its `held` experts
    /// `first .. first + held` whole, the pairs routed elsewhere adding nothing here). Every size here depends on `n`
    /// alone, so a CUDA graph captures it.
    fn experts(
        &self,
        b: &B,
        &ExpertWeights { router, gate_up, down, bias }: &ExpertWeights<'_, B>,
        normed: &B::Buffer,
        n: usize,
        [width, first, held]: [usize; 3],
    ) -> Result<B::Buffer> {
        let p = &self.params;
        let Some(m) = &p.moe else { return Err(EngineError::Backend("experts on a model without them".into())) };
        let (h, experts, top_k) = (p.hidden_size, m.num_experts, m.top_k);
        let logits = self.project(b, router, normed, n, h)?;
        let pairs = n * top_k;
        let (ids, weights) = (b.alloc_u32_output(pairs)?, b.alloc_f32_scratch(pairs)?);
        let renormalize = m.renormalize;
        b.run(Op::MoeRoute { logits: &logits, ids: &ids, weights: &weights, rows: n, experts, top_k, renormalize })?;
        if moe_pairs_ungrouped(pairs, top_k, experts) {
            let held = HeldExperts { first, count: held };
            let act = b.alloc_f32_scratch(pairs * width)?;
            let (gate_up_bias, down_bias) = bias.map_or((None, None), |(g, d)| (Some(g), d.as_ref()));
            b.run(Op::MoePairGateUp {
                x: normed,
                w: gate_up,
                bias: gate_up_bias,
                ids: &ids,
                out: &act,
                tokens: n,
                top_k,
                k: h,
                width,
                held,
                act: p.activation,
            })?;
            let out = b.alloc_f32_scratch(n * h)?;
            b.run(Op::MoePairDown {
                x: &act,
                w: down,
                bias: down_bias,
                ids: &ids,
                weights: &weights,
                out: &out,
                tokens: n,
                top_k,
                k: width,
                n: h,
                held,
            })?;
            return Ok(out);
        }
        let max_tiles = moe_max_tiles(pairs, held);
        let rows = max_tiles * rserve_kernels::launch::MOE_TILE_M;
        let (sorted, tile_expert, slot) =
            (b.alloc_u32_output(rows)?, b.alloc_u32_output(max_tiles)?, b.alloc_u32_output(pairs)?);
        let tiles = MoeTiles { sorted: &sorted, tile_expert: &tile_expert, slot: &slot, max_tiles };
        b.run(Op::MoeAlign { ids: &ids, tiles: &tiles, pairs, experts: held, first_expert: first })?;
        let gu = b.alloc_f32_scratch(rows * 2 * width)?;
        let input = MoeInput::Tokens { top_k, tokens: n };
        b.run(Op::MoeMatMul { x: normed, w: gate_up, tiles: &tiles, input, out: &gu, k: h, n: 2 * width })?;
        if let Some((gate_up_bias, _)) = bias {
            b.run(Op::MoeBias { x: &gu, bias: gate_up_bias, tiles: &tiles, width: 2 * width })?;
        }
        let act = b.alloc_f32_scratch(rows * width)?;
        b.run(Op::GatedAct { gate_up: &gu, out: &act, rows, width, act: p.activation })?;
        let y = b.alloc_f32_scratch(rows * h)?;
        b.run(Op::MoeMatMul { x: &act, w: down, tiles: &tiles, input: MoeInput::Slots, out: &y, k: width, n: h })?;
        if let Some((_, Some(down_bias))) = bias {
            b.run(Op::MoeBias { x: &y, bias: down_bias, tiles: &tiles, width: h })?;
        }
        let out = b.alloc_f32_scratch(n * h)?;
        b.run(Op::MoeCombine { y: &y, tiles: &tiles, weights: &weights, out: &out, rows: n, top_k, width: h })?;
        Ok(out)
    }

    /// Runs this shard's part of one step. `input` is the previous stage's hidden states (None on the first stage);
    /// TP partial sums are combined through `comm`. The last stage returns the logits of each sequence's last row,
    /// then of `prompt_rows` (rows of the batch, for prompt log-probs).
    pub fn forward_stage(
        &self,
        b: &B,
        batch: &[ScheduledSeq],
        prompt_rows: &[u32],
        cache: &PagedKvCache<B>,
        comm: &dyn TpCollective,
        input: Option<&[f32]>,
    ) -> Result<StageOutput> {
        let p = &self.params;
        let num_seqs = batch.len();
        if num_seqs == 0 {
            return Ok(StageOutput::Logits(Vec::new()));
        }
        // The MPI wire carries whole tables (each sequence a first schedule).
        let mut flat = self.flatten(batch, &rserve_scheduler::BlockTables::default(), cache, cache.num_blocks, 0)?;
        flat.with_prompt_rows(prompt_rows)?;
        let out_rows = flat.last_rows.len();
        let dev = DeviceBatch::upload(b, &flat)?;
        let logits = match self.forward_device(b, &flat, &dev, cache, comm, input)? {
            DeviceOutput::Hidden { residual, delta } => {
                // Not the last stage: hand the full hidden state (residual + last delta) on.
                let mut hidden = b.download_f32(&residual)?;
                if let Some(d) = &delta {
                    hidden.iter_mut().zip(b.download_f32(d)?).for_each(|(a, d)| *a += d);
                }
                return Ok(StageOutput::Hidden(hidden));
            }
            DeviceOutput::Logits(l) => l,
        };
        let local = b.download_f32(&logits)?;
        if comm.tp_size() == 1 {
            return Ok(StageOutput::Logits(local));
        }
        // Each rank holds a vocabulary slice of every row: gather and interleave into full rows.
        let all = comm.all_gather(&local)?;
        let mut full = vec![0f32; out_rows * p.vocab_size];
        let mut at = 0;
        for r in 0..comm.tp_size() {
            let part = Shard { tp_rank: r, ..self.shard.clone() }.vocab(p);
            for s in 0..out_rows {
                full[s * p.vocab_size + part.start..s * p.vocab_size + part.end]
                    .copy_from_slice(&all[at..at + part.len()]);
                at += part.len();
            }
        }
        Ok(StageOutput::Logits(full))
    }

    /// The device part of one step over an already uploaded batch: every op of this shard's layers, and on the last
    /// stage the final norm and LM head. Nothing here copies between host and device except the TP collectives
    /// (`comm`) and a pipeline stage's input, so with one process and the first stage the whole call can be
    /// captured into a CUDA graph. `flat` was checked against `cache` when it was built (`FlatBatch::new`).
    pub fn forward_device(
        &self,
        b: &B,
        flat: &FlatBatch,
        dev: &DeviceBatch<B>,
        cache: &PagedKvCache<B>,
        comm: &dyn TpCollective,
        input: Option<&[f32]>,
    ) -> Result<DeviceOutput<B>> {
        let (residual, delta) = self.layers(b, flat, dev, cache, comm, input)?;
        let (Some(_), Some(head)) = (&self.norm, &self.lm_head) else {
            return Ok(DeviceOutput::Hidden { residual, delta });
        };
        let p = &self.params;
        let (out_rows, h) = (flat.last_rows.len(), p.hidden_size);
        let last = b.alloc_matmul_input(out_rows * h, head)?;
        self.final_norm(b, flat, dev, &residual, delta.as_ref(), &last)?;
        let vocab = self.shard.vocab(p).len();
        let logits = b.alloc_f32_scratch(out_rows * vocab)?;
        b.run(Op::MatMul { x: &last, w: head, bias: None, out: &logits, m: out_rows, k: h, n: vocab })?;
        if let Some(cap) = p.final_softcap {
            b.run(Op::SoftCap { x: &logits, rows: out_rows, width: vocab, cap: cap as f32 })?;
        }
        Ok(DeviceOutput::Logits(logits))
    }

    /// The final hidden states (after the model's last norm) of the batch's `FlatBatch::last_rows`, `[rows, hidden]`
    /// f32: what a pooling model pools. The LM head is not run. One process, the whole model.
    pub fn forward_hidden(
        &self,
        b: &B,
        flat: &FlatBatch,
        dev: &DeviceBatch<B>,
        cache: &PagedKvCache<B>,
    ) -> Result<B::Buffer> {
        let (residual, delta) = self.layers(b, flat, dev, cache, &super::shard::NoComm, None)?;
        if self.norm.is_none() {
            return Err(EngineError::Backend("a pooling step needs the whole model on one process".into()));
        }
        let out = b.alloc_f32_scratch(flat.last_rows.len() * self.params.hidden_size)?;
        self.final_norm(b, flat, dev, &residual, delta.as_ref(), &out)?;
        Ok(out)
    }

    /// `out = norm(residual + delta)` over the rows in `flat.last_rows`, with the model's final norm. With one row per
    /// sequence and no others (a decode step) they are all the rows, in order: no gather.
    fn final_norm(
        &self,
        b: &B,
        flat: &FlatBatch,
        dev: &DeviceBatch<B>,
        residual: &B::Buffer,
        delta: Option<&B::Buffer>,
        out: &B::Buffer,
    ) -> Result<()> {
        let p = &self.params;
        let norm = self.norm.as_ref().ok_or_else(|| EngineError::Backend("the model has no final norm".into()))?;
        let (n, h) = (flat.num_tokens(), p.hidden_size);
        let eps = p.rms_norm_eps as f32;
        let zeros;
        let x = match delta {
            Some(d) => d,
            None => {
                zeros = b.alloc_f32(n * h)?;
                &zeros
            }
        };
        let out_rows = flat.last_rows.len();
        if flat.num_seqs() == n && out_rows == n {
            b.run(Op::AddRmsNorm { x, residual, weight: norm, out, rows: n, hidden: h, eps })?;
        } else {
            let rows_buf = &dev.last_rows;
            let last_delta = b.alloc_f32_scratch(out_rows * h)?;
            let last_res = b.alloc_f32_scratch(out_rows * h)?;
            b.run(Op::GatherRows { x, rows: rows_buf, out: &last_delta, num_rows: out_rows, width: h })?;
            b.run(Op::GatherRows { x: residual, rows: rows_buf, out: &last_res, num_rows: out_rows, width: h })?;
            b.run(Op::AddRmsNorm {
                x: &last_delta,
                residual: &last_res,
                weight: norm,
                out,
                rows: out_rows,
                hidden: h,
                eps,
            })?;
        }
        Ok(())
    }

    /// Every layer of this shard over the batch: the residual stream and the last layer's output not yet added to
    /// it (None when the shard has no layers).
    fn layers(
        &self,
        b: &B,
        flat: &FlatBatch,
        dev: &DeviceBatch<B>,
        cache: &PagedKvCache<B>,
        comm: &dyn TpCollective,
        input: Option<&[f32]>,
    ) -> Result<(B::Buffer, Option<B::Buffer>)> {
        let p = &self.params;
        let n = flat.num_tokens();
        let (h, hd) = (p.hidden_size, p.head_dim);
        let eps = p.rms_norm_eps as f32;
        // One attention metadata per KV cache group (each group has its own block tables).
        let metas = dev.metas(flat, cache.block_size)?;
        let (ids_buf, pos_buf) = (&dev.ids, &dev.positions);
        let (hq, hkv) = (self.shard.heads(p), self.shard.kv_heads(p));
        let inter = self.shard.intermediate(p).len();
        let residual = match (&self.embed, input) {
            (Some(table), None) => {
                let r = b.alloc_f32_scratch(n * h)?;
                let scale = p.embed_scale();
                b.run(Op::Embedding { table, ids: ids_buf, out: &r, num_tokens: n, hidden: h, scale })?;
                r
            }
            (None, Some(x)) if x.len() == n * h => b.upload_f32(x)?,
            _ => return Err(EngineError::Backend("pipeline stage input does not match the batch".into())),
        };
        // Combine TP partial sums (row-parallel outputs) across ranks.
        let reduce = |x: B::Buffer| -> Result<B::Buffer> {
            if comm.tp_size() == 1 {
                return Ok(x);
            }
            let mut v = b.download_f32(&x)?;
            comm.all_reduce_sum(&mut v)?;
            Ok(b.upload_f32(&v)?)
        };
        let zeros = b.alloc_f32(n * h)?;
        let mut delta: Option<B::Buffer> = None;
        let scale = p.attn_scale as f32;
        let softcap = p.attn_softcap.map(|c| c as f32);
        for (li, l) in self.layers.iter().enumerate() {
            // residual += previous layer's output; normed = norm(residual)
            let x = delta.as_ref().unwrap_or(&zeros);
            // Each norm / SiLU output is read only by the next projection: the backend may keep it in the
            // projection's input type (`alloc_matmul_input`).
            let normed = b.alloc_matmul_input(n * h, &l.qkv.w)?;
            b.run(Op::AddRmsNorm {
                x,
                residual: &residual,
                weight: &l.input_norm,
                out: &normed,
                rows: n,
                hidden: h,
                eps,
            })?;
            let qkv = self.project(b, &l.qkv, &normed, n, h)?;
            let q = b.alloc_f32_scratch(n * hq * hd)?;
            let (group, kc, vc) = cache.layer(li)?;
            let rope = &self.ropes[l.rope];
            b.run(Op::RopeWriteKv {
                io: RopeIo {
                    qkv: &qkv,
                    positions: pos_buf,
                    inv_freq: &rope.inv_freq,
                    q_out: &q,
                    k_cache: kc,
                    v_cache: vc,
                    slot_mapping: &dev.slots[group],
                },
                qk_norm: l.qk_norm.as_ref().map(|(q_weight, k_weight)| QkNorm { q_weight, k_weight, eps }),
                num_tokens: n,
                num_heads: hq,
                num_kv_heads: hkv,
                head_dim: hd,
                block_size: cache.block_size,
                mscale: rope.mscale,
            })?;
            // Read only by the output projection, like the norm outputs below.
            let attn = b.alloc_matmul_input(n * hq * hd, &l.o.w)?;
            b.run(Op::PagedAttention {
                q: &q,
                k_cache: kc,
                v_cache: vc,
                out: &attn,
                meta: &metas[group],
                shape: AttnShape {
                    num_heads: hq,
                    num_kv_heads: hkv,
                    head_dim: hd,
                    block_size: cache.block_size,
                    scale,
                    window: l.window,
                    softcap,
                },
                sinks: l.sinks.as_ref(),
            })?;
            let mut o = reduce(self.project(b, &l.o, &attn, n, hq * hd)?)?;
            if let Some(w) = &l.attn_out_norm {
                let normed_o = b.alloc_f32_scratch(n * h)?;
                b.run(Op::RmsNorm { x: &o, weight: w, out: &normed_o, rows: n, hidden: h, eps })?;
                o = normed_o;
            }
            // The routed experts read f32 activations (the router's multiply takes them too).
            let normed = match &l.mlp {
                Mlp::Dense { gate_up, .. } => b.alloc_matmul_input(n * h, &gate_up.w)?,
                Mlp::Experts { .. } => b.alloc_f32_scratch(n * h)?,
            };
            b.run(Op::AddRmsNorm {
                x: &o,
                residual: &residual,
                weight: &l.post_norm,
                out: &normed,
                rows: n,
                hidden: h,
                eps,
            })?;
            let down = match &l.mlp {
                Mlp::Dense { gate_up, down } => {
                    let gate_up = self.project(b, gate_up, &normed, n, h)?;
                    let act = b.alloc_matmul_input(n * inter, &down.w)?;
                    b.run(Op::GatedAct { gate_up: &gate_up, out: &act, rows: n, width: inter, act: p.activation })?;
                    self.project(b, down, &act, n, inter)?
                }
                Mlp::Experts { router, gate_up, down, width, held, bias } => {
                    let weights = ExpertWeights { router, gate_up, down, bias: bias.as_ref() };
                    self.experts(b, &weights, &normed, n, [*width, held.start, held.len()])?
                }
            };
            let down = reduce(down)?;
            delta = Some(match &l.mlp_out_norm {
                Some(w) => {
                    let normed_down = b.alloc_f32_scratch(n * h)?;
                    b.run(Op::RmsNorm { x: &down, weight: w, out: &normed_down, rows: n, hidden: h, eps })?;
                    normed_down
                }
                None => down,
            });
        }
        Ok((residual, delta))
    }
}
