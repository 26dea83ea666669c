//! `Op::PagedAttention` (`kernels/src/cl/attention_{decode,prefill}.cl`): the batch metadata checked against the
//! cache, the work split (decode entries: one query row per work-group, split-KV for contexts longer than one
//! partition; prefill tiles of (token, head) pairs) and the launches.
//!
//! Invariant: a plan depends on the batch's rows (query starts), the heads and the decode partition count, never on
//! the context lengths (the kernels read those on the device), so decode steps of one batch reuse it.

use rserve_kernels::launch::{ATTN_HEAD_CHUNK, PREFILL_ROWS};
use rserve_kernels::names;

use super::contents::kv_pair;
use super::{arg_list, u32_arg, Arg, KernelDevice, Launch};
use crate::cpu::be;
use crate::error::Result;
use crate::{AttentionMeta, AttnShape};

impl AttnShape {
    /// The kernels' `window` (0: none) and `softcap` (0: none) arguments.
    fn window_softcap<'a, B>(&self, kernel: &str) -> Result<[Arg<'a, B>; 2]> {
        let window = match self.window {
            Some(0) => return Err(be("paged_attention: a sliding window of 0 keys")),
            w => u32_arg(w.unwrap_or(0), kernel, "window")?,
        };
        let softcap = match self.softcap {
            Some(c) if c.is_nan() || c <= 0.0 => {
                return Err(be(format!("paged_attention: soft cap {c} must be positive")))
            }
            c => c.unwrap_or(0.0),
        };
        Ok([window, Arg::F32(softcap)])
    }
}

/// What a plan depends on: query starts, decode partitions, heads, kv heads, head dim.
type PlanKey = (Vec<u32>, usize, usize, usize, usize);

/// The attention work of one batch shape, with its device buffers.
pub struct AttnPlan<B> {
    key: PlanKey,
    /// Keys per partition of the decode launch.
    partition: usize,
    decode: Option<Decode<B>>,
    prefill: Option<Prefill<B>>,
}

struct Decode<B> {
    entries: B,
    count: usize,
    parts: usize,
    /// `[count, heads, parts, head_dim]` partial outputs, `[count, heads, parts, 2]` (max, sum) and, when the decode
    /// kernel reduces them itself, one zeroed count per (entry, kv head x head chunk).
    scratch: Option<(B, B, Option<B>)>,
}

struct Prefill<B> {
    tiles: B,
    count: usize,
}

/// Checks one layer's op against metadata `AttentionMeta::new` accepted, in O(1): the shape, the cache the tables
/// point into, and the device copies' values (the kernels index with those); returns the number of query rows.
fn check_meta<D: KernelDevice>(
    d: &D,
    meta: &AttentionMeta<'_, D::Buf>,
    s: &AttnShape,
    cache_len: usize,
) -> Result<usize> {
    if s.num_kv_heads == 0 || !s.num_heads.is_multiple_of(s.num_kv_heads) {
        return Err(be("paged_attention: heads must be a multiple of kv heads"));
    }
    if s.block_size == 0 || s.head_dim == 0 {
        return Err(be("paged_attention: block size and head dim must be positive"));
    }
    if !s.head_dim.is_multiple_of(4) {
        return Err(be(format!(
            "paged_attention: head dim {} is not a multiple of 4 (the kernels load 4 values at a time)",
            s.head_dim
        )));
    }
    let cache_blocks = cache_len / (s.block_size * s.num_kv_heads * s.head_dim);
    meta.check_op(s.block_size, cache_blocks)?;
    let (num_seqs, num_rows, max_blocks) = (meta.num_seqs, meta.num_rows(), meta.max_blocks_per_seq);
    // Whatever the device copies hold, a kernel stays inside q, its table row and the cache.
    let bounded = |b: &D::Buf, what: &str, len: usize, limit: usize| -> Result<()> {
        if d.contents(b).u32(what, len)? > limit {
            return Err(be(format!("paged_attention: device {what} exceed {}", limit.saturating_sub(1))));
        }
        Ok(())
    };
    bounded(meta.query_start, "query starts", num_seqs + 1, num_rows + 1)?;
    bounded(meta.context_lens, "context lengths", num_seqs, max_blocks * s.block_size + 1)?;
    bounded(meta.block_tables, "block tables", num_seqs * max_blocks, cache_blocks)?;
    Ok(num_rows)
}

