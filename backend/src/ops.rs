//! The closed list of operations a backend executes, with the shapes each one assumes.
//!
//! Layouts (row-major): activations `[tokens, features]`; q `[tokens, heads, head_dim]`; k/v `[tokens, kv_heads,
//! head_dim]`; the paged KV cache of one layer `[num_blocks, block_size, kv_heads, head_dim]` (vLLM's XPU layout),
//! addressed by slot = block * block_size + offset.

use crate::cpu::be;
use crate::error::{BackendError, Result};

/// The shape of one `PagedAttention` op.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnShape {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    pub scale: f32,
    /// Sliding window in keys (a row at position p sees keys p - window + 1 ..= p), if the layer has one.
    pub window: Option<usize>,
    /// Score soft-capping (Gemma 2), if the layer has it.
    pub softcap: Option<f32>,
}

/// Where each sequence of a flattened batch lives, for attention.
///
/// Sequence `s` owns query rows `query_start[s]..query_start[s + 1]`; its tokens sit at positions
/// `context_lens[s] - query_len .. context_lens[s]`; cached keys of positions `< context_lens[s] - query_len` are read
/// from the paged cache through row `s` of `block_tables` (`max_blocks_per_seq` entries, unused ones 0).
///
/// Built once per step by [`AttentionMeta::new`], which checks that the host copies agree with each other; every
/// layer's `PagedAttention` then checks only what depends on the op (the cache it reads, in O(1)).
// The device copies are read by the kernel backends only; a CPU-only build has none.
#[cfg_attr(not(any(feature = "opencl", feature = "level-zero", feature = "cuda")), allow(dead_code))]
pub struct AttentionMeta<'a, B> {
    pub(crate) num_seqs: usize,
    pub(crate) query_start: &'a B,
    pub(crate) context_lens: &'a B,
    pub(crate) block_tables: &'a B,
    pub(crate) max_blocks_per_seq: usize,
    /// Host copies of the same values, for launch sizes and the CPU backend.
    pub(crate) host_query_start: &'a [u32],
    pub(crate) host_context_lens: &'a [u32],
    pub(crate) host_block_tables: &'a [u32],
    /// Tokens per cache block the tables were checked against.
    pub(crate) block_size: usize,
    /// One past the highest block id any sequence reads: the cache must hold that many blocks.
    pub(crate) blocks_read: usize,
}

impl<'a, B> AttentionMeta<'a, B> {
    /// `device` and `host` are `[query_start, context_lens, block_tables]`; the device buffers must hold the host
    /// copies (the kernel backends also bound the device copies' values before a launch). Checks that
    /// `query_start` has one entry more than `context_lens` and does not decrease, that each sequence's query fits
    /// its context and its context its table row, and that the tables hold `max_blocks_per_seq` entries a sequence.
    pub fn new(device: [&'a B; 3], host: [&'a [u32]; 3], max_blocks_per_seq: usize, block_size: usize) -> Result<Self> {
        let [qs, ctx, tables] = host;
        let num_seqs = ctx.len();
        let bad = |m: String| Err(BackendError::InvalidArgument(format!("attention metadata: {m}")));
        if qs.len() != num_seqs + 1 || tables.len() < num_seqs * max_blocks_per_seq {
            return bad(format!(
                "{} query starts, {} context lengths and {} table entries of {max_blocks_per_seq} a sequence",
                qs.len(),
                num_seqs,
                tables.len()
            ));
        }
        if block_size == 0 {
            return bad("block size 0".into());
        }
        let mut blocks_read = 0;
        for seq in 0..num_seqs {
            let Some(qlen) = qs[seq + 1].checked_sub(qs[seq]) else {
                return bad(format!("query_start decreases at sequence {seq}"));
            };
            let (c, blocks) = (ctx[seq] as usize, (ctx[seq] as usize).div_ceil(block_size));
            if qlen as usize > c || blocks > max_blocks_per_seq {
                return bad(format!("sequence {seq}: {qlen} query rows and context {c} do not fit its block table"));
            }
            let row = &tables[seq * max_blocks_per_seq..seq * max_blocks_per_seq + blocks];
            blocks_read = row.iter().fold(blocks_read, |m, &b| m.max(b as usize + 1));
        }
        let [query_start, context_lens, block_tables] = device;
        Ok(Self {
            num_seqs,
            query_start,
            context_lens,
            block_tables,
            max_blocks_per_seq,
            host_query_start: qs,
            host_context_lens: ctx,
            host_block_tables: tables,
            block_size,
            blocks_read,
        })
    }

