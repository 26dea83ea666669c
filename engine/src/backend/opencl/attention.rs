//! Paged attention on OpenCL: the host splits a flattened batch into decode work (one query row per work-group,
//! `attention_decode.cl`, split-KV for contexts longer than one partition) and prefill work (tiles of (token, head)
//! pairs, `attention_prefill.cl`), after the same checks as the CPU backend. The split depends only on the batch
//! shape, so it is built once per step and reused by every layer.

use rserve_kernels::launch::*;

use super::buffer::{ClBuffer, Contents};
use super::kernels::work_group;
use super::OpenClBackend;
use crate::backend::cpu::be;
use crate::backend::{AttentionMeta, Backend};
use crate::error::Result;

pub(super) struct Shape {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    pub scale: f32,
}

/// Rows for the per-row kernel: (row, sequence, visible keys) triples, plus split-KV scratch when needed.
struct Decode {
    entries: ClBuffer,
    count: usize,
    max_parts: usize,
    /// `[count, heads, max_parts, head_dim]` partial outputs and `[count, heads, max_parts, 2]` (max, sum).
    scratch: Option<(ClBuffer, ClBuffer)>,
}

/// Tiles for the prefill kernel: (sequence, first pair) per tile.
struct Prefill {
    tiles: ClBuffer,
    count: usize,
}

/// The work split of one batch shape.
pub(super) struct Plan {
    key: (Vec<u32>, usize, usize, usize, usize),
    decode: Option<Decode>,
    prefill: Option<Prefill>,
}

fn check_meta(meta: &AttentionMeta<'_, ClBuffer>, s: &Shape, cache_len: usize) -> Result<usize> {
    let num_seqs = meta.host_context_lens.len();
    let (qs, ctx, tables, max_blocks) =
        (meta.host_query_start, meta.host_context_lens, meta.host_block_tables, meta.max_blocks_per_seq);
    if meta.num_seqs != num_seqs || qs.len() != num_seqs + 1 || tables.len() < num_seqs * max_blocks {
        return Err(be("paged_attention: metadata lengths disagree"));
    }
    if s.num_kv_heads == 0 || !s.num_heads.is_multiple_of(s.num_kv_heads) {
        return Err(be("paged_attention: heads must be a multiple of kv heads"));
    }
    if s.block_size == 0 || s.head_dim == 0 {
        return Err(be("paged_attention: block size and head dim must be positive"));
    }
    if s.head_dim % 4 != 0 {
        return Err(be(format!("paged_attention: head dim {} is not a multiple of 4 (the kernels load 4 values at a time)", s.head_dim)));
    }
    // The kernels read the device copies: they must hold what the host copies say.
    let same = |b: &ClBuffer, host: &[u32], what: &str| -> Result<()> {
        if &b.u32(what, host.len())?[..host.len()] != host {
            return Err(be(format!("paged_attention: device {what} differ from the host copy")));
        }
        Ok(())
    };
    same(meta.query_start, qs, "query starts")?;
    same(meta.context_lens, ctx, "context lengths")?;
    same(meta.block_tables, &tables[..num_seqs * max_blocks], "block tables")?;
    let block_elems = s.block_size * s.num_kv_heads * s.head_dim;
    for seq in 0..num_seqs {
        let qlen = qs[seq + 1].checked_sub(qs[seq]).ok_or_else(|| be("paged_attention: query_start not increasing"))?;
        let c = ctx[seq] as usize;
        if qlen as usize > c || c.div_ceil(s.block_size) > max_blocks {
            return Err(be("paged_attention: context does not fit its block table"));
        }
        for b in &tables[seq * max_blocks..seq * max_blocks + c.div_ceil(s.block_size)] {
            if (*b as usize + 1) * block_elems > cache_len {
                return Err(be(format!("paged_attention: block {b} outside the cache")));
            }
        }
    }
    Ok(qs[num_seqs] as usize)
}

fn build_plan(b: &OpenClBackend, meta: &AttentionMeta<'_, ClBuffer>, s: &Shape) -> Result<Plan> {
    let (qs, ctx) = (meta.host_query_start, meta.host_context_lens);
    let group = s.num_heads / s.num_kv_heads;
    let tiled_prefill = rserve_kernels::prefill_tiles_head(s.head_dim);
    let (mut entries, mut tiles, mut max_ctx) = (Vec::new(), Vec::new(), 0usize);
    for seq in 0..ctx.len() {
        let (q0, qlen, c) = (qs[seq], qs[seq + 1] - qs[seq], ctx[seq]);
        if qlen > 1 && tiled_prefill {
            for first in (0..qlen as usize * group).step_by(PREFILL_ROWS) {
                tiles.extend([seq as u32, first as u32]);
            }
        } else {
            for t in 0..qlen {
                entries.extend([q0 + t, seq as u32]);
            }
            if qlen > 0 {
                max_ctx = max_ctx.max(c as usize);
            }
        }
    }
    let decode = if entries.is_empty() {
        None
    } else {
        let count = entries.len() / 2;
        let max_parts = max_ctx.div_ceil(ATTN_MAX_PARTITION);
        let scratch = if max_parts > 1 {
            let outs = count * s.num_heads * max_parts;
            let part_out = b.create(outs * s.head_dim * 4, None, Contents::F32 { len: outs * s.head_dim })?;
            let part_ml = b.create(outs * 2 * 4, None, Contents::F32 { len: outs * 2 })?;
            Some((part_out, part_ml))
        } else {
            None
        };
        Some(Decode { entries: b.upload_u32(&entries)?, count, max_parts, scratch })
    };
    let prefill = if tiles.is_empty() { None } else { Some(Prefill { count: tiles.len() / 2, tiles: b.upload_u32(&tiles)? }) };
    Ok(Plan { key: plan_key(meta, s), decode, prefill })
}