/// The host side of the work split: decode entries `(row, seq)` (the kernels derive each row's visible keys from
/// `query_start` and `context_lens` on the device), prefill tiles `(seq, first pair)`, and the longest context
/// among the decode rows. Expects metadata `check_meta` accepted (`query_start` has one more entry than
/// `context_lens`).
pub fn split_work(
    query_start: &[u32],
    context_lens: &[u32],
    group: usize,
    head_dim: usize,
) -> (Vec<u32>, Vec<u32>, usize) {
    let tiled_prefill = rserve_kernels::prefill_tiles_head(head_dim);
    let (mut entries, mut tiles, mut max_ctx) = (Vec::new(), Vec::new(), 0usize);
    for seq in 0..context_lens.len() {
        let (q0, qlen, c) =
            (query_start[seq], query_start[seq + 1].saturating_sub(query_start[seq]), context_lens[seq]);
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
    (entries, tiles, max_ctx)
}

fn plan_key<D: KernelDevice>(d: &D, meta: &AttentionMeta<'_, D::Buf>, s: &AttnShape) -> PlanKey {
    let tiled = rserve_kernels::prefill_tiles_head(s.head_dim);
    let parts = d.tuning().decode_parts(meta.longest_decode_context(tiled), meta.decode_rows(tiled));
    (meta.host_query_start.to_vec(), parts, s.num_heads, s.num_kv_heads, s.head_dim)
}

fn build_plan<D: KernelDevice>(
    d: &D,
    meta: &AttentionMeta<'_, D::Buf>,
    s: &AttnShape,
    key: PlanKey,
) -> Result<AttnPlan<D::Buf>> {
    let t = d.tuning();
    let group = s.num_heads / s.num_kv_heads;
    let (entries, tiles, _) = split_work(meta.host_query_start, meta.host_context_lens, group, s.head_dim);
    let count = entries.len() / 2;
    let decode = if entries.is_empty() {
        None
    } else {
        let parts = key.1;
        let scratch = if parts > 1 {
            let outs = count * s.num_heads * parts;
            let counters = if t.fused_reduce(parts, count) {
                Some(d.upload_indices(&vec![0; count * s.num_kv_heads * group.div_ceil(ATTN_HEAD_CHUNK)])?)
            } else {
                None
            };
            Some((d.scratch_f32(outs * s.head_dim)?, d.scratch_f32(outs * 2)?, counters))
        } else {
            None
        };
        Some(Decode { entries: d.upload_indices(&entries)?, count, parts, scratch })
    };
    let prefill = if tiles.is_empty() {
        None
    } else {
        Some(Prefill { count: tiles.len() / 2, tiles: d.upload_indices(&tiles)? })
    };
    Ok(AttnPlan { key, partition: t.partition_size(count), decode, prefill })
}

pub(super) fn paged_attention<D: KernelDevice>(
    d: &D,
    [q, k_cache, v_cache, out]: [&D::Buf; 4],
    sinks: Option<&D::Buf>,
    meta: &AttentionMeta<'_, D::Buf>,
    s: &AttnShape,
) -> Result<()> {
    let (cache_len, kv_ty) = kv_pair(d.contents(k_cache), d.contents(v_cache), "paged_attention")?;
    let num_rows = check_meta(d, meta, s, cache_len)?;
    d.contents(q).f32("paged_attention q", num_rows * s.num_heads * s.head_dim)?;
    // f32, or the 16-bit input of the output projection.
    let out_kind = d.contents(out).act("paged_attention out", num_rows * s.num_heads * s.head_dim)? as u32;
    if let Some(sinks) = sinks {
        d.contents(sinks).f32("paged_attention sinks", s.num_heads)?;
    }
    // The kernels' trailing sink arguments: the per-head logits (any buffer when there are none: not read).
    let sink_args = |kernel: &str| arg_list(kernel, &[sinks.unwrap_or(q)], &[(sinks.is_some() as usize, "has_sinks")]);

    let cache = d.plans();
    let mut cached = cache.plan.try_borrow_mut().map_err(|_| be("paged_attention: plan in use"))?;
    let key = plan_key(d, meta, s);
    if cached.as_ref().is_none_or(|p| p.key != key) {
        *cached = None; // release the old scratch before allocating the new
        *cached = Some(build_plan(d, meta, s, key)?);
        cache.builds.set(cache.builds.get() + 1);
    }
    let plan = cached.as_ref().ok_or_else(|| be("paged_attention: no plan"))?;
    let t = d.tuning();
    let group = s.num_heads / s.num_kv_heads;
    // The arguments after the batch metadata that the decode and prefill kernels share.
    let shape_args = [
        (meta.max_blocks_per_seq, "max_blocks"),
        (s.num_heads, "num_heads"),
        (s.num_kv_heads, "num_kv_heads"),
        (s.head_dim, "head_dim"),
        (s.block_size, "block_size"),
    ];
    if let Some(dec) = &plan.decode {
        let (part_out, part_ml, counters) = match &dec.scratch {
            Some((o, m, c)) => (o, m, c.as_ref()),
            None => (out, out, None), // not touched with one partition
        };
        let table = if dec.count <= t.latency_rows { &names::ATTN_DECODE_LAT } else { &names::ATTN_DECODE };
        let kernel = kv_ty.pick(table);
        let bufs = [q, k_cache, v_cache, out, part_out, part_ml, counters.unwrap_or(part_ml), &dec.entries];
        let mut args = arg_list(kernel, &bufs, &[])?;
        args.extend(arg_list(kernel, &[meta.query_start, meta.context_lens, meta.block_tables], &shape_args)?);
        args.extend(arg_list(kernel, &[], &[(plan.partition, "partition_size"), (dec.parts, "max_parts")])?);
        args.extend([Arg::F32(s.scale), Arg::U32(out_kind), Arg::U32(counters.is_some() as u32)]);
        args.extend(s.window_softcap(kernel)?);
        args.extend(sink_args(kernel)?);
        d.launch(&Launch::groups(
            kernel,
            args,
            dec.count,
            [s.num_kv_heads * group.div_ceil(ATTN_HEAD_CHUNK), dec.parts],
        ))?;
        if dec.parts > 1 && counters.is_none() {
            let kernel = names::ATTN_REDUCE;
            let bufs = [out, part_out, part_ml, &dec.entries, meta.query_start, meta.context_lens];
            let nums = [(s.num_heads, "num_heads"), (s.head_dim, "head_dim"), (plan.partition, "partition_size")];
            let mut args = arg_list(kernel, &bufs, &nums)?;
            args.extend([u32_arg(dec.parts, kernel, "max_parts")?, Arg::U32(out_kind)]);
            let [window, _] = s.window_softcap(kernel)?;
            args.push(window);
            args.extend(sink_args(kernel)?);
            d.launch(&Launch::groups(kernel, args, dec.count, [s.num_heads, 1]))?;
        }
    }
    if let Some(p) = &plan.prefill {
        let kernel = kv_ty.pick(&names::ATTN_PREFILL);
        let mut args = arg_list(kernel, &[q, k_cache, v_cache, out, &p.tiles], &[])?;
        args.extend(arg_list(kernel, &[meta.query_start, meta.context_lens, meta.block_tables], &shape_args)?);
        args.extend([Arg::F32(s.scale), Arg::U32(out_kind)]);
        args.extend(s.window_softcap(kernel)?);
        args.extend(sink_args(kernel)?);
        d.launch(&Launch::groups(kernel, args, p.count, [s.num_kv_heads, 1]))?;
    }
    Ok(())
}
