//! Paged attention on CUDA (the portable kernels, launched as the OpenCL backend launches them): the host splits a flattened batch into decode work (one query row per work-group,
//! `attention_decode.cl`, split-KV for contexts longer than one partition) and prefill work (tiles of (token, head)
//! pairs, `attention_prefill.cl`), after the same checks as the CPU backend. The split depends only on the batch
//! shape, so it is built once per step and reused by every layer.

use rserve_kernels::launch::*;

/// Keys per split-KV partition on NVIDIA GPUs for a decode launch of `rows` query rows (at most the kernel's
/// capacity `ATTN_MAX_PARTITION`): short partitions give a decode row many work-groups, so even batch 1 fills the GPU
/// (`paged_attention_reduce` combines them), while long ones keep the reduction small once many rows fill it anyway.
/// 16 keys at one row, 32 up to 16 rows, then 64 (on an H200 with a bf16 cache: with the one-pass reduce, 16 beat
/// 32 at batch 1, 4.55 against 4.63 ms a step, but lost at 16 rows, 5.69 against 5.44; 64 beat 32 and 128 at 64
/// and 256 rows; BENCHMARKS.md). `RSERVE_CUDA_ATTN_PARTITION` (16 ..= ATTN_MAX_PARTITION, a power of two) sets one
/// size for all.
pub fn partition(rows: usize) -> usize {
    static P: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let fixed = *P.get_or_init(|| {
        std::env::var("RSERVE_CUDA_ATTN_PARTITION")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|p| p.is_power_of_two() && (16..=ATTN_MAX_PARTITION).contains(p))
    });
    fixed.unwrap_or(match rows {
        0..=1 => 16,
        2..=16 => 32,
        _ => 64,
    })
}

/// Partitions a decode launch of `rows` rows has for a longest context of `max_ctx` keys: rounded up to a power of
/// two, so a captured graph (which fixes the grid) serves every context up to that size; the kernels skip
/// partitions past a row's own context.
pub fn decode_parts(max_ctx: usize, rows: usize) -> usize {
    max_ctx.div_ceil(partition(rows)).max(1).next_power_of_two()
}

use super::buffer::{CuBuffer, Contents};
use super::work_group;
use super::CudaBackend;
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
    entries: CuBuffer,
    count: usize,
    max_parts: usize,
    /// `[count, heads, max_parts, head_dim]` partial outputs, `[count, heads, max_parts, 2]` (max, sum) and, when
    /// the decode kernel reduces them itself (`fused_reduce`), one zeroed count per (entry, kv head x head chunk).
    scratch: Option<(CuBuffer, CuBuffer, Option<CuBuffer>)>,
}

/// Whether the decode kernel of `rows` rows combines its `max_parts` split-KV partitions itself (the last
/// work-group of a row to finish does it; `prelude.h` "hand-off between work-groups") instead of a
/// `paged_attention_reduce` launch. Above 16 rows by default: on an H200 a batch-1 layer's attention took 14.1 µs
/// fused against 11.9 with the second launch (the last work-group's serial tail is longer than a launch under
/// programmatic dependent launch), while at 256 rows a decode step took 15.63 ms fused against 15.93.
/// `RSERVE_CUDA_ATTN_FUSED_REDUCE=0` / `=1` turns it off / on for every row count. Needs at most ATTN_MAX_PARTITION
/// partitions (the kernel's weight table).
pub fn fused_reduce(max_parts: usize, rows: usize) -> bool {
    static SET: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    let set = *SET.get_or_init(|| std::env::var("RSERVE_CUDA_ATTN_FUSED_REDUCE").ok().map(|v| v != "0"));
    set.unwrap_or(rows > 16) && max_parts > 1 && max_parts <= ATTN_MAX_PARTITION
}

/// Whether a decode launch of `rows` rows takes the latency variant of the kernel (`paged_attention_decode_lat*`:
/// key and value loads in flight together, more registers): up to 16 rows by default, where it measured faster on
/// an H200 (graph decode steps 4.92 vs 5.07 ms at 1 row, 5.47 vs 5.63 at 16) while at 64 and 256 rows its register
/// count cost more than it saved (7.44 vs 7.39 ms, 16.41 vs 15.91). `RSERVE_CUDA_ATTN_LATENCY_ROWS=N` moves the limit.
pub fn latency_variant(rows: usize) -> bool {
    static LIMIT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    rows <= *LIMIT.get_or_init(|| {
        std::env::var("RSERVE_CUDA_ATTN_LATENCY_ROWS").ok().and_then(|v| v.parse().ok()).unwrap_or(16)
    })
}

/// Tiles for the prefill kernel: (sequence, first pair) per tile.
struct Prefill {
    tiles: CuBuffer,
    count: usize,
}

/// The work split of one batch shape.
pub(super) struct Plan {
    key: (Vec<u32>, usize, usize, usize, usize),
    /// Keys per partition of the decode launch (`partition(rows)`).
    partition: usize,
    decode: Option<Decode>,
    prefill: Option<Prefill>,
}

