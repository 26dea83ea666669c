//! Each `Op` as launches of the portable kernels of `rserve-kernels`, device-neutral: which kernel, its arguments in
//! the order the kernel source declares them, the grid (work-items per dimension) and the work-group size, after
//! checking every buffer and every index a kernel follows on the host (token ids, slots, rows, block tables). The
//! attention work split (decode entries, prefill tiles, split-KV scratch) depends only on the batch shape and is
//! built once per step, then reused by every layer.
//!
//! This mirrors the OpenCL backend's `opencl/ops.rs` and `opencl/attention.rs` launch for launch (same kernels,
//! argument order, grids, thresholds and checks), written against the `KernelDevice` trait so that one copy can
//! serve every backend that launches these kernels (Level Zero here; OpenCL and CUDA can implement the trait).
//!
//! Grids follow the comment at the top of each kernel source (kernels/src/cl/*.cl); launch constants come from
//! `rserve_kernels::launch`, the numbers the kernels were compiled with.

use std::cell::RefCell;

use rserve_kernels::launch::*;

use crate::backend::{AttentionMeta, Op, WeightDType};
use crate::error::{EngineError, Result};

/// What a buffer holds, as the host knows it.
#[derive(Debug, Clone, Copy)]
pub enum View<'a> {
    /// `len` f32 values.
    F32 { len: usize },
    /// u32 values with their host copy.
    U32 { host: &'a [u32] },
    /// A row-major weight `[rows, cols]` in its dtype.
    Matrix { dtype: WeightDType, rows: usize, cols: usize },
}

/// One kernel argument.
#[derive(Debug)]
pub enum Arg<'a, B> {
    Buf(&'a B),
    U32(u32),
    F32(f32),
}

/// One launch: `global` work-items per dimension (dimension 0 a multiple of `local`), work-groups of `local`
/// work-items in dimension 0 (and 1 in the others). A grid with a zero dimension launches nothing.
#[derive(Debug)]
pub struct Launch<'a, B> {
    pub kernel: &'static str,
    pub args: Vec<Arg<'a, B>>,
    pub global: [usize; 3],
    pub local: usize,
}

/// The attention work of one batch shape, with its device buffers.
pub struct AttnPlan<B> {
    key: (Vec<u32>, Vec<u32>, usize, usize, usize),
    decode: Option<Decode<B>>,
    prefill: Option<Prefill<B>>,
}

struct Decode<B> {
    entries: B,
    count: usize,
    max_parts: usize,
    /// `[count, heads, max_parts, head_dim]` partial outputs and `[count, heads, max_parts, 2]` (max, sum).
    scratch: Option<(B, B)>,
}

struct Prefill<B> {
    tiles: B,
    count: usize,
}

/// What a backend provides to run the kernels.
pub trait KernelDevice {
    type Buf;
    fn view<'b>(&self, b: &'b Self::Buf) -> View<'b>;
    /// An f32 buffer the kernels overwrite before reading.
    fn scratch_f32(&self, len: usize) -> Result<Self::Buf>;
    fn upload_u32(&self, data: &[u32]) -> Result<Self::Buf>;
    /// Appends one launch; launches run in the order they are appended.
    fn launch(&self, l: &Launch<'_, Self::Buf>) -> Result<()>;
    /// Where the current step's attention plan is kept.
    fn attention_plan(&self) -> &RefCell<Option<AttnPlan<Self::Buf>>>;
}

fn be(msg: impl Into<String>) -> EngineError {
    EngineError::Backend(msg.into())
}

/// Work-group size each kernel is launched with.
pub fn work_group(kernel: &str) -> usize {
    match kernel {
        "rms_norm" | "add_rms_norm" => ROW_WG,
        "paged_attention_decode" => ATTN_WG,
        "paged_attention_prefill" => PREFILL_WG,
        k if k.starts_with("matmul_rows") => GEMV_WG,
        k if k.starts_with("matmul_vec") => GEMV_VEC_WG,
        k if k.starts_with("matmul_tiled") => GEMM_WG,
        _ => ELEM_WG,
    }
}

/// Above this many rows the tiled matmul replaces the row-streaming one.
pub const GEMV_MAX_ROWS: usize = 2 * GEMV_ROWS;

fn round_up(n: usize, m: usize) -> usize {
    n.div_ceil(m) * m
}

