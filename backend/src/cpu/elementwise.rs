//! CPU elementwise and row-wise ops: embedding gather, RMSNorm, residual add, rotary embedding (after the
//! optional per-head q/k RMSNorm) with the KV-cache store of a fused q/k/v row, gated activations, soft-capping, row gather. Bounds are checked once per op so a malformed batch is an error, never a panic.

use candle_core::{DType, Device, Tensor};
use rayon::prelude::*;

use super::attention::KvElem;
use super::{be, CpuBuffer};
use crate::error::Result;
use crate::Activation;

fn check_len(what: &str, have: usize, need: usize) -> Result<()> {
    if have < need {
        return Err(be(format!("{what}: buffer holds {have} values, op needs {need}")));
    }
    Ok(())
}

pub(super) fn embedding(
    table: &CpuBuffer,
    ids: &[u32],
    out: &mut [f32],
    n: usize,
    hidden: usize,
    scale: f32,
) -> Result<()> {
    check_len("embedding ids", ids.len(), n)?;
    check_len("embedding out", out.len(), n * hidden)?;
    let t = table.matrix()?;
    let vocab = t.dim(0)?;
    if let Some(bad) = ids[..n].iter().find(|&&i| i as usize >= vocab) {
        return Err(be(format!("token id {bad} is outside the vocabulary of {vocab}")));
    }
    let idx = Tensor::from_slice(&ids[..n], n, &Device::Cpu)?;
    let rows = t.index_select(&idx, 0)?.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    out[..n * hidden].iter_mut().zip(rows).for_each(|(o, v)| *o = v * scale);
    Ok(())
}

pub(super) fn add_in_place(acc: &mut [f32], x: &[f32], len: usize) -> Result<()> {
    check_len("add acc", acc.len(), len)?;
    check_len("add x", x.len(), len)?;
    acc[..len].iter_mut().zip(&x[..len]).for_each(|(a, b)| *a += b);
    Ok(())
}

pub(super) fn rms_norm(x: &[f32], w: &[f32], out: &mut [f32], rows: usize, hidden: usize, eps: f32) -> Result<()> {
    check_len("rms_norm x", x.len(), rows * hidden)?;
    check_len("rms_norm weight", w.len(), hidden)?;
    check_len("rms_norm out", out.len(), rows * hidden)?;
    out[..rows * hidden].par_chunks_mut(hidden).zip(x[..rows * hidden].par_chunks(hidden)).for_each(|(o, xr)| {
        let ms = xr.iter().map(|v| v * v).sum::<f32>() / hidden as f32;
        let r = 1.0 / (ms + eps).sqrt();
        for ((o, &v), &wv) in o.iter_mut().zip(xr).zip(w) {
            *o = wv * (v * r);
        }
    });
    Ok(())
}

/// The per-head RMSNorm weights of `Op::RopeWriteKv` (`QkNorm`), read on the host.
pub(super) struct HeadNorm<'a> {
    pub wq: &'a [f32],
    pub wk: &'a [f32],
    pub eps: f32,
}

/// `w * (x * r)` with `r` the reciprocal RMS of `x`: one q or k head normalised into `out`.
fn norm_head(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let r = 1.0 / (x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32 + eps).sqrt();
    out.iter_mut().zip(x).zip(w).for_each(|((o, &v), &wv)| *o = wv * (v * r));
}

/// The head to rotate: `src` itself, or (with a norm's weight and epsilon) its normalised copy in `buf`.
fn prepared<'b>(src: &'b [f32], norm: Option<(&[f32], f32)>, buf: &'b mut [f32]) -> &'b [f32] {
    match norm {
        Some((w, eps)) => {
            norm_head(src, w, eps, buf);
            buf
        }
        None => src,
    }
}