/// What the work split depends on: which rows the batch has (query starts) and how many partitions its longest
/// decode row needs, never the context lengths themselves (the kernels read those on the device).
fn plan_key(meta: &AttentionMeta<'_, ClBuffer>, s: &Shape) -> (Vec<u32>, usize, usize, usize, usize) {
    let longest = meta.longest_decode_context(rserve_kernels::prefill_tiles_head(s.head_dim));
    let parts = longest.div_ceil(ATTN_MAX_PARTITION);
    (meta.host_query_start.to_vec(), parts, s.num_heads, s.num_kv_heads, s.head_dim)
}

pub(super) fn paged_attention(
    b: &OpenClBackend,
    q: &ClBuffer,
    k_cache: &ClBuffer,
    v_cache: &ClBuffer,
    out: &ClBuffer,
    meta: &AttentionMeta<'_, ClBuffer>,
    s: &Shape,
) -> Result<()> {
    let cache_len = k_cache.f32_len().zip(v_cache.f32_len()).map(|(a, b)| a.min(b));
    let cache_len = cache_len.ok_or_else(|| be("paged_attention: the caches must be f32 buffers"))?;
    let num_rows = check_meta(meta, s, cache_len)?;
    q.f32("paged_attention q", num_rows * s.num_heads * s.head_dim)?;
    out.f32("paged_attention out", num_rows * s.num_heads * s.head_dim)?;

    let mut cached = b.attention_plan.borrow_mut();
    let key = plan_key(meta, s);
    let stale = cached.as_ref().is_none_or(|p| p.key != key);
    if stale {
        *cached = None; // release the old scratch before allocating the new
        *cached = Some(build_plan(b, meta, s)?);
    }
    let plan = cached.as_ref().ok_or_else(|| be("paged_attention: no plan"))?;

    let group = s.num_heads / s.num_kv_heads;
    if let Some(d) = &plan.decode {
        let chunks = group.div_ceil(ATTN_HEAD_CHUNK);
        let (part_out, part_ml) = match &d.scratch {
            Some((o, m)) => (o, m),
            None => (out, out), // not touched with one partition
        };
        let wg = work_group("paged_attention_decode");
        b.kernels
            .launch("paged_attention_decode")?
            .buf(q)
            .buf(k_cache)
            .buf(v_cache)
            .buf(out)
            .buf(part_out)
            .buf(part_ml)
            .buf(part_ml) // split-KV counters: only the fused reduction (CUDA) uses them
            .buf(&d.entries)
            .buf(meta.query_start)
            .buf(meta.context_lens)
            .buf(meta.block_tables)
            .u32(meta.max_blocks_per_seq)
            .u32(s.num_heads)
            .u32(s.num_kv_heads)
            .u32(s.head_dim)
            .u32(s.block_size)
            .u32(ATTN_MAX_PARTITION)
            .u32(d.max_parts)
            .f32(s.scale)
            .u32(0) // f32 output
            .u32(0) // reduced by paged_attention_reduce
            .run(&b.queue, [d.count * wg, s.num_kv_heads * chunks, d.max_parts], [wg, 1, 1])?;
        if d.max_parts > 1 {
            let wg = work_group("paged_attention_reduce");
            b.kernels
                .launch("paged_attention_reduce")?
                .buf(out)
                .buf(part_out)
                .buf(part_ml)
                .buf(&d.entries)
                .buf(meta.query_start)
                .buf(meta.context_lens)
                .u32(s.num_heads)
                .u32(s.head_dim)
                .u32(ATTN_MAX_PARTITION)
                .u32(d.max_parts)
                .u32(0)
                .run(&b.queue, [d.count * wg, s.num_heads, 1], [wg, 1, 1])?;
        }
    }
    if let Some(p) = &plan.prefill {
        let wg = work_group("paged_attention_prefill");
        b.kernels
            .launch("paged_attention_prefill")?
            .buf(q)
            .buf(k_cache)
            .buf(v_cache)
            .buf(out)
            .buf(&p.tiles)
            .buf(meta.query_start)
            .buf(meta.context_lens)
            .buf(meta.block_tables)
            .u32(meta.max_blocks_per_seq)
            .u32(s.num_heads)
            .u32(s.num_kv_heads)
            .u32(s.head_dim)
            .u32(s.block_size)
            .f32(s.scale)
            .u32(0) // f32 output
            .run(&b.queue, [p.count * wg, s.num_kv_heads, 1], [wg, 1, 1])?;
    }
    Ok(())
}
