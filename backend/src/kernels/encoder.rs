//! The encoder ops (`kernels/src/cl/encoder.cl`): `Op::LayerNorm`, `Op::Gelu` and `Op::EncoderAttention`, with
//! their checks, arguments and grids.

use rserve_kernels::names;

use super::{u32_arg, Arg, KernelDevice, Launch};
use crate::cpu::be;
use crate::error::Result;

/// `out = layernorm(x + residual) * weight + bias`, one work-group per row.
pub(super) fn layer_norm<D: KernelDevice>(
    d: &D,
    [x, weight, bias, out]: [&D::Buf; 4],
    residual: Option<&D::Buf>,
    [rows, hidden]: [usize; 2],
    eps: f32,
) -> Result<()> {
    d.contents(x).f32("layer_norm x", rows * hidden)?;
    if let Some(r) = residual {
        d.contents(r).f32("layer_norm residual", rows * hidden)?;
    }
    d.contents(weight).f32("layer_norm weight", hidden)?;
    d.contents(bias).f32("layer_norm bias", hidden)?;
    d.contents(out).f32("layer_norm out", rows * hidden)?;
    let kernel = names::LAYER_NORM;
    // Without a residual the kernel never reads it; x stands in.
    let args = vec![
        Arg::Buf(x),
        Arg::Buf(residual.unwrap_or(x)),
        Arg::Buf(weight),
        Arg::Buf(bias),
        Arg::Buf(out),
        u32_arg(hidden, kernel, "hidden")?,
        Arg::F32(eps),
        Arg::U32(u32::from(residual.is_some())),
    ];
    d.launch(&Launch::groups(kernel, args, rows, [1, 1]))
}

/// `out = gelu(x)` (exact erf form) over `len` values.
pub(super) fn gelu<D: KernelDevice>(d: &D, x: &D::Buf, out: &D::Buf, len: usize) -> Result<()> {
    d.contents(x).f32("gelu x", len)?;
    d.contents(out).f32("gelu out", len)?;
    let kernel = names::GELU;
    let args = vec![Arg::Buf(x), Arg::Buf(out), u32_arg(len, kernel, "len")?];
    d.launch(&Launch::items(kernel, args, len, [1, 1]))
}

/// Bidirectional attention within each sequence: one work-group per (query row, head). The kernel reads keys
/// `query_start[s] .. query_start[s + 1]`, so the starts are bounded by the token count (O(1): the buffer's bound).
pub(super) fn encoder_attention<D: KernelDevice>(
    d: &D,
    [qkv, query_start, out]: [&D::Buf; 3],
    [num_seqs, num_tokens, num_heads, head_dim]: [usize; 4],
    scale: f32,
) -> Result<()> {
    if num_tokens == 0 {
        return Ok(());
    }
    if num_seqs == 0 || num_heads == 0 || head_dim == 0 {
        return Err(be(format!(
            "encoder_attention: {num_tokens} rows need sequences, heads and a head dim (got {num_seqs}, \
             {num_heads}, {head_dim})"
        )));
    }
    let width = num_heads * head_dim;
    d.contents(qkv).f32("encoder_attention qkv", num_tokens * 3 * width)?;
    d.contents(out).f32("encoder_attention out", num_tokens * width)?;
    let bound = d.contents(query_start).u32("encoder_attention query starts", num_seqs + 1)?;
    if bound > num_tokens + 1 {
        return Err(be(format!("encoder_attention: query start {} is past the {num_tokens} rows", bound - 1)));
    }
    let kernel = names::ENCODER_ATTENTION;
    let args = vec![
        Arg::Buf(qkv),
        Arg::Buf(query_start),
        Arg::Buf(out),
        u32_arg(num_seqs, kernel, "num_seqs")?,
        u32_arg(num_heads, kernel, "num_heads")?,
        u32_arg(head_dim, kernel, "head_dim")?,
        Arg::F32(scale),
    ];
    d.launch(&Launch::groups(kernel, args, num_tokens, [num_heads, 1]))
}
