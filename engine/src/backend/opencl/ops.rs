//! Launches of the row-wise and elementwise ops and the matrix multiply, each after checking its buffers and every
//! index it follows on the host. Grids and argument orders mirror `kernels/src/cl/{embedding,norm,rope,elementwise,
//! kv_cache,matmul}.cl`.

use rserve_kernels::launch::*;

use super::buffer::ClBuffer;
use super::kernels::{round_up, work_group};
use super::OpenClBackend;
use crate::backend::cpu::be;
use crate::backend::WeightDType;
use crate::error::Result;

/// Above this many rows the tiled matmul replaces the row-streaming one.
const GEMV_MAX_ROWS: usize = 2 * GEMV_ROWS;

pub(super) fn embedding(b: &OpenClBackend, table: &ClBuffer, ids: &ClBuffer, out: &ClBuffer, n: usize, hidden: usize) -> Result<()> {
    let (dtype, vocab, cols) = table.matrix("embedding table")?;
    if cols != hidden {
        return Err(be(format!("embedding table is [{vocab}, {cols}], op expects width {hidden}")));
    }
    let host = ids.u32("embedding ids", n)?;
    if let Some(bad) = host[..n].iter().find(|&&i| i as usize >= vocab) {
        return Err(be(format!("token id {bad} is outside the vocabulary of {vocab}")));
    }
    out.f32("embedding out", n * hidden)?;
    let name = match dtype {
        WeightDType::F32 => "embedding_f32",
        WeightDType::BF16 => "embedding_bf16",
        WeightDType::F16 => "embedding_f16",
    };
    b.kernels
        .launch(name)?
        .buf(table)
        .buf(ids)
        .buf(out)
        .u32(hidden)
        .run(&b.queue, [round_up(hidden, ELEM_WG), n, 1], [ELEM_WG, 1, 1])
}

/// RMSNorm; with `residual`, the fused `residual += x; out = norm(residual)`.
#[allow(clippy::too_many_arguments)]
pub(super) fn rms_norm(
    b: &OpenClBackend,
    x: &ClBuffer,
    residual: Option<&ClBuffer>,
    w: &ClBuffer,
    out: &ClBuffer,
    rows: usize,
    hidden: usize,
    eps: f32,
) -> Result<()> {
    x.f32("rms_norm x", rows * hidden)?;
    w.f32("rms_norm weight", hidden)?;
    out.f32("rms_norm out", rows * hidden)?;
    let launch = match residual {
        Some(r) => {
            r.f32("rms_norm residual", rows * hidden)?;
            b.kernels.launch("add_rms_norm")?.buf(x).buf(r)
        }
        None => b.kernels.launch("rms_norm")?.buf(x),
    };
    let wg = work_group("rms_norm");
    launch.buf(w).buf(out).u32(hidden).f32(eps).run(&b.queue, [rows * wg, 1, 1], [wg, 1, 1])
}

#[allow(clippy::too_many_arguments)]
pub(super) fn matmul(
    b: &OpenClBackend,
    x: &ClBuffer,
    w: &ClBuffer,
    bias: Option<&ClBuffer>,
    out: &ClBuffer,
    m: usize,
    k: usize,
    n: usize,
) -> Result<()> {
    let (dtype, rows, cols) = w.matrix("matmul weight")?;
    if (rows, cols) != (n, k) {
        return Err(be(format!("matmul weight is [{rows}, {cols}], op expects [{n}, {k}]")));
    }
    x.f32("matmul x", m * k)?;
    out.f32("matmul out", m * n)?;
    if let Some(bias) = bias {
        bias.f32("matmul bias", n)?;
    }
    let (name, global, local) = if b.work_item_matmul() {
        let name = match dtype {
            WeightDType::F32 => "matmul_wi_f32",
            WeightDType::BF16 => "matmul_wi_bf16",
            WeightDType::F16 => "matmul_wi_f16",
        };
        (name, [round_up(n, ELEM_WG), m.div_ceil(GEMV_WI_ROWS), 1], [ELEM_WG, 1, 1])
    } else if m <= GEMV_ROWS && k % 8 == 0 && dtype != WeightDType::F32 {
        let name = if dtype == WeightDType::BF16 { "matmul_vec_bf16" } else { "matmul_vec_f16" };
        (name, [n.div_ceil(GEMV_VEC_COLS) * GEMV_VEC_WG, 1, 1], [GEMV_VEC_WG, 1, 1])
    } else if m <= GEMV_MAX_ROWS {
        let name = match dtype {
            WeightDType::F32 => "matmul_rows_f32",
            WeightDType::BF16 => "matmul_rows_bf16",
            WeightDType::F16 => "matmul_rows_f16",
        };
        (name, [n.div_ceil(GEMV_COLS) * GEMV_WG, m.div_ceil(GEMV_ROWS), 1], [GEMV_WG, 1, 1])
    } else {
        let name = match dtype {
            WeightDType::F32 => "matmul_tiled_f32",
            WeightDType::BF16 => "matmul_tiled_bf16",
            WeightDType::F16 => "matmul_tiled_f16",
        };
        (name, [n.div_ceil(GEMM_TILE_N) * GEMM_WG, m.div_ceil(GEMM_TILE_M), 1], [GEMM_WG, 1, 1])
    };
    b.kernels
        .launch(name)?
        .buf(x)
        .buf(w)
        .buf(bias.unwrap_or(x)) // never read without a bias
        .buf(out)
        .u32(m)
        .u32(k)
        .u32(n)
        .u32(bias.is_some() as usize)
        .run(&b.queue, global, local)
}

