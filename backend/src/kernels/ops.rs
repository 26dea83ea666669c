//! The row-wise and elementwise ops (`kernels/src/cl/{embedding,norm,kv_cache,elementwise}.cl`): checks, entry point
//! by element type, arguments and grid.

use rserve_kernels::launch::ROPE_HEADS;
use rserve_kernels::names;

use super::contents::{elem_type, kv_pair};
use super::{u32_arg, Arg, KernelDevice, Launch};
use crate::cpu::be;
use crate::error::Result;
use crate::{Activation, QkNorm, RopeIo};

pub(super) fn embedding<D: KernelDevice>(
    d: &D,
    table: &D::Buf,
    ids: &D::Buf,
    out: &D::Buf,
    [n, hidden]: [usize; 2],
    scale: f32,
) -> Result<()> {
    let (dtype, vocab, cols) = d.contents(table).matrix("embedding table")?;
    if cols != hidden {
        return Err(be(format!("embedding table is [{vocab}, {cols}], op expects width {hidden}")));
    }
    let bound = d.contents(ids).u32("embedding ids", n)?;
    if bound > vocab {
        return Err(be(format!("token id {} is outside the vocabulary of {vocab}", bound - 1)));
    }
    d.contents(out).f32("embedding out", n * hidden)?;
    let kernel = elem_type(dtype).pick(&names::EMBEDDING);
    let args = vec![Arg::Buf(table), Arg::Buf(ids), Arg::Buf(out), u32_arg(hidden, kernel, "hidden")?, Arg::F32(scale)];
    d.launch(&Launch::items(kernel, args, hidden, [n, 1]))
}

/// RMSNorm; with `residual`, the fused `residual += x; out = norm(residual)`. `out` is f32 or the 16-bit input of
/// the next matrix multiply.
pub(super) fn rms_norm<D: KernelDevice>(
    d: &D,
    x: &D::Buf,
    residual: Option<&D::Buf>,
    w: &D::Buf,
    out: &D::Buf,
    [rows, hidden]: [usize; 2],
    eps: f32,
) -> Result<()> {
    d.contents(x).f32("rms_norm x", rows * hidden)?;
    d.contents(w).f32("rms_norm weight", hidden)?;
    let out_ty = d.contents(out).act("rms_norm out", rows * hidden)?;
    let (kernel, mut args) = match residual {
        Some(r) => {
            d.contents(r).f32("rms_norm residual", rows * hidden)?;
            (out_ty.pick(&names::ADD_RMS_NORM), vec![Arg::Buf(x), Arg::Buf(r)])
        }
        None => (out_ty.pick(&names::RMS_NORM), vec![Arg::Buf(x)]),
    };
    args.extend([Arg::Buf(w), Arg::Buf(out), u32_arg(hidden, kernel, "hidden")?, Arg::F32(eps)]);
    d.launch(&Launch::groups(kernel, args, rows, [1, 1]))
}

/// Rotary embedding of q and k from the fused projection (each q / k head RMS-normalised first with `qk_norm`),
/// k and v stored at each token's slot.
pub(super) fn rope_write_kv<D: KernelDevice>(
    d: &D,
    io: &RopeIo<'_, D::Buf>,
    qk_norm: Option<&QkNorm<'_, D::Buf>>,
    n: usize,
    [heads, kv_heads, hd]: [usize; 3],
    mscale: f32,
) -> Result<()> {
    let all_heads = heads + 2 * kv_heads;
    d.contents(io.qkv).f32("rope_write_kv qkv", n * all_heads * hd)?;
    d.contents(io.q_out).f32("rope_write_kv q_out", n * heads * hd)?;
    // A position with bit 31 set reads the second table of frequencies (LongRoPE's long factors).
    let pos_bound = d.contents(io.positions).u32("rope_write_kv positions", n)?;
    let tables = if pos_bound > 1 << 31 { 2 } else { 1 };
    d.contents(io.inv_freq).f32("rope_write_kv inv_freq", tables * (hd / 2))?;
    let (cache_len, ty) = kv_pair(d.contents(io.k_cache), d.contents(io.v_cache), "rope_write_kv")?;
    let bound = d.contents(io.slot_mapping).u32("rope_write_kv slot mapping", n)?;
    if bound * kv_heads * hd > cache_len {
        return Err(be(format!("rope_write_kv: slot {} outside the cache", bound - 1)));
    }
    if let Some(norm) = qk_norm {
        d.contents(norm.q_weight).f32("rope_write_kv q norm weight", hd)?;
        d.contents(norm.k_weight).f32("rope_write_kv k norm weight", hd)?;
    }
    let kernel = ty.pick(&names::ROPE_WRITE_KV);
    let mut args: Vec<_> = [io.qkv, io.positions, io.inv_freq, io.q_out, io.k_cache, io.v_cache, io.slot_mapping]
        .into_iter()
        .map(Arg::Buf)
        .collect();
    args.extend([
        u32_arg(heads, kernel, "heads")?,
        u32_arg(kv_heads, kernel, "kv_heads")?,
        u32_arg(hd, kernel, "head_dim")?,
        Arg::F32(mscale),
    ]);
    // Without a norm the weights are never read; any buffer stands in for them.
    let (wq, wk, eps) = qk_norm.map_or((io.qkv, io.qkv, 0.0), |q| (q.q_weight, q.k_weight, q.eps));
    args.extend([Arg::Buf(wq), Arg::Buf(wk), Arg::F32(eps), Arg::U32(u32::from(qk_norm.is_some()))]);
    d.launch(&Launch::groups(kernel, args, n * all_heads.div_ceil(ROPE_HEADS), [1, 1]))
}