fn u32_arg<'a, B>(v: usize, kernel: &str, what: &str) -> Result<Arg<'a, B>> {
    u32::try_from(v).map(Arg::U32).map_err(|_| be(format!("{kernel}: {what} = {v} does not fit in 32 bits")))
}

fn f32_len<D: KernelDevice>(d: &D, b: &D::Buf, what: &str, need: usize) -> Result<usize> {
    match d.view(b) {
        View::F32 { len } if len >= need => Ok(len),
        View::F32 { len } => Err(be(format!("{what}: buffer holds {len} values, op needs {need}"))),
        _ => Err(be(format!("{what}: expected an f32 buffer"))),
    }
}

fn host_u32<'b, D: KernelDevice>(d: &D, b: &'b D::Buf, what: &str, need: usize) -> Result<&'b [u32]> {
    match d.view(b) {
        View::U32 { host } if host.len() >= need => Ok(&host[..need]),
        View::U32 { host } => Err(be(format!("{what}: buffer holds {} values, op needs {need}", host.len()))),
        _ => Err(be(format!("{what}: expected a u32 buffer"))),
    }
}

fn matrix<D: KernelDevice>(d: &D, b: &D::Buf, what: &str) -> Result<(WeightDType, usize, usize)> {
    match d.view(b) {
        View::Matrix { dtype, rows, cols } => Ok((dtype, rows, cols)),
        _ => Err(be(format!("{what}: expected a weight matrix"))),
    }
}

fn suffix(dtype: WeightDType) -> usize {
    match dtype {
        WeightDType::F32 => 0,
        WeightDType::BF16 => 1,
        WeightDType::F16 => 2,
    }
}

