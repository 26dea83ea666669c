//! `Op::MatMul` (`kernels/src/cl/matmul.cl`): which family multiplies (`KernelTuning::matmul`), and within the
//! portable families which kernel by row count: `matmul_vec_*` (16-bit weights, k a multiple of 8) or
//! `matmul_rows_*` for decode-sized rows, `matmul_tiled_*` above, `matmul_wi_*` on CPU devices; bf16 weights on the
//! matrix engine (`matmul_xmx_bf16`, Level Zero on PVC) above decode-sized rows. One row of 16-bit activations under
//! programmatic dependent launch takes the asynchronous-copy GEMV `matmul_pdla_*` first.

use rserve_kernels::launch::{
    GEMM_TILE_M, GEMM_TILE_N, GEMV_COLS, GEMV_ROWS, GEMV_VEC_COLS, GEMV_WI_ROWS, XMX_TILE_M, XMX_TILE_N, XMX_WG,
};
use rserve_kernels::{names, ElemType};

use super::contents::{elem_type, Contents};
use super::tuning::MatmulPath;
use super::{u32_arg, Arg, KernelDevice, Launch};
use crate::cpu::be;
use crate::error::Result;
use crate::WeightDType;

/// Above this many rows the tiled matmul replaces the row-streaming one.
pub const GEMV_MAX_ROWS: usize = 2 * GEMV_ROWS;

/// The sub-group size `xmx.cl` requires.
const XMX_SUB_GROUP: usize = 16;

/// The matrix-engine kernel for this path, weight type and shape, if it takes the call: bf16 weights with k a
/// multiple of 16 (each lane loads 16 weights), above `GEMV_ROWS` rows on the hardware (decode rows stay on the
/// bandwidth-bound GEMVs), at every row count emulated (so the op tests reach its row masking at m = 1).
pub fn xmx_kernel(path: MatmulPath, ty: ElemType, m: usize, k: usize) -> Option<&'static str> {
    if ty != ElemType::Bf16 || !k.is_multiple_of(16) {
        return None;
    }
    match path {
        MatmulPath::Xmx if m > GEMV_ROWS => Some(names::MATMUL_XMX),
        MatmulPath::XmxEmulated => Some(names::MATMUL_XMX_EMU),
        _ => None,
    }
}

/// One `Op::MatMul`: `out[m, n] = x[m, k] . w[n, k]^T (+ bias[n])`.
pub struct MatMulCall<'a, B> {
    pub x: &'a B,
    pub w: &'a B,
    pub bias: Option<&'a B>,
    pub out: &'a B,
    pub m: usize,
    pub k: usize,
    pub n: usize,
}

impl<B> MatMulCall<'_, B> {
    /// The standard argument list of the matmul kernels: x, w, bias, out, m, k, n, has_bias.
    pub fn args(&self, kernel: &str) -> Result<Vec<Arg<'_, B>>> {
        Ok(vec![
            Arg::Buf(self.x),
            Arg::Buf(self.w),
            Arg::Buf(self.bias.unwrap_or(self.out)), // never read without a bias
            Arg::Buf(self.out),
            u32_arg(self.m, kernel, "m")?,
            u32_arg(self.k, kernel, "k")?,
            u32_arg(self.n, kernel, "n")?,
            Arg::U32(self.bias.is_some() as u32),
        ])
    }
}

/// Checks the operands; returns the weight's dtype and whether the activations are 16-bit (in the weight's type).
pub fn check<D: KernelDevice>(d: &D, c: &MatMulCall<'_, D::Buf>) -> Result<(WeightDType, bool)> {
    let (dtype, rows, cols) = d.contents(c.w).matrix("matmul weight")?;
    if (rows, cols) != (c.n, c.k) {
        return Err(be(format!("matmul weight is [{rows}, {cols}], op expects [{}, {}]", c.n, c.k)));
    }
    let x16 = match d.contents(c.x) {
        Contents::Half { dtype: xd, len } if *xd == dtype && *len >= c.m * c.k => true,
        Contents::Half { .. } => {
            return Err(be(format!(
                "matmul x: 16-bit activations must match the weight ({dtype:?}) and hold {}",
                c.m * c.k
            )))
        }
        other => {
            other.f32("matmul x", c.m * c.k)?;
            false
        }
    };
    d.contents(c.out).f32("matmul out", c.m * c.n)?;
    if let Some(bias) = c.bias {
        d.contents(bias).f32("matmul bias", c.n)?;
    }
    Ok((dtype, x16))
}

