//! CPU matrix multiply `out = x . w^T (+ bias)` through candle's GEMM, in the weight's dtype with f32 results.

use candle_core::{DType, Device, Tensor};

use super::be;
use crate::error::Result;

pub(super) fn matmul(
    x: &[f32],
    w: &Tensor,
    bias: Option<&[f32]>,
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
) -> Result<()> {
    if w.dims() != [n, k] {
        return Err(be(format!("matmul weight is {:?}, op expects [{n}, {k}]", w.dims())));
    }
    if x.len() < m * k || out.len() < m * n {
        return Err(be(format!("matmul buffers too small for [{m}, {k}] x [{k}, {n}]")));
    }
    let xt = Tensor::from_slice(&x[..m * k], (m, k), &Device::Cpu)?;
    let xt = if w.dtype() == DType::F32 { xt } else { xt.to_dtype(w.dtype())? };
    let y = xt.matmul(&w.t()?)?.to_dtype(DType::F32)?;
    let y = y.flatten_all()?.to_vec1::<f32>()?;
    out[..m * n].copy_from_slice(&y);
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
