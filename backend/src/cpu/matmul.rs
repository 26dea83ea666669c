//! CPU matrix multiply `out = x . w^T (+ bias)`, f32 results. A weight is one matrix or a fused projection's parts
//! stacked by rows (`CpuBuffer::Parts`: each part fills its own columns of `out`, so the parts are never copied into
//! one matrix). 16-bit weights go through `matmul16` for every batch size; f32 weights through the skinny path
//! (`gemv`) for decode-sized batches and candle's GEMM for prefill-sized ones.

use candle_core::{DType, Device, Storage, Tensor};
use half::{bf16, f16};

use super::gemv::{self, WeightRows};
use super::matmul16::{self, OutCols, Weights16};

use super::be;
use crate::error::Result;

/// `out = x . w^T (+ bias)` with one weight matrix `w` `[n, k]`.
pub(super) fn matmul(
    x: &[f32],
    w: &Tensor,
    bias: Option<&[f32]>,
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
) -> Result<()> {
    matmul_parts(x, std::slice::from_ref(w), bias, out, m, k, n)
}

/// `out = x . w^T (+ bias)` with `w` given as row blocks (`[n_i, k]`, summing to `n` rows).
pub(super) fn matmul_parts(
    x: &[f32],
    parts: &[Tensor],
    bias: Option<&[f32]>,
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
) -> Result<()> {
    let rows: usize = parts.iter().map(|w| w.dims().first().copied().unwrap_or(0)).sum();
    if rows != n || parts.iter().any(|w| w.rank() != 2 || w.dims()[1] != k) {
        let dims: Vec<_> = parts.iter().map(|w| w.dims().to_vec()).collect();
        return Err(be(format!("matmul weight is {dims:?}, op expects [{n}, {k}]")));
    }
    if x.len() < m * k || out.len() < m * n {
        return Err(be(format!("matmul buffers too small for [{m}, {k}] x [{k}, {n}]")));
    }
    let mut col0 = 0;
    for w in parts {
        let np = w.dims()[0];
        part(&x[..m * k], w, &mut out[..m * n], m, k, (np, n, col0))?;
        col0 += np;
    }
    if let Some(b) = bias {
        if b.len() < n {
            return Err(be(format!("bias has {} values, expected {n}", b.len())));
        }
        for row in out[..m * n].chunks_mut(n) {
            row.iter_mut().zip(b).for_each(|(o, b)| *o += b);
        }
    }
    Ok(())
}

/// One part `w` (`[np, k]`) into columns `col0..col0 + np` of `out` (rows of `ldo` values).
fn part(
    x: &[f32],
    w: &Tensor,
    out: &mut [f32],
    m: usize,
    k: usize,
    (np, ldo, col0): (usize, usize, usize),
) -> Result<()> {
    let w = if w.is_contiguous() { w.clone() } else { w.contiguous()? };
    let (storage, layout) = w.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else { return Err(be("weight is not in host memory")) };
    let off = layout.start_offset();
    let w16 = match w.dtype() {
        DType::BF16 => Some(Weights16::Bf16(&bytemuck::cast_slice(cpu.as_slice::<bf16>()?)[off..off + np * k])),
        DType::F16 => Some(Weights16::F16(&bytemuck::cast_slice(cpu.as_slice::<f16>()?)[off..off + np * k])),
        DType::F32 => None,
        other => return Err(be(format!("unsupported weight dtype {other:?}"))),
    };
    if let Some(w16) = w16 {
        matmul16::matmul16(x, w16, OutCols { out: &mut *out, ldo, col0 }, m, k, np);
        return Ok(());
    }
    // f32 weights: into a dense [m, np] result, then into the part's columns when it is not the whole output.
    let whole = np == ldo;
    let mut tmp = if whole { Vec::new() } else { vec![0f32; m * np] };
    let y: &mut [f32] = if whole { &mut out[..m * np] } else { &mut tmp };
    if m <= gemv::MAX_ROWS {
        let rows = WeightRows::F32(&cpu.as_slice::<f32>()?[off..off + np * k]);
        gemv::gemv(x, rows, y, m, k, np);
    } else {
        let xt = Tensor::from_slice(x, (m, k), &Device::Cpu)?;
        let r = xt.matmul(&w.t()?)?.flatten_all()?.to_vec1::<f32>()?;
        y.copy_from_slice(&r);
    }
    if !whole {
        for (i, row) in tmp.chunks(np).enumerate() {
            out[i * ldo + col0..i * ldo + col0 + np].copy_from_slice(row);
        }
    }
    Ok(())
}