    /// Number of query rows of the batch.
    pub fn num_rows(&self) -> usize {
        self.host_query_start[self.num_seqs] as usize
    }

    /// Checks the op's shape against this metadata and a cache of `cache_blocks` blocks.
    pub(crate) fn check_op(&self, block_size: usize, cache_blocks: usize) -> Result<()> {
        if block_size != self.block_size {
            return Err(be(format!(
                "paged_attention: block size {block_size}, the metadata was built for {}",
                self.block_size
            )));
        }
        if self.blocks_read > cache_blocks {
            return Err(be(format!(
                "paged_attention: block {} outside the cache of {cache_blocks} blocks",
                self.blocks_read - 1
            )));
        }
        Ok(())
    }

    /// The longest context among the rows the per-row decode kernel serves: one-token rows, and every row when
    /// heads are too large for the tiled prefill kernel (`tiled_prefill` false); 0 when there are none. A decode
    /// work split needs this (its partition count), never the other context lengths.
    pub fn longest_decode_context(&self, tiled_prefill: bool) -> usize {
        self.decode_seqs(tiled_prefill).map(|(i, _)| self.host_context_lens[i] as usize).max().unwrap_or(0)
    }

    /// How many query rows the per-row decode kernel serves (same rule as `longest_decode_context`).
    pub fn decode_rows(&self, tiled_prefill: bool) -> usize {
        self.decode_seqs(tiled_prefill).map(|(_, qlen)| qlen).sum()
    }

    /// (sequence, query rows) of each sequence whose rows go to the decode kernel.
    fn decode_seqs(&self, tiled_prefill: bool) -> impl Iterator<Item = (usize, usize)> + '_ {
        let (qs, ctx) = (self.host_query_start, self.host_context_lens);
        (0..ctx.len().min(qs.len().saturating_sub(1)))
            .map(move |i| (i, qs[i + 1].saturating_sub(qs[i]) as usize))
            .filter(move |&(_, qlen)| qlen == 1 || (qlen > 1 && !tiled_prefill))
    }
}

/// The buffers of `Op::RopeWriteKv`: the fused projection and each token's position and cache slot in; roped q and
/// the paged k/v cache out.
pub struct RopeIo<'a, B> {
    pub qkv: &'a B,
    pub positions: &'a B,
    pub inv_freq: &'a B,
    pub q_out: &'a B,
    pub k_cache: &'a B,
    pub v_cache: &'a B,
    pub slot_mapping: &'a B,
}

/// The per-head RMSNorm that `Op::RopeWriteKv` applies to each q head (weight `q_weight[head_dim]`) and k head
/// (`k_weight`) before rotating them (Qwen3's and Gemma 3's q_norm / k_norm).
pub struct QkNorm<'a, B> {
    pub q_weight: &'a B,
    pub k_weight: &'a B,
    pub eps: f32,
}

/// The activation of a gated MLP (`Op::GatedAct`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// SiLU (SwiGLU: Llama, Qwen, Mistral, Phi-3).
    Silu,
    /// PyTorch's `gelu(approximate="tanh")` (GeGLU: Gemma's `gelu_pytorch_tanh`).
    GeluTanh,
    /// gpt-oss's clamped SwiGLU: `g = min(gate, 7)`, `u = clamp(up, -7, 7)`, `out = g * sigmoid(1.702 g) * (u + 1)`.
    SwigluOai,
}

impl Activation {
    /// The kernels' `act` argument (`ACT_*` in `kernels/src/cl/prelude.h`).
    pub fn kernel_id(self) -> u32 {
        match self {
            Activation::Silu => 0,
            Activation::GeluTanh => 1,
            Activation::SwigluOai => 2,
        }
    }
}