pub(super) fn matmul<D: KernelDevice>(d: &D, c: &MatMulCall<'_, D::Buf>) -> Result<()> {
    let (dtype, x16) = check(d, c)?;
    let t = d.tuning();
    let ty = elem_type(dtype);
    let (m, k, n) = (c.m, c.k, c.n);
    if x16 && t.pdl && m <= t.async_gemv_rows && k % 8 == 0 {
        // Weights stream into local memory while the kernel before drains; two weight rows per 32-lane warp.
        let kernel = ty.pick(&names::MATMUL_PDLA);
        let rows_per_group = rserve_kernels::work_group(kernel) / 32 * 2;
        return d.launch(&Launch::groups(kernel, c.args(kernel)?, n.div_ceil(rows_per_group), [1, 1]));
    }
    if t.matmul == MatmulPath::Vendor {
        return d.vendor_matmul(c);
    }
    // 16-bit activations (the weight's type): the same kernels with 16-bit loads (never the XMX one: a backend that
    // takes it keeps f32 activations, `Backend::alloc_matmul_input`).
    let x16_tables = [&names::MATMUL_WI_X16, &names::MATMUL_VEC_X16, &names::MATMUL_ROWS_X16, &names::MATMUL_TILED_X16];
    let f32_tables = [&names::MATMUL_WI, &names::MATMUL_VEC, &names::MATMUL_ROWS, &names::MATMUL_TILED];
    let [wi, vec, rows, tiled] = if x16 { x16_tables } else { f32_tables };
    if x16 && ty == ElemType::F32 {
        return Err(be("matmul x: 16-bit activations with f32 weights"));
    }
    if let Some(kernel) = xmx_kernel(t.matmul, ty, m, k).filter(|_| !x16) {
        let cols_per_group = XMX_TILE_N * XMX_WG / XMX_SUB_GROUP;
        return d.launch(&Launch::groups(
            kernel,
            c.args(kernel)?,
            n.div_ceil(cols_per_group),
            [m.div_ceil(XMX_TILE_M), 1],
        ));
    }
    let (kernel, groups, row_blocks) = if t.matmul == MatmulPath::WorkItem {
        let kernel = ty.pick(wi);
        (kernel, n.div_ceil(rserve_kernels::work_group(kernel)), m.div_ceil(GEMV_WI_ROWS))
    } else if m <= GEMV_ROWS && k % 8 == 0 && ty != ElemType::F32 {
        (ty.pick(vec), n.div_ceil(GEMV_VEC_COLS), 1)
    } else if m <= GEMV_MAX_ROWS {
        (ty.pick(rows), n.div_ceil(GEMV_COLS), m.div_ceil(GEMV_ROWS))
    } else {
        (ty.pick(tiled), n.div_ceil(GEMM_TILE_N), m.div_ceil(GEMM_TILE_M))
    };
    d.launch(&Launch::groups(kernel, c.args(kernel)?, groups, [row_blocks, 1]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xmx_takes_bf16_weights_with_k_a_multiple_of_16() {
        let hw = MatmulPath::Xmx;
        assert_eq!(xmx_kernel(hw, ElemType::Bf16, 512, 4096), Some(names::MATMUL_XMX));
        assert_eq!(xmx_kernel(hw, ElemType::Bf16, GEMV_ROWS + 1, 64), Some(names::MATMUL_XMX));
        // Decode-sized rows stay on the GEMVs; other weight types and ragged k never take it.
        assert_eq!(xmx_kernel(hw, ElemType::Bf16, GEMV_ROWS, 4096), None);
        assert_eq!(xmx_kernel(hw, ElemType::F16, 512, 4096), None);
        assert_eq!(xmx_kernel(hw, ElemType::Bf16, 512, 4104), None);
        // The emulated form at every row count; other paths never.
        assert_eq!(xmx_kernel(MatmulPath::XmxEmulated, ElemType::Bf16, 1, 64), Some(names::MATMUL_XMX_EMU));
        assert_eq!(xmx_kernel(MatmulPath::SubGroup, ElemType::Bf16, 512, 4096), None);
    }
}