fn check_meta(meta: &AttentionMeta<'_, CuBuffer>, s: &Shape, cache_len: usize) -> Result<usize> {
    let num_seqs = meta.host_context_lens.len();
    let (qs, ctx, tables, max_blocks) =
        (meta.host_query_start, meta.host_context_lens, meta.host_block_tables, meta.max_blocks_per_seq);
    if meta.num_seqs != num_seqs || qs.len() != num_seqs + 1 || tables.len() < num_seqs * max_blocks {
        return Err(be("paged_attention: metadata lengths disagree"));
    }
    if s.num_kv_heads == 0 || s.num_heads % s.num_kv_heads != 0 {
        return Err(be("paged_attention: heads must be a multiple of kv heads"));
    }
    if s.block_size == 0 || s.head_dim == 0 {
        return Err(be("paged_attention: block size and head dim must be positive"));
    }
    if s.head_dim % 4 != 0 {
        return Err(be(format!("paged_attention: head dim {} is not a multiple of 4 (the kernels load 4 values at a time)", s.head_dim)));
    }
    // The kernels read the device copies: they must hold what the host copies say.
    let same = |b: &CuBuffer, host: &[u32], what: &str| -> Result<()> {
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

fn build_plan(b: &CudaBackend, meta: &AttentionMeta<'_, CuBuffer>, s: &Shape) -> Result<Plan> {
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
        let max_parts = decode_parts(max_ctx, count);
        let scratch = if max_parts > 1 {
            let outs = count * s.num_heads * max_parts;
            let part_out = CuBuffer::new(&b.pool, outs * s.head_dim * 4, Contents::F32 { len: outs * s.head_dim })?;
            let part_ml = CuBuffer::new(&b.pool, outs * 2 * 4, Contents::F32 { len: outs * 2 })?;
            let counters = if fused_reduce(max_parts, count) {
                let chunks = (s.num_heads / s.num_kv_heads).div_ceil(ATTN_HEAD_CHUNK);
                Some(b.alloc_u32(count * s.num_kv_heads * chunks)?)
            } else {
                None
            };
            Some((part_out, part_ml, counters))
        } else {
            None
        };
        Some(Decode { entries: b.upload_u32(&entries)?, count, max_parts, scratch })
    };
    let prefill = if tiles.is_empty() { None } else { Some(Prefill { count: tiles.len() / 2, tiles: b.upload_u32(&tiles)? }) };
    let partition = partition(decode.as_ref().map_or(0, |d| d.count));
    Ok(Plan { key: plan_key(meta, s), partition, decode, prefill })
}

/// What the work split depends on: which rows the batch has (query starts) and how many partitions its longest
/// decode row needs, never the context lengths themselves (the kernels read those on the device).
fn plan_key(meta: &AttentionMeta<'_, CuBuffer>, s: &Shape) -> (Vec<u32>, usize, usize, usize, usize) {
    let tiled_prefill = rserve_kernels::prefill_tiles_head(s.head_dim);
    let longest = meta.longest_decode_context(tiled_prefill);
    let parts = if longest == 0 { 0 } else { decode_parts(longest, meta.decode_rows(tiled_prefill)) };
    (meta.host_query_start.to_vec(), parts, s.num_heads, s.num_kv_heads, s.head_dim)
}

pub(super) fn paged_attention(
    b: &CudaBackend,
    q: &CuBuffer,
    k_cache: &CuBuffer,
    v_cache: &CuBuffer,
    out: &CuBuffer,
    meta: &AttentionMeta<'_, CuBuffer>,
    s: &Shape,
) -> Result<()> {
    let (cache_len, kind) = super::ops::kv_pair(k_cache, v_cache, "paged_attention")?;
    let kind = kind as usize;
    let num_rows = check_meta(meta, s, cache_len)?;
    q.f32("paged_attention q", num_rows * s.num_heads * s.head_dim)?;
    // f32, or the 16-bit input of the output projection (`alloc_matmul_input`).
    let out_kind = out.act_out("paged_attention out", num_rows * s.num_heads * s.head_dim)? as usize;

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
        let (part_out, part_ml, counters) = match &d.scratch {
            Some((o, m, c)) => (o, m, c.as_ref()),
            None => (out, out, None), // not touched with one partition
        };
        let wg = work_group("paged_attention_decode");
        b.kernels
            .launch(if latency_variant(d.count) {
                ["paged_attention_decode_lat", "paged_attention_decode_lat_bf16", "paged_attention_decode_lat_f16"][kind]
            } else {
                ["paged_attention_decode", "paged_attention_decode_bf16", "paged_attention_decode_f16"][kind]
            })?
            .buf(q)
            .buf(k_cache)
            .buf(v_cache)
            .buf(out)
            .buf(part_out)
            .buf(part_ml)
            .buf(counters.unwrap_or(part_ml)) // read only by the fused reduction
            .buf(&d.entries)
            .buf(meta.query_start)
            .buf(meta.context_lens)
            .buf(meta.block_tables)
            .u32(meta.max_blocks_per_seq)
            .u32(s.num_heads)
            .u32(s.num_kv_heads)
            .u32(s.head_dim)
            .u32(s.block_size)
            .u32(plan.partition)
            .u32(d.max_parts)
            .f32(s.scale)
            .u32(out_kind)
            .u32(counters.is_some() as usize)
            .run(&b.stream, [d.count * wg, s.num_kv_heads * chunks, d.max_parts], [wg, 1, 1])?;
        if d.max_parts > 1 && counters.is_none() {
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
                .u32(plan.partition)
                .u32(d.max_parts)
                .u32(out_kind)
                .run(&b.stream, [d.count * wg, s.num_heads, 1], [wg, 1, 1])?;
        }
    }
    if let Some(p) = &plan.prefill {
        let wg = work_group("paged_attention_prefill");
        b.kernels
            .launch(["paged_attention_prefill", "paged_attention_prefill_bf16", "paged_attention_prefill_f16"][kind])?
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
            .u32(out_kind)
            .run(&b.stream, [p.count * wg, s.num_kv_heads, 1], [wg, 1, 1])?;
    }
    Ok(())
}