/// How `Op::MoeMatMul` finds each row's input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoeInput {
    /// `x` holds the `tokens` tokens `[tokens, k]`: a pair reads its token's row (pair / `top_k`).
    Tokens { top_k: usize, tokens: usize },
    /// `x` holds one row per slot of the tiles `[max_tiles * MOE_TILE_M, k]` (the activated first multiply).
    Slots,
}

/// One routed-experts layer's grouping of its (token, expert) pairs into one-expert tiles of
/// `rserve_kernels::launch::MOE_TILE_M` rows (`kernels/src/cl/moe.cl` describes the layout), written by
/// `Op::MoeAlign` and read by `Op::MoeMatMul` and `Op::MoeCombine`: `sorted[max_tiles * MOE_TILE_M]` (the pair in
/// each row, or none), `tile_expert[max_tiles]`, `slot[pairs]` (the row of each pair); u32 buffers.
pub struct MoeTiles<'a, B> {
    pub sorted: &'a B,
    pub tile_expert: &'a B,
    pub slot: &'a B,
    pub max_tiles: usize,
}

/// Whether a routed-experts layer runs its `pairs` (token, expert) pairs over `experts` experts ungrouped
/// (`Op::MoePairGateUp`, `Op::MoePairDown`): when there are few enough that they are mostly of distinct experts
/// (at most a quarter of the experts, and always at one token), grouping them saves no weight reads and costs
/// three more ops.
pub fn moe_pairs_ungrouped(pairs: usize, top_k: usize, experts: usize) -> bool {
    pairs <= top_k.max(experts / 4)
}

/// The experts a rank holds of a routed-experts layer: `first .. first + count` (all of them, or one share under
/// expert parallelism).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldExperts {
    pub first: usize,
    pub count: usize,
}

/// The tiles `pairs` (token, expert) pairs over `experts` experts may need: one per `MOE_TILE_M` pairs, plus a
/// partial tile for each expert that has pairs.
pub fn moe_max_tiles(pairs: usize, experts: usize) -> usize {
    pairs.div_ceil(rserve_kernels::launch::MOE_TILE_M) + pairs.min(experts)
}