/// `act(gate) * up` over the fused gate/up rows; `out` is f32 or the 16-bit input of the down projection.
pub(super) fn gated_act<D: KernelDevice>(
    d: &D,
    gate_up: &D::Buf,
    out: &D::Buf,
    [rows, width]: [usize; 2],
    act: Activation,
) -> Result<()> {
    d.contents(gate_up).f32("gated_act gate_up", rows * 2 * width)?;
    let kernel = d.contents(out).act("gated_act out", rows * width)?.pick(&names::GATED_ACT);
    let args = vec![Arg::Buf(gate_up), Arg::Buf(out), u32_arg(width, kernel, "width")?, Arg::U32(act.kernel_id())];
    d.launch(&Launch::items(kernel, args, width, [rows, 1]))
}

/// `x = cap * tanh(x / cap)` over `x[rows, width]`, in place.
pub(super) fn soft_cap<D: KernelDevice>(d: &D, x: &D::Buf, [rows, width]: [usize; 2], cap: f32) -> Result<()> {
    d.contents(x).f32("soft_cap x", rows * width)?;
    if cap.is_nan() || cap <= 0.0 {
        return Err(be(format!("soft_cap: cap {cap} must be positive")));
    }
    let kernel = names::SOFT_CAP;
    let args = vec![Arg::Buf(x), u32_arg(width, kernel, "width")?, Arg::F32(cap)];
    d.launch(&Launch::items(kernel, args, width, [rows, 1]))
}

pub(super) fn gather_rows<D: KernelDevice>(
    d: &D,
    x: &D::Buf,
    rows: &D::Buf,
    out: &D::Buf,
    num_rows: usize,
    width: usize,
) -> Result<()> {
    let x_len = d.contents(x).f32("gather x", 0)?;
    let bound = d.contents(rows).u32("gather rows", num_rows)?;
    if bound * width > x_len {
        return Err(be(format!("gather x: row {} is outside a buffer of {x_len} values", bound - 1)));
    }
    d.contents(out).f32("gather out", num_rows * width)?;
    let kernel = names::GATHER_ROWS;
    let args = vec![Arg::Buf(x), Arg::Buf(rows), Arg::Buf(out), u32_arg(width, kernel, "width")?];
    d.launch(&Launch::items(kernel, args, width, [num_rows, 1]))
}

/// `ids[i] = prev[from[i]]` where `from[i] < prev_len` (`Op::FeedTokens`).
pub(super) fn feed_tokens<D: KernelDevice>(
    d: &D,
    [ids, prev, from]: [&D::Buf; 3],
    count: usize,
    prev_len: usize,
) -> Result<()> {
    d.contents(ids).u32("feed_tokens ids", count)?;
    d.contents(prev).u32("feed_tokens prev", prev_len)?;
    d.contents(from).u32("feed_tokens from", count)?;
    if count == 0 {
        return Ok(());
    }
    let kernel = names::FEED_TOKENS;
    let args = vec![
        Arg::Buf(ids),
        Arg::Buf(prev),
        Arg::Buf(from),
        u32_arg(count, kernel, "count")?,
        u32_arg(prev_len, kernel, "prev_len")?,
    ];
    d.launch(&Launch::items(kernel, args, count, [1, 1]))
}

/// Grammar masks (one bit per token, `ceil(vocab / 32)` words a row) applied to `[rows, vocab]` logits.
pub(super) fn mask_logits<D: KernelDevice>(
    d: &D,
    logits: &D::Buf,
    mask: &D::Buf,
    rows: usize,
    vocab: usize,
) -> Result<()> {
    let words = vocab.div_ceil(32);
    let len = d.contents(logits).f32("mask_logits logits", 0)?;
    if len < rows * vocab {
        return Err(be(format!("mask_logits: {rows} rows of {vocab} logits, the buffer holds {len} values")));
    }
    d.contents(mask).u32("mask_logits mask", rows * words)?;
    let kernel = names::MASK_LOGITS;
    let args =
        vec![Arg::Buf(logits), Arg::Buf(mask), u32_arg(vocab, kernel, "vocab")?, u32_arg(words, kernel, "words")?];
    d.launch(&Launch::items(kernel, args, vocab, [rows, 1]))
}