/// Heads of a fused q/k/v row.
pub(super) struct QkvShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// Rotate-half rotary embedding of one head from `src` into `dst` (cos/sin of the token's angles).
fn rotate(src: &[f32], dst: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = cos.len();
    for i in 0..half {
        let (x1, x2) = (src[i], src[i + half]);
        dst[i] = x1 * cos[i] - x2 * sin[i];
        dst[i + half] = x2 * cos[i] + x1 * sin[i];
    }
}

/// `Op::RopeWriteKv`: q roped into `q_out`, k roped and v copied into the paged cache rows `slots[t]` (in the
/// cache's element type); with `norm`, each q and k head is RMS-normalised before it is rotated.
#[allow(clippy::too_many_arguments)]
pub(super) fn rope_write_kv<T: KvElem>(
    qkv: &[f32],
    positions: &[u32],
    inv_freq: &[f32],
    q_out: &mut [f32],
    k_cache: &mut [T],
    v_cache: &mut [T],
    slots: &[u32],
    n: usize,
    s: &QkvShape,
    mscale: f32,
    norm: Option<&HeadNorm<'_>>,
) -> Result<()> {
    let (hd, half) = (s.head_dim, s.head_dim / 2);
    let (q_w, kv_w) = (s.heads * hd, s.kv_heads * hd);
    let width = q_w + 2 * kv_w;
    check_len("rope_write_kv qkv", qkv.len(), n * width)?;
    check_len("rope_write_kv q_out", q_out.len(), n * q_w)?;
    check_len("rope_write_kv positions", positions.len(), n)?;
    check_len("rope_write_kv slot mapping", slots.len(), n)?;
    let tables = if positions[..n].iter().any(|p| p >> 31 != 0) { 2 } else { 1 };
    check_len("rope_write_kv inv_freq", inv_freq.len(), tables * half)?;
    let cache_len = k_cache.len().min(v_cache.len());
    if let Some(bad) = slots[..n].iter().find(|&&slot| (slot as usize + 1) * kv_w > cache_len) {
        return Err(be(format!("rope_write_kv: slot {bad} outside the cache")));
    }
    if let Some(norm) = norm {
        check_len("rope_write_kv q norm weight", norm.wq.len(), hd)?;
        check_len("rope_write_kv k norm weight", norm.wk.len(), hd)?;
    }
    // One roped key head before it is stored in the cache's type, and one normalised head before it is rotated.
    let (mut head, mut normed) = (vec![0f32; hd], vec![0f32; hd]);
    let (qn, kn) = (norm.map(|nw| (nw.wq, nw.eps)), norm.map(|nw| (nw.wk, nw.eps)));
    for t in 0..n {
        // Bit 31 of a position selects the second table (LongRoPE's long factors).
        let (pos, table) = ((positions[t] & 0x7fff_ffff) as f32, (positions[t] >> 31) as usize * half);
        let a: Vec<f32> = inv_freq[table..table + half].iter().map(|&f| pos * f).collect();
        let cos: Vec<f32> = a.iter().map(|a| a.cos() * mscale).collect();
        let sin: Vec<f32> = a.iter().map(|a| a.sin() * mscale).collect();
        let row = &qkv[t * width..(t + 1) * width];
        let (q, kv) = row.split_at(q_w);
        let (k, v) = kv.split_at(kv_w);
        for (src, dst) in q.chunks(hd).zip(q_out[t * q_w..(t + 1) * q_w].chunks_mut(hd)) {
            rotate(prepared(src, qn, &mut normed), dst, &cos, &sin);
        }
        let at = slots[t] as usize * kv_w;
        for (src, dst) in k.chunks(hd).zip(k_cache[at..at + kv_w].chunks_mut(hd)) {
            rotate(prepared(src, kn, &mut normed), &mut head, &cos, &sin);
            dst.iter_mut().zip(&head).for_each(|(d, &v)| *d = T::from_f32(v));
        }
        v_cache[at..at + kv_w].iter_mut().zip(v).for_each(|(d, &v)| *d = T::from_f32(v));
    }
    Ok(())
}

