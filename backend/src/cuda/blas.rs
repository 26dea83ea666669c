//! The CUDA backend's matrix multiply on cuBLAS (`cublasGemmEx`, f32 accumulation): the op layer's
//! `vendor_matmul` hook. 16-bit activations (written by their producer in the weight's type) go straight in; f32
//! activations with 16-bit weights are rounded to the weight's type first (`f32_to_bf16` / `f32_to_f16`); a bias is
//! added by `add_bias`.

use cudarc::cublas::{result as blas, sys as bsys};
use rserve_kernels::launch::ELEM_WG;

use super::buffer::{Contents, CuBuffer};
use super::{host, CudaBackend};
use crate::cpu::be;
use crate::error::Result;
use crate::kernels::{matmul_check, u32_arg, Arg, KernelDevice, Launch, MatMulCall};
use crate::WeightDType;

pub(super) fn gemm(b: &CudaBackend, c: &MatMulCall<'_, CuBuffer>) -> Result<()> {
    let (dtype, x16) = matmul_check(b, c)?;
    let (m, k, n) = (c.m, c.k, c.n);
    let half = |d: WeightDType| {
        if d == WeightDType::BF16 {
            ("f32_to_bf16", bsys::cudaDataType::CUDA_R_16BF)
        } else {
            ("f32_to_f16", bsys::cudaDataType::CUDA_R_16F)
        }
    };
    let (a_type, b_ptr, _scratch) = match dtype {
        WeightDType::F32 => (bsys::cudaDataType::CUDA_R_32F, c.x.ptr(), None),
        d if x16 => (half(d).1, c.x.ptr(), None),
        d => {
            let (kernel, t) = half(d);
            let xs = CuBuffer::new(&b.pool, m * k * 2, Contents::Raw)?;
            let args = vec![Arg::Buf(c.x), Arg::Buf(&xs), u32_arg(m * k, kernel, "len")?];
            b.launch(&Launch { kernel, args, global: [(m * k).div_ceil(ELEM_WG) * ELEM_WG, 1, 1], local: ELEM_WG })?;
            (t, xs.ptr(), Some(xs))
        }
    };
    let (cm, cn, ck, lda, ldb, ldc) = host::gemm_shape(m, k, n)?;
    let (alpha, beta) = (1.0f32, 0.0f32);
    // SAFETY: w is [n, k] in `a_type`, the (converted) activations [m, k] in the same type, out [m, n] f32 (all
    // checked above); alpha/beta are host scalars (the handle's default pointer mode); the handle runs on the
    // backend's stream, so the scratch buffer outlives its use (it returns to the pool, ordered on that stream).
    unsafe {
        blas::gemm_ex(
            b.blas,
            bsys::cublasOperation_t::CUBLAS_OP_T,
            bsys::cublasOperation_t::CUBLAS_OP_N,
            cm,
            cn,
            ck,
            &alpha as *const f32 as *const _,
            c.w.ptr() as *const _,
            a_type,
            lda,
            b_ptr as *const _,
            a_type,
            ldb,
            &beta as *const f32 as *const _,
            c.out.ptr() as *mut _,
            bsys::cudaDataType::CUDA_R_32F,
            ldc,
            bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            bsys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(|e| be(format!("cuda: cublasGemmEx [{m}x{k}] x [{n}x{k}]^T: {e:?}")))?;
    if let Some(bias) = c.bias {
        let kernel = "add_bias";
        let args = vec![Arg::Buf(c.out), Arg::Buf(bias), u32_arg(n, kernel, "n")?];
        b.launch(&Launch { kernel, args, global: [n.div_ceil(ELEM_WG) * ELEM_WG, m, 1], local: ELEM_WG })?;
    }
    Ok(())
}