/// One backend operation. Matched exhaustively: a backend missing an op does not compile.
pub enum Op<'a, B> {
    /// `out[t] = table[ids[t]] * scale`; table `[vocab, hidden]` (`scale`: Gemma's sqrt(hidden), else 1).
    Embedding { table: &'a B, ids: &'a B, out: &'a B, num_tokens: usize, hidden: usize, scale: f32 },
    /// `out = rmsnorm(x) * weight` per row.
    RmsNorm { x: &'a B, weight: &'a B, out: &'a B, rows: usize, hidden: usize, eps: f32 },
    /// `residual += x; out = rmsnorm(residual) * weight` per row (the residual add fused with the norm).
    AddRmsNorm { x: &'a B, residual: &'a B, weight: &'a B, out: &'a B, rows: usize, hidden: usize, eps: f32 },
    /// `out[m, n] = x[m, k] . w[n, k]^T (+ bias[n])`, f32 accumulation; `w` in its weight dtype.
    MatMul { x: &'a B, w: &'a B, bias: Option<&'a B>, out: &'a B, m: usize, k: usize, n: usize },
    /// Split a fused q/k/v projection `qkv[tokens, (num_heads + 2 * num_kv_heads) * head_dim]` (the q heads, then
    /// the k heads, then the v heads of each token): rotary embedding (rotate-half, Hugging Face layout;
    /// `inv_freq[head_dim / 2]` already holds the checkpoint's frequency scaling) of q into
    /// `q_out[tokens, num_heads, head_dim]`, and of k, with cos and sin multiplied by `mscale` (YaRN's / LongRoPE's
    /// attention factor, else 1); k and v are stored into the paged cache at `slot_mapping[t]`. A position with bit
    /// 31 set reads a second table at `inv_freq[head_dim / 2..head_dim]` (LongRoPE's long factors). With
    /// `qk_norm`, each q and k head is RMS-normalised first (`qkv` itself is left unchanged).
    RopeWriteKv {
        io: RopeIo<'a, B>,
        qk_norm: Option<QkNorm<'a, B>>,
        num_tokens: usize,
        num_heads: usize,
        num_kv_heads: usize,
        head_dim: usize,
        block_size: usize,
        mscale: f32,
    },
    /// `out[r, j] = act(gate_up[r, j]) * gate_up[r, width + j]` over the fused gate/up projection
    /// `gate_up[rows, 2 * width]` (gate columns first).
    GatedAct { gate_up: &'a B, out: &'a B, rows: usize, width: usize, act: Activation },
    /// `x = cap * tanh(x / cap)` over `x[rows, width]`, in place (Gemma 2's final logit soft-capping).
    SoftCap { x: &'a B, rows: usize, width: usize, cap: f32 },
    /// Causal attention of each query row over its sequence's cached keys/values (prefix and the current chunk,
    /// which `RopeWriteKv` has already stored). Grouped-query: head `h` reads kv head `h / (num_heads / num_kv_heads)`.
    /// Scores are `q . k * scale`, capped as `softcap * tanh(score / softcap)` when `softcap` is set (Gemma 2); with a
    /// `window`, the row at position `p` sees only keys `p - window + 1 ..= p` (sliding-window layers).
    PagedAttention {
        q: &'a B,
        k_cache: &'a B,
        v_cache: &'a B,
        out: &'a B,
        meta: &'a AttentionMeta<'a, B>,
        shape: AttnShape,
        /// Per-head sink logits `[num_heads]` (gpt-oss), each joining its head's softmax denominator as a key with
        /// no value.
        sinks: Option<&'a B>,
    },
    /// `out = layernorm(x + residual) * weight + bias` per row, the residual added first when given (a post-norm
    /// encoder layer's `LayerNorm(x + sublayer(x))`); the variance is the biased one, as torch's. `out` is f32.
    LayerNorm {
        x: &'a B,
        residual: Option<&'a B>,
        weight: &'a B,
        bias: &'a B,
        out: &'a B,
        rows: usize,
        hidden: usize,
        eps: f32,
    },
    /// `out = gelu(x)` over `len` values, the exact form `x * (1 + erf(x / sqrt(2))) / 2` (BERT's `gelu`); f32.
    Gelu { x: &'a B, out: &'a B, len: usize },
    /// Bidirectional (encoder) attention within each sequence of a flattened batch, over the fused projection
    /// `qkv[tokens, 3 * num_heads * head_dim]` (each token's q heads, then its k heads, then its v heads): every row
    /// of a sequence sees every key of that sequence (`query_start[num_seqs + 1]`, u32 row offsets), and nothing
    /// else: no mask, no cache. Scores `q . k * scale`; `out[tokens, num_heads * head_dim]` f32.
    EncoderAttention {
        qkv: &'a B,
        query_start: &'a B,
        out: &'a B,
        num_seqs: usize,
        num_tokens: usize,
        num_heads: usize,
        head_dim: usize,
        scale: f32,
    },
    /// `out[i] = x[rows[i]]`: pick the rows whose logits are needed.
    GatherRows { x: &'a B, rows: &'a B, out: &'a B, num_rows: usize, width: usize },
    /// `ids[i] = prev[from[i]]` for each `i < count` whose `from[i]` is below `prev_len`; other entries are kept: a
    /// step's input ids take the ids the step before it sampled on the device (async scheduling), without a trip
    /// through the host. `from[i] = u32::MAX` keeps the id the host wrote.
    FeedTokens { ids: &'a B, prev: &'a B, from: &'a B, count: usize, prev_len: usize },
    /// Routing of a mixture-of-experts layer: from `logits[rows, experts]`, each row's `top_k` most probable experts
    /// (most probable first, the lowest index among equal ones) into `ids[rows * top_k]` (u32) with their softmax
    /// probabilities in `weights[rows * top_k]`, divided by the sum of the chosen ones when `renormalize`.
    MoeRoute { logits: &'a B, ids: &'a B, weights: &'a B, rows: usize, experts: usize, top_k: usize, renormalize: bool },
    /// Groups the `pairs` routed (token, expert) pairs of `ids` whose expert is one of `first_expert ..
    /// first_expert + experts` by expert into `tiles` (every field written; tile experts numbered from
    /// `first_expert`, pairs of other experts get no slot): expert parallelism runs one rank's experts.
    MoeAlign { ids: &'a B, tiles: &'a MoeTiles<'a, B>, pairs: usize, experts: usize, first_expert: usize },
    /// The grouped multiply: for each row of each used tile, `out[slot, :] = x[input row] . w_e^T` with `w` the
    /// experts' `[n, k]` matrices stacked by rows (`[experts * n, k]`) and `e` the tile's expert; `out` is
    /// `[max_tiles * MOE_TILE_M, n]`, and its padding rows are left as they were.
    MoeMatMul { x: &'a B, w: &'a B, tiles: &'a MoeTiles<'a, B>, input: MoeInput, out: &'a B, k: usize, n: usize },
    /// `x[s, :] += bias[e, :]` for every row `s` of each used tile, `e` the tile's expert: the experts' biases stacked
    /// `[experts, width]` (f32) added to a grouped multiply's output `[max_tiles * MOE_TILE_M, width]` (gpt-oss).
    MoeBias { x: &'a B, bias: &'a B, tiles: &'a MoeTiles<'a, B>, width: usize },
    /// `out[t, :] = sum over j of weights[t * top_k + j] * y[slot of pair t * top_k + j, :]` for `rows` tokens.
    MoeCombine {
        y: &'a B,
        tiles: &'a MoeTiles<'a, B>,
        weights: &'a B,
        out: &'a B,
        rows: usize,
        top_k: usize,
        width: usize,
    },
    /// The first half of a routed-experts MLP without grouping (a few tokens: decode): for each pair `p` of
    /// `ids[tokens * top_k]` whose expert `e = ids[p] - held.first` is held here,
    /// `out[p, j] = act(g + bias[e, j]) * (u + bias[e, width + j])` with `g = x[p / top_k] . w[e * 2 * width + j]`
    /// and `u = x[p / top_k] . w[e * 2 * width + width + j]`: `w` the held experts' fused gate/up matrices stacked
    /// `[held.count * 2 * width, k]` (gate rows first), `bias` `[held.count, 2 * width]` (f32). `out` is
    /// `[tokens * top_k, width]`; the rows of pairs routed to other experts are left as they were.
    MoePairGateUp {
        x: &'a B,
        w: &'a B,
        bias: Option<&'a B>,
        ids: &'a B,
        out: &'a B,
        tokens: usize,
        top_k: usize,
        k: usize,
        width: usize,
        held: HeldExperts,
        act: Activation,
    },
    /// The second half: `out[t, c] = sum over j of weights[p] * (x[p] . w[e * n + c] + bias[e, c])` over the pairs
    /// `p = t * top_k + j` of token `t` whose expert `e = ids[p] - held.first` is held here (the others add nothing):
    /// `x` the activated pairs `[tokens * top_k, k]` of `MoePairGateUp`, `w` the held experts' down matrices stacked
    /// `[held.count * n, k]`, `bias` `[held.count, n]`; `out` is `[tokens, n]`.
    MoePairDown {
        x: &'a B,
        w: &'a B,
        bias: Option<&'a B>,
        ids: &'a B,
        weights: &'a B,
        out: &'a B,
        tokens: usize,
        top_k: usize,
        k: usize,
        n: usize,
        held: HeldExperts,
    },
    /// `logits[r, t] = -inf` where bit `t % 32` of `mask[r * words + t / 32]` is clear (`words = ceil(vocab / 32)`):
    /// the grammar masks of a step's rows (structured outputs), applied before the logits are read or picked from.
    MaskLogits { logits: &'a B, mask: &'a B, rows: usize, vocab: usize },
    /// Penalties and logit bias as sparse edits (`sampling::adjust::Edit`): for each `e < count`, with
    /// `(row, token) = (edits[2e], edits[2e + 1])` and `(mul, add) = (values[2e], values[2e + 1])`,
    /// `x = logits[row, token]` becomes `(mul != 1 ? (x > 0 ? x / mul : x * mul) : x) + add`. No (row, token) appears
    /// twice; rows below `rows`, tokens below `vocab`.
    AdjustLogits { logits: &'a B, edits: &'a B, values: &'a B, count: usize, rows: usize, vocab: usize },
    /// `out[r]` = the index of the largest value of row `r` of `[rows, width]` `x`: the lowest index among equal
    /// maxima, NaN never wins, 0 for a row without a number above -inf (`sampling::draw::argmax`). A greedy step's
    /// token choice, part of a recorded decode step.
    ArgmaxRows { x: &'a B, out: &'a B, rows: usize, width: usize },
    /// `ids[r]` = the token row `r` of `logits` draws under its parameters (`SAMPLE_PARAM_WORDS` u32 words a row of
    /// `params`, `sampling::RowParams::pack`): `sampling::draw` is the algorithm and the CPU's implementation. `logits`
    /// is left as it was.
    SampleRows { logits: &'a B, params: &'a B, ids: &'a B, rows: usize, vocab: usize },
    /// Log-probs of the (raw) `logits` of each row `r` whose `want[r]` is not `sampling::NO_LOGPROBS` (at most
    /// `LOGPROBS_MAX_TOP`): with `lse` the row's log-sum-exp and `W = 1 + LOGPROBS_MAX_TOP`,
    /// `values[r * W] = logits[r, ids[r]] - lse`, then the row's `want[r]` highest tokens, highest first (ties: lower
    /// id), as `top_ids[r * LOGPROBS_MAX_TOP + j]` and `values[r * W + 1 + j] = logits[r, top_ids[..]] - lse`.
    /// Other entries are left as they were.
    RowLogprobs { logits: &'a B, ids: &'a B, want: &'a B, values: &'a B, top_ids: &'a B, rows: usize, vocab: usize },
}

#[cfg(test)]
mod tests {
    use super::AttentionMeta;

    #[test]
    fn longest_decode_context_counts_only_rows_of_the_decode_kernel() {
        let (qs, ctx) = ([0u32, 37, 38, 40, 41], [37u32, 5, 12, 2000]);
        let tables = [0u32; 4];
        let meta = AttentionMeta::<()>::new([&(); 3], [&qs, &ctx, &tables], 1, 2000).unwrap();
        // One-token rows (sequences 1 and 3) go to the decode kernel; prefill chunks to the tiled kernel.
        assert_eq!(meta.longest_decode_context(true), 2000);
        assert_eq!(meta.decode_rows(true), 2);
        assert_eq!(meta.decode_rows(false), 41);
        // Without the tiled kernel every row is a decode row.
        let short = AttentionMeta::<()>::new([&(); 3], [&qs[..3], &ctx[..2], &tables], 1, 2000).unwrap();
        assert_eq!(short.longest_decode_context(true), 5);
        assert_eq!(short.longest_decode_context(false), 37);
        let none = AttentionMeta::<()>::new([&(); 3], [&qs[..2], &ctx[..1], &tables], 1, 2000).unwrap();
        assert_eq!(none.longest_decode_context(true), 0);
    }

    #[test]
    fn metadata_is_checked_once_when_built() {
        let new = |qs: &[u32], ctx: &[u32], tables: &[u32], max_blocks| {
            AttentionMeta::<()>::new([&(); 3], [qs, ctx, tables], max_blocks, 16).map(|m| m.blocks_read)
        };
        // Blocks read: those covering each context, not the unused table entries.
        assert_eq!(new(&[0, 3, 4], &[3, 17], &[5, 9, 2, 7], 2).unwrap(), 8);
        let err = |r: crate::error::Result<usize>| r.unwrap_err().to_string();
        assert!(err(new(&[0, 3], &[3, 17], &[0; 4], 2)).contains("2 query starts, 2 context lengths"));
        assert!(err(new(&[0, 3, 2], &[3, 17], &[0; 4], 2)).contains("query_start decreases at sequence 1"));
        assert!(err(new(&[0, 4], &[3], &[0; 2], 2)).contains("sequence 0: 4 query rows and context 3"));
        assert!(err(new(&[0, 1], &[33], &[0; 2], 2)).contains("context 33 do not fit its block table"));
        let meta = AttentionMeta::<()>::new([&(); 3], [&[0, 1], &[20], &[3, 6]], 2, 16).unwrap();
        assert!(meta.check_op(16, 7).is_ok());
        assert!(meta.check_op(16, 6).unwrap_err().to_string().contains("block 6 outside the cache of 6 blocks"));
        assert!(meta.check_op(8, 7).unwrap_err().to_string().contains("block size 8"));
    }
}
