//! The closed list of operations a backend executes, with the shapes each one assumes.
//!
//! Layouts (row-major): activations `[tokens, features]`; q `[tokens, heads, head_dim]`; k/v `[tokens, kv_heads,
//! head_dim]`; the paged KV cache of one layer `[num_blocks, block_size, kv_heads, head_dim]` (vLLM's XPU layout),
//! addressed by slot = block * block_size + offset.

/// Where each sequence of a flattened batch lives, for attention.
///
/// Sequence `s` owns query rows `query_start[s]..query_start[s + 1]`; its tokens sit at positions
/// `context_lens[s] - query_len .. context_lens[s]`; cached keys of positions `< context_lens[s] - query_len` are read
/// from the paged cache through row `s` of `block_tables` (`max_blocks_per_seq` entries, unused ones 0).
pub struct AttentionMeta<'a, B> {
    pub num_seqs: usize,
    pub query_start: &'a B,
    pub context_lens: &'a B,
    pub block_tables: &'a B,
    pub max_blocks_per_seq: usize,
    /// Host copies of the same values, for launch sizes and the CPU backend.
    pub host_query_start: &'a [u32],
    pub host_context_lens: &'a [u32],
    pub host_block_tables: &'a [u32],
}

impl<B> AttentionMeta<'_, B> {
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

/// One backend operation. Matched exhaustively: a backend missing an op does not compile.
pub enum Op<'a, B> {
    /// `out[t] = table[ids[t]]`; table `[vocab, hidden]`.
    Embedding { table: &'a B, ids: &'a B, out: &'a B, num_tokens: usize, hidden: usize },
    /// `out = rmsnorm(x) * weight` per row.
    RmsNorm { x: &'a B, weight: &'a B, out: &'a B, rows: usize, hidden: usize, eps: f32 },
    /// `residual += x; out = rmsnorm(residual) * weight` per row (the residual add fused with the norm).
    AddRmsNorm { x: &'a B, residual: &'a B, weight: &'a B, out: &'a B, rows: usize, hidden: usize, eps: f32 },
    /// `out[m, n] = x[m, k] . w[n, k]^T (+ bias[n])`, f32 accumulation; `w` in its weight dtype.
    MatMul { x: &'a B, w: &'a B, bias: Option<&'a B>, out: &'a B, m: usize, k: usize, n: usize },
    /// Split a fused q/k/v projection `qkv[tokens, (num_heads + 2 * num_kv_heads) * head_dim]` (the q heads, then
    /// the k heads, then the v heads of each token): rotary embedding (rotate-half, Hugging Face layout;
    /// `inv_freq[head_dim / 2]` already holds any llama3 scaling) of q into `q_out[tokens, num_heads, head_dim]`, and
    /// of k; k and v are stored into the paged cache at `slot_mapping[t]`.
    RopeWriteKv {
        qkv: &'a B,
        positions: &'a B,
        inv_freq: &'a B,
        q_out: &'a B,
        k_cache: &'a B,
        v_cache: &'a B,
        slot_mapping: &'a B,
        num_tokens: usize,
        num_heads: usize,
        num_kv_heads: usize,
        head_dim: usize,
        block_size: usize,
    },
    /// `out[r, j] = silu(gate_up[r, j]) * gate_up[r, width + j]` over the fused gate/up projection
    /// `gate_up[rows, 2 * width]` (gate columns first).
    SiluMul { gate_up: &'a B, out: &'a B, rows: usize, width: usize },
    /// Causal attention of each query row over its sequence's cached keys/values (prefix and the current chunk,
    /// which `RopeWriteKv` has already stored). Grouped-query: head `h` reads kv head `h / (num_heads / num_kv_heads)`.
    PagedAttention {
        q: &'a B,
        k_cache: &'a B,
        v_cache: &'a B,
        out: &'a B,
        meta: &'a AttentionMeta<'a, B>,
        num_heads: usize,
        num_kv_heads: usize,
        head_dim: usize,
        block_size: usize,
        scale: f32,
    },
    /// `out[i] = x[rows[i]]`: pick the rows whose logits are needed.
    GatherRows { x: &'a B, rows: &'a B, out: &'a B, num_rows: usize, width: usize },
}

#[cfg(test)]
mod tests {
    use super::AttentionMeta;

    #[test]
    fn longest_decode_context_counts_only_rows_of_the_decode_kernel() {
        let (qs, ctx) = ([0u32, 37, 38, 40, 41], [37u32, 5, 12, 2000]);
        let meta = AttentionMeta::<()> {
            num_seqs: 4,
            query_start: &(),
            context_lens: &(),
            block_tables: &(),
            max_blocks_per_seq: 1,
            host_query_start: &qs,
            host_context_lens: &ctx,
            host_block_tables: &[],
        };
        // One-token rows (sequences 1 and 3) go to the decode kernel; prefill chunks to the tiled kernel.
        assert_eq!(meta.longest_decode_context(true), 2000);
        assert_eq!(meta.decode_rows(true), 2);
        assert_eq!(meta.decode_rows(false), 41);
        // Without the tiled kernel every row is a decode row.
        let short =
            AttentionMeta::<()> { host_query_start: &qs[..3], host_context_lens: &ctx[..2], num_seqs: 2, ..meta };
        assert_eq!(short.longest_decode_context(true), 5);
        assert_eq!(short.longest_decode_context(false), 37);
        let none =
            AttentionMeta::<()> { host_query_start: &qs[..2], host_context_lens: &ctx[..1], num_seqs: 1, ..meta };
        assert_eq!(none.longest_decode_context(true), 0);
    }
}