/// Runs `op` as kernel launches on `d`.
pub fn run<D: KernelDevice>(d: &D, op: Op<'_, D::Buf>) -> Result<()> {
    use Arg::Buf;
    match op {
        Op::Embedding { table, ids, out, num_tokens: n, hidden } => {
            let (dtype, vocab, cols) = matrix(d, table, "embedding table")?;
            if cols != hidden {
                return Err(be(format!("embedding table is [{vocab}, {cols}], op expects width {hidden}")));
            }
            if let Some(bad) = host_u32(d, ids, "embedding ids", n)?.iter().find(|&&i| i as usize >= vocab) {
                return Err(be(format!("token id {bad} is outside the vocabulary of {vocab}")));
            }
            f32_len(d, out, "embedding out", n * hidden)?;
            let kernel = ["embedding_f32", "embedding_bf16", "embedding_f16"][suffix(dtype)];
            d.launch(&Launch {
                kernel,
                args: vec![Buf(table), Buf(ids), Buf(out), u32_arg(hidden, kernel, "hidden")?],
                global: [round_up(hidden, ELEM_WG), n, 1],
                local: ELEM_WG,
            })
        }
        Op::RmsNorm { x, weight, out, rows, hidden, eps } => rms_norm(d, x, None, weight, out, rows, hidden, eps),
        Op::AddRmsNorm { x, residual, weight, out, rows, hidden, eps } => {
            rms_norm(d, x, Some(residual), weight, out, rows, hidden, eps)
        }
        Op::MatMul { x, w, bias, out, m, k, n } => {
            let (dtype, rows, cols) = matrix(d, w, "matmul weight")?;
            if (rows, cols) != (n, k) {
                return Err(be(format!("matmul weight is [{rows}, {cols}], op expects [{n}, {k}]")));
            }
            f32_len(d, x, "matmul x", m * k)?;
            f32_len(d, out, "matmul out", m * n)?;
            if let Some(bias) = bias {
                f32_len(d, bias, "matmul bias", n)?;
            }
            let (kernel, global) = if m <= GEMV_ROWS && k % 8 == 0 && dtype != WeightDType::F32 {
                let name = if dtype == WeightDType::BF16 { "matmul_vec_bf16" } else { "matmul_vec_f16" };
                (name, [n.div_ceil(GEMV_VEC_COLS) * GEMV_VEC_WG, 1, 1])
            } else if m <= GEMV_MAX_ROWS {
                let name = ["matmul_rows_f32", "matmul_rows_bf16", "matmul_rows_f16"][suffix(dtype)];
                (name, [n.div_ceil(GEMV_COLS) * GEMV_WG, m.div_ceil(GEMV_ROWS), 1])
            } else {
                let name = ["matmul_tiled_f32", "matmul_tiled_bf16", "matmul_tiled_f16"][suffix(dtype)];
                (name, [n.div_ceil(GEMM_TILE_N) * GEMM_WG, m.div_ceil(GEMM_TILE_M), 1])
            };
            d.launch(&Launch {
                kernel,
                args: vec![
                    Buf(x),
                    Buf(w),
                    Buf(bias.unwrap_or(x)), // never read without a bias
                    Buf(out),
                    u32_arg(m, kernel, "m")?,
                    u32_arg(k, kernel, "k")?,
                    u32_arg(n, kernel, "n")?,
                    u32_arg(bias.is_some() as usize, kernel, "has_bias")?,
                ],
                global,
                local: work_group(kernel),
            })
        }
        Op::RopeWriteKv {
            qkv,
            positions,
            inv_freq,
            q_out,
            k_cache,
            v_cache,
            slot_mapping,
            num_tokens: n,
            num_heads: heads,
            num_kv_heads,
            head_dim,
            block_size: _,
        } => {
            let (kernel, kv_w) = ("rope_write_kv", num_kv_heads * head_dim);
            let all_heads = heads + 2 * num_kv_heads;
            f32_len(d, qkv, "rope_write_kv qkv", n * all_heads * head_dim)?;
            f32_len(d, q_out, "rope_write_kv q_out", n * heads * head_dim)?;
            host_u32(d, positions, "rope_write_kv positions", n)?;
            f32_len(d, inv_freq, "rope_write_kv inv_freq", head_dim / 2)?;
            let cache_len =
                f32_len(d, k_cache, "rope_write_kv k cache", 0)?.min(f32_len(d, v_cache, "rope_write_kv v cache", 0)?);
            for &slot in host_u32(d, slot_mapping, "rope_write_kv slot mapping", n)? {
                if (slot as usize + 1) * kv_w > cache_len {
                    return Err(be(format!("rope_write_kv: slot {slot} outside the cache")));
                }
            }
            let total = n * all_heads * (head_dim / 2);
            d.launch(&Launch {
                kernel,
                args: vec![
                    Buf(qkv),
                    Buf(positions),
                    Buf(inv_freq),
                    Buf(q_out),
                    Buf(k_cache),
                    Buf(v_cache),
                    Buf(slot_mapping),
                    u32_arg(n, kernel, "tokens")?,
                    u32_arg(heads, kernel, "heads")?,
                    u32_arg(num_kv_heads, kernel, "kv_heads")?,
                    u32_arg(head_dim, kernel, "head_dim")?,
                ],
                global: [round_up(total, ELEM_WG), 1, 1],
                local: ELEM_WG,
            })
        }
        Op::SiluMul { gate_up, out, rows, width } => {
            f32_len(d, gate_up, "silu gate_up", rows * 2 * width)?;
            f32_len(d, out, "silu out", rows * width)?;
            d.launch(&Launch {
                kernel: "silu_mul",
                args: vec![Buf(gate_up), Buf(out), u32_arg(width, "silu_mul", "width")?],
                global: [round_up(width, ELEM_WG), rows, 1],
                local: ELEM_WG,
            })
        }
        Op::GatherRows { x, rows, out, num_rows, width } => {
            let x_len = f32_len(d, x, "gather x", 0)?;
            for &r in host_u32(d, rows, "gather rows", num_rows)? {
                if (r as usize + 1) * width > x_len {
                    return Err(be(format!("gather x: row {r} is outside a buffer of {x_len} values")));
                }
            }
            f32_len(d, out, "gather out", num_rows * width)?;
            d.launch(&Launch {
                kernel: "gather_rows",
                args: vec![Buf(x), Buf(rows), Buf(out), u32_arg(width, "gather_rows", "width")?],
                global: [round_up(width, ELEM_WG), num_rows, 1],
                local: ELEM_WG,
            })
        }
        Op::PagedAttention { q, k_cache, v_cache, out, meta, num_heads, num_kv_heads, head_dim, block_size, scale } => {
            let s = AttnShape { num_heads, num_kv_heads, head_dim, block_size, scale };
            paged_attention(d, q, k_cache, v_cache, out, meta, &s)
        }
    }
}