/// PyTorch's `gelu(x, approximate="tanh")`.
pub(crate) fn gelu_tanh(x: f32) -> f32 {
    0.5 * x * (1.0 + (0.797_884_6 * (x + 0.044_715 * x * x * x)).tanh())
}

/// gpt-oss's SwiGLU constants (`swiglu_alpha`, `swiglu_limit`; the config parser refuses other values).
pub const SWIGLU_ALPHA: f32 = 1.702;
pub const SWIGLU_LIMIT: f32 = 7.0;

/// `Op::GatedAct`: `out[r, j] = act(gate_up[r, j]) * gate_up[r, width + j]` (`SwigluOai`: its own product).
pub(super) fn gated_act(gate_up: &[f32], out: &mut [f32], rows: usize, width: usize, act: Activation) -> Result<()> {
    check_len("gated_act gate_up", gate_up.len(), rows * 2 * width)?;
    check_len("gated_act out", out.len(), rows * width)?;
    if width == 0 {
        return Ok(());
    }
    out[..rows * width].par_chunks_mut(width).zip(gate_up[..rows * 2 * width].par_chunks(2 * width)).for_each(
        |(o, gu)| {
            let (g, u) = gu.split_at(width);
            for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
                *o = match act {
                    Activation::Silu => g / (1.0 + (-g).exp()) * u,
                    Activation::GeluTanh => gelu_tanh(g) * u,
                    Activation::SwigluOai => {
                        let (g, u) = (g.min(SWIGLU_LIMIT), u.clamp(-SWIGLU_LIMIT, SWIGLU_LIMIT));
                        g / (1.0 + (-SWIGLU_ALPHA * g).exp()) * (u + 1.0)
                    }
                };
            }
        },
    );
    Ok(())
}

/// `Op::SoftCap`: `x = cap * tanh(x / cap)`.
pub(super) fn soft_cap(x: &mut [f32], len: usize, cap: f32) -> Result<()> {
    check_len("soft_cap x", x.len(), len)?;
    if cap.is_nan() || cap <= 0.0 {
        return Err(be(format!("soft_cap: cap {cap} must be positive")));
    }
    x[..len].par_iter_mut().for_each(|v| *v = cap * (*v / cap).tanh());
    Ok(())
}

pub(super) fn gather_rows(x: &[f32], rows: &[u32], out: &mut [f32], num_rows: usize, width: usize) -> Result<()> {
    check_len("gather rows", rows.len(), num_rows)?;
    check_len("gather out", out.len(), num_rows * width)?;
    for (i, &r) in rows[..num_rows].iter().enumerate() {
        let r = r as usize;
        check_len("gather x", x.len(), (r + 1) * width)?;
        out[i * width..(i + 1) * width].copy_from_slice(&x[r * width..(r + 1) * width]);
    }
    Ok(())
}

/// `ids[i] = prev[from[i]]` where `from[i] < prev_len` (`Op::FeedTokens`).
pub(super) fn feed_tokens(ids: &mut [u32], prev: &[u32], from: &[u32], count: usize, prev_len: usize) -> Result<()> {
    check_len("feed_tokens ids", ids.len(), count)?;
    check_len("feed_tokens prev", prev.len(), prev_len)?;
    check_len("feed_tokens from", from.len(), count)?;
    for (id, &f) in ids[..count].iter_mut().zip(&from[..count]) {
        if (f as usize) < prev_len {
            *id = prev[f as usize];
        }
    }
    Ok(())
}

/// Sets the logits whose mask bit is clear to -inf (`ceil(vocab / 32)` mask words a row).
pub(super) fn mask_logits(logits: &mut [f32], mask: &[u32], rows: usize, vocab: usize) -> Result<()> {
    let words = vocab.div_ceil(32);
    check_len("mask_logits logits", logits.len(), rows * vocab)?;
    check_len("mask_logits mask", mask.len(), rows * words)?;
    for (row, bits) in logits[..rows * vocab].chunks_mut(vocab).zip(mask.chunks(words)) {
        crate::sampling::apply_bits(row, bits);
    }
    Ok(())
}
