//! CPU matrix multiply `out = x . w^T (+ bias)`: the skinny path (`gemv`) for decode-sized batches, candle's GEMM
//! in the weight's dtype for prefill-sized ones; f32 results either way.

use candle_core::{DType, Device, Storage, Tensor};
use half::{bf16, f16};

use super::gemv::{self, WeightRows};

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
    if m <= gemv::MAX_ROWS && w.is_contiguous() {
        let (storage, layout) = w.storage_and_layout();
        let Storage::Cpu(cpu) = &*storage else { return Err(be("weight is not in host memory")) };
        let off = layout.start_offset();
        let rows = match w.dtype() {
            DType::F32 => WeightRows::F32(&cpu.as_slice::<f32>()?[off..off + n * k]),
            DType::BF16 => WeightRows::BF16(&cpu.as_slice::<bf16>()?[off..off + n * k]),
            DType::F16 => WeightRows::F16(&cpu.as_slice::<f16>()?[off..off + n * k]),
            other => return Err(be(format!("unsupported weight dtype {other:?}"))),
        };
        gemv::gemv(&x[..m * k], rows, &mut out[..m * n], m, k, n);
    } else {
        let xt = Tensor::from_slice(&x[..m * k], (m, k), &Device::Cpu)?;
        let xt = if w.dtype() == DType::F32 { xt } else { xt.to_dtype(w.dtype())? };
        let y = xt.matmul(&w.t()?)?.to_dtype(DType::F32)?;
        let y = y.flatten_all()?.to_vec1::<f32>()?;
        out[..m * n].copy_from_slice(&y);
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