/// RMSNorm; with `residual`, the fused `residual += x; out = norm(residual)`.
#[allow(clippy::too_many_arguments)]
fn rms_norm<D: KernelDevice>(
    d: &D,
    x: &D::Buf,
    residual: Option<&D::Buf>,
    w: &D::Buf,
    out: &D::Buf,
    rows: usize,
    hidden: usize,
    eps: f32,
) -> Result<()> {
    use Arg::{Buf, F32};
    f32_len(d, x, "rms_norm x", rows * hidden)?;
    f32_len(d, w, "rms_norm weight", hidden)?;
    f32_len(d, out, "rms_norm out", rows * hidden)?;
    let (kernel, mut args) = match residual {
        Some(r) => {
            f32_len(d, r, "rms_norm residual", rows * hidden)?;
            ("add_rms_norm", vec![Buf(x), Buf(r)])
        }
        None => ("rms_norm", vec![Buf(x)]),
    };
    args.extend([Buf(w), Buf(out), u32_arg(hidden, kernel, "hidden")?, F32(eps)]);
    let wg = work_group(kernel);
    d.launch(&Launch { kernel, args, global: [rows * wg, 1, 1], local: wg })
}

/// Attention shape parameters of one `PagedAttention` op.
pub struct AttnShape {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    pub scale: f32,
}