/// Heads of a fused q/k/v row.
pub(super) struct QkvShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// `Op::RopeWriteKv`.
#[allow(clippy::too_many_arguments)]
pub(super) fn rope_write_kv(
    b: &OpenClBackend,
    qkv: &ClBuffer,
    positions: &ClBuffer,
    inv_freq: &ClBuffer,
    q_out: &ClBuffer,
    k_cache: &ClBuffer,
    v_cache: &ClBuffer,
    slots: &ClBuffer,
    n: usize,
    s: &QkvShape,
) -> Result<()> {
    let (hd, kv_w) = (s.head_dim, s.kv_heads * s.head_dim);
    let heads = s.heads + 2 * s.kv_heads;
    qkv.f32("rope_write_kv qkv", n * heads * hd)?;
    q_out.f32("rope_write_kv q_out", n * s.heads * hd)?;
    positions.u32("rope_write_kv positions", n)?;
    inv_freq.f32("rope_write_kv inv_freq", hd / 2)?;
    let cache_len = k_cache.f32_len().zip(v_cache.f32_len()).map(|(a, b)| a.min(b));
    let cache_len = cache_len.ok_or_else(|| be("rope_write_kv: the caches must be f32 buffers"))?;
    for &slot in &slots.u32("rope_write_kv slot mapping", n)?[..n] {
        if (slot as usize + 1) * kv_w > cache_len {
            return Err(be(format!("rope_write_kv: slot {slot} outside the cache")));
        }
    }
    let total = n * heads * (hd / 2);
    b.kernels
        .launch("rope_write_kv")?
        .buf(qkv)
        .buf(positions)
        .buf(inv_freq)
        .buf(q_out)
        .buf(k_cache)
        .buf(v_cache)
        .buf(slots)
        .u32(n)
        .u32(s.heads)
        .u32(s.kv_heads)
        .u32(hd)
        .run(&b.queue, [round_up(total, ELEM_WG), 1, 1], [ELEM_WG, 1, 1])
}

/// `Op::SiluMul` over the fused gate/up rows.
pub(super) fn silu_mul(b: &OpenClBackend, gate_up: &ClBuffer, out: &ClBuffer, rows: usize, width: usize) -> Result<()> {
    gate_up.f32("silu gate_up", rows * 2 * width)?;
    out.f32("silu out", rows * width)?;
    b.kernels
        .launch("silu_mul")?
        .buf(gate_up)
        .buf(out)
        .u32(width)
        .run(&b.queue, [round_up(width, ELEM_WG), rows, 1], [ELEM_WG, 1, 1])
}

pub(super) fn gather_rows(b: &OpenClBackend, x: &ClBuffer, rows: &ClBuffer, out: &ClBuffer, num_rows: usize, width: usize) -> Result<()> {
    let x_len = x.f32_len().ok_or_else(|| be("gather x: expected an f32 buffer"))?;
    for &r in &rows.u32("gather rows", num_rows)?[..num_rows] {
        if (r as usize + 1) * width > x_len {
            return Err(be(format!("gather x: row {r} is outside a buffer of {x_len} values")));
        }
    }
    out.f32("gather out", num_rows * width)?;
    b.kernels
        .launch("gather_rows")?
        .buf(x)
        .buf(rows)
        .buf(out)
        .u32(width)
        .run(&b.queue, [round_up(width, ELEM_WG), num_rows, 1], [ELEM_WG, 1, 1])
}