/// Checks the batch metadata against the cache; returns the number of query rows.
fn check_meta<D: KernelDevice>(d: &D, meta: &AttentionMeta<'_, D::Buf>, s: &AttnShape, cache_len: usize) -> Result<usize> {
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
    let same = |b: &D::Buf, host: &[u32], what: &str| -> Result<()> {
        if host_u32(d, b, what, host.len())? != host {
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

/// The host side of the work split: decode entries `(row, seq)` (the kernels derive each row's visible keys from
/// `query_start` and `context_lens` on the device), prefill tiles `(seq, first pair)`,
/// and the longest context among the decode rows. Expects metadata `check_meta` accepted (`query_start` has one
/// more entry than `context_lens`).
pub fn split_work(query_start: &[u32], context_lens: &[u32], group: usize, head_dim: usize) -> (Vec<u32>, Vec<u32>, usize) {
    let tiled_prefill = rserve_kernels::prefill_tiles_head(head_dim);
    let (mut entries, mut tiles, mut max_ctx) = (Vec::new(), Vec::new(), 0usize);
    for seq in 0..context_lens.len() {
        let (q0, qlen, c) = (query_start[seq], query_start[seq + 1].saturating_sub(query_start[seq]), context_lens[seq]);
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

fn build_plan<D: KernelDevice>(d: &D, meta: &AttentionMeta<'_, D::Buf>, s: &AttnShape) -> Result<AttnPlan<D::Buf>> {
    let group = s.num_heads / s.num_kv_heads;
    let (entries, tiles, max_ctx) = split_work(meta.host_query_start, meta.host_context_lens, group, s.head_dim);
    let decode = if entries.is_empty() {
        None
    } else {
        let count = entries.len() / 2;
        let max_parts = max_ctx.div_ceil(ATTN_MAX_PARTITION);
        let scratch = if max_parts > 1 {
            let outs = count * s.num_heads * max_parts;
            Some((d.scratch_f32(outs * s.head_dim)?, d.scratch_f32(outs * 2)?))
        } else {
            None
        };
        Some(Decode { entries: d.upload_u32(&entries)?, count, max_parts, scratch })
    };
    let prefill = if tiles.is_empty() { None } else { Some(Prefill { count: tiles.len() / 2, tiles: d.upload_u32(&tiles)? }) };
    let key = (meta.host_query_start.to_vec(), meta.host_context_lens.to_vec(), s.num_heads, s.num_kv_heads, s.head_dim);
    Ok(AttnPlan { key, decode, prefill })
}

#[allow(clippy::too_many_arguments)]
fn paged_attention<D: KernelDevice>(
    d: &D,
    q: &D::Buf,
    k_cache: &D::Buf,
    v_cache: &D::Buf,
    out: &D::Buf,
    meta: &AttentionMeta<'_, D::Buf>,
    s: &AttnShape,
) -> Result<()> {
    use Arg::{Buf, F32, U32};
    let cache_len = f32_len(d, k_cache, "paged_attention k cache", 0)?.min(f32_len(d, v_cache, "paged_attention v cache", 0)?);
    let num_rows = check_meta(d, meta, s, cache_len)?;
    f32_len(d, q, "paged_attention q", num_rows * s.num_heads * s.head_dim)?;
    f32_len(d, out, "paged_attention out", num_rows * s.num_heads * s.head_dim)?;

    let mut cached = d.attention_plan().try_borrow_mut().map_err(|_| be("paged_attention: plan in use"))?;
    let stale = match cached.as_ref() {
        Some(p) => {
            p.key.0 != meta.host_query_start
                || p.key.1 != meta.host_context_lens
                || (p.key.2, p.key.3, p.key.4) != (s.num_heads, s.num_kv_heads, s.head_dim)
        }
        None => true,
    };
    if stale {
        *cached = None; // release the old scratch before allocating the new
        *cached = Some(build_plan(d, meta, s)?);
    }
    let plan = cached.as_ref().ok_or_else(|| be("paged_attention: no plan"))?;

    let group = s.num_heads / s.num_kv_heads;
    if let Some(dec) = &plan.decode {
        let kernel = "paged_attention_decode";
        let chunks = group.div_ceil(ATTN_HEAD_CHUNK);
        let (part_out, part_ml) = match &dec.scratch {
            Some((o, m)) => (o, m),
            None => (out, out), // not touched with one partition
        };
        let wg = work_group(kernel);
        d.launch(&Launch {
            kernel,
            args: vec![
                Buf(q),
                Buf(k_cache),
                Buf(v_cache),
                Buf(out),
                Buf(part_out),
                Buf(part_ml),
                Buf(part_ml), // split-KV counters: only the fused reduction (CUDA) uses them
                Buf(&dec.entries),
                Buf(meta.query_start),
                Buf(meta.context_lens),
                Buf(meta.block_tables),
                u32_arg(meta.max_blocks_per_seq, kernel, "max_blocks")?,
                u32_arg(s.num_heads, kernel, "num_heads")?,
                u32_arg(s.num_kv_heads, kernel, "num_kv_heads")?,
                u32_arg(s.head_dim, kernel, "head_dim")?,
                u32_arg(s.block_size, kernel, "block_size")?,
                u32_arg(ATTN_MAX_PARTITION, kernel, "partition_size")?,
                u32_arg(dec.max_parts, kernel, "max_parts")?,
                F32(s.scale),
                U32(0), // f32 output
                U32(0), // reduced by paged_attention_reduce
            ],
            global: [dec.count * wg, s.num_kv_heads * chunks, dec.max_parts],
            local: wg,
        })?;
        if dec.max_parts > 1 {
            let kernel = "paged_attention_reduce";
            let wg = work_group(kernel);
            d.launch(&Launch {
                kernel,
                args: vec![
                    Buf(out),
                    Buf(part_out),
                    Buf(part_ml),
                    Buf(&dec.entries),
                    Buf(meta.query_start),
                    Buf(meta.context_lens),
                    u32_arg(s.num_heads, kernel, "num_heads")?,
                    u32_arg(s.head_dim, kernel, "head_dim")?,
                    u32_arg(ATTN_MAX_PARTITION, kernel, "partition_size")?,
                    u32_arg(dec.max_parts, kernel, "max_parts")?,
                    U32(0), // f32 output
                ],
                global: [dec.count * wg, s.num_heads, 1],
                local: wg,
            })?;
        }
    }
    if let Some(p) = &plan.prefill {
        let kernel = "paged_attention_prefill";
        let wg = work_group(kernel);
        d.launch(&Launch {
            kernel,
            args: vec![
                Buf(q),
                Buf(k_cache),
                Buf(v_cache),
                Buf(out),
                Buf(&p.tiles),
                Buf(meta.query_start),
                Buf(meta.context_lens),
                Buf(meta.block_tables),
                u32_arg(meta.max_blocks_per_seq, kernel, "max_blocks")?,
                u32_arg(s.num_heads, kernel, "num_heads")?,
                u32_arg(s.num_kv_heads, kernel, "num_kv_heads")?,
                u32_arg(s.head_dim, kernel, "head_dim")?,
                u32_arg(s.block_size, kernel, "block_size")?,
                F32(s.scale),
                U32(0), // f32 output
            ],
            global: [p.count * wg, s.num_kv_heads, 1],
            local: wg,
        })?;
    }
    Ok(())
}
