//! CUDA launches of the row-wise and elementwise ops (the portable kernels of `kernels/src/cl/{embedding,norm,rope,
//! elementwise,kv_cache}.cl`, same grids and argument orders as the OpenCL backend) and the matrix multiply on
//! cuBLAS (`cublasGemmEx`, f32 accumulation; activations rounded to the weight's 16-bit type first), or for
//! decode-sized row counts a GEMV: the prefetching `matmul_pdl2r_*` / `matmul_pdl_*` (one row of 16-bit
//! activations by default, with programmatic dependent launch; `PdlGemv`) or the portable wide GEMV
//! (`matmul_wide_*`, f32 activations, opt-in: `RSERVE_CUDA_GEMV_ROWS`). Every buffer and index is checked on the
//! host before a launch.

use rserve_kernels::launch::*;

use super::buffer::{Contents, CuBuffer};
use super::kernels::round_up;
use super::{host, work_group};
use cudarc::cublas::{result as blas, sys as bsys};
use super::CudaBackend;
use crate::backend::cpu::be;
use crate::backend::WeightDType;
use crate::error::Result;


pub(super) fn embedding(b: &CudaBackend, table: &CuBuffer, ids: &CuBuffer, out: &CuBuffer, n: usize, hidden: usize) -> Result<()> {
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
        .run(&b.stream, [round_up(hidden, ELEM_WG), n, 1], [ELEM_WG, 1, 1])
}

/// RMSNorm; with `residual`, the fused `residual += x; out = norm(residual)`.
#[allow(clippy::too_many_arguments)]
pub(super) fn rms_norm(
    b: &CudaBackend,
    x: &CuBuffer,
    residual: Option<&CuBuffer>,
    w: &CuBuffer,
    out: &CuBuffer,
    rows: usize,
    hidden: usize,
    eps: f32,
) -> Result<()> {
    x.f32("rms_norm x", rows * hidden)?;
    w.f32("rms_norm weight", hidden)?;
    let kind = out.act_out("rms_norm out", rows * hidden)? as usize;
    let launch = match residual {
        Some(r) => {
            r.f32("rms_norm residual", rows * hidden)?;
            b.kernels.launch(["add_rms_norm", "add_rms_norm_bf16", "add_rms_norm_f16"][kind])?.buf(x).buf(r)
        }
        None => b.kernels.launch(["rms_norm", "rms_norm_bf16", "rms_norm_f16"][kind])?.buf(x),
    };
    let wg = work_group("rms_norm");
    launch.buf(w).buf(out).u32(hidden).f32(eps).run(&b.stream, [rows * wg, 1, 1], [wg, 1, 1])
}

#[allow(clippy::too_many_arguments)]
pub(super) fn matmul(
    b: &CudaBackend,
    x: &CuBuffer,
    w: &CuBuffer,
    bias: Option<&CuBuffer>,
    out: &CuBuffer,
    m: usize,
    k: usize,
    n: usize,
) -> Result<()> {
    let (dtype, rows, cols) = w.matrix("matmul weight")?;
    if (rows, cols) != (n, k) {
        return Err(be(format!("matmul weight is [{rows}, {cols}], op expects [{n}, {k}]")));
    }
    // The activations: f32, or already in the weight's 16-bit type (`alloc_matmul_input`).
    let x16 = match x.contents {
        Contents::Half { dtype: xd, len } if xd == dtype && len >= m * k => true,
        Contents::Half { .. } => return Err(be(format!("matmul x: 16-bit activations must match the weight ({dtype:?}) and hold {}", m * k))),
        _ => {
            x.f32("matmul x", m * k)?;
            false
        }
    };
    out.f32("matmul out", m * n)?;
    if let Some(bias) = bias {
        bias.f32("matmul bias", n)?;
    }
    if !x16 && m <= b.gemv_max_rows() && k % 8 == 0 && dtype != WeightDType::F32 {
        // Decode-sized: the portable wide GEMV streams each weight row once with 16-byte loads and reads the f32
        // activations directly (no rounding to 16 bits, no conversion launch); two weight rows per 32-lane warp.
        let name = if dtype == WeightDType::BF16 { "matmul_wide_bf16" } else { "matmul_wide_f16" };
        return launch_gemv(b, name, x, w, bias, out, [m, k, n], GEMV_VEC_WG, 2, m.div_ceil(GEMV_ROWS));
    }
    let pdl = if x16 && m <= b.pdl_gemv_rows() && k % 8 == 0 && b.kernels.pdl() { b.pdl_gemv().pick() } else { None };
    if let Some((names, wg, rows_per_warp)) = pdl {
        // Decode-sized with 16-bit activations under programmatic dependent launch: the prefetching GEMV starts
        // streaming its weights while the kernel before it drains (cuBLAS' kernels wait for it to finish).
        let name = names[(dtype == WeightDType::F16) as usize];
        return launch_gemv(b, name, x, w, bias, out, [m, k, n], wg, rows_per_warp, 1);
    }
    let (a_type, b_ptr, _scratch) = match dtype {
        WeightDType::F32 => (bsys::cudaDataType::CUDA_R_32F, x.ptr(), None),
        WeightDType::BF16 if x16 => (bsys::cudaDataType::CUDA_R_16BF, x.ptr(), None),
        WeightDType::F16 if x16 => (bsys::cudaDataType::CUDA_R_16F, x.ptr(), None),
        WeightDType::BF16 | WeightDType::F16 => {
            let (kernel, t) = if dtype == WeightDType::BF16 {
                ("f32_to_bf16", bsys::cudaDataType::CUDA_R_16BF)
            } else {
                ("f32_to_f16", bsys::cudaDataType::CUDA_R_16F)
            };
            let xs = CuBuffer::new(&b.pool, m * k * 2, Contents::Raw)?;
            b.kernels
                .launch(kernel)?
                .buf(x)
                .buf(&xs)
                .u32(m * k)
                .run(&b.stream, [round_up(m * k, ELEM_WG), 1, 1], [ELEM_WG, 1, 1])?;
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
            w.ptr() as *const _,
            a_type,
            lda,
            b_ptr as *const _,
            a_type,
            ldb,
            &beta as *const f32 as *const _,
            out.ptr() as *mut _,
            bsys::cudaDataType::CUDA_R_32F,
            ldc,
            bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            bsys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(|e| be(format!("cuda: cublasGemmEx [{m}x{k}] x [{n}x{k}]^T: {e:?}")))?;
    if let Some(bias) = bias {
        b.kernels
            .launch("add_bias")?
            .buf(out)
            .buf(bias)
            .u32(n)
            .run(&b.stream, [round_up(n, ELEM_WG), m, 1], [ELEM_WG, 1, 1])?;
    }
    Ok(())
}

/// A GEMV launch (`matmul_wide_*`, `matmul_pdl*`: x, w, bias, out, m, k, n, has_bias) in work-groups of `wg`
/// work-items, each 32-lane warp covering `rows_per_warp` weight rows, times `row_blocks` blocks of input rows.
#[allow(clippy::too_many_arguments)]
fn launch_gemv(
    b: &CudaBackend,
    name: &'static str,
    x: &CuBuffer,
    w: &CuBuffer,
    bias: Option<&CuBuffer>,
    out: &CuBuffer,
    [m, k, n]: [usize; 3],
    wg: usize,
    rows_per_warp: usize,
    row_blocks: usize,
) -> Result<()> {
    let rows_per_group = wg / 32 * rows_per_warp;
    b.kernels
        .launch(name)?
        .buf(x)
        .buf(w)
        .buf(bias.unwrap_or(out)) // never read without a bias
        .buf(out)
        .u32(m)
        .u32(k)
        .u32(n)
        .u32(bias.is_some() as usize)
        .run(&b.stream, [n.div_ceil(rows_per_group) * wg, row_blocks, 1], [wg, 1, 1])
}

/// Which prefetching GEMV decode steps of 16-bit activations take (only where kernels are launched with
/// programmatic dependent launch, its point): `RSERVE_CUDA_PDL_GEMV` = `a` (default: `matmul_pdla_*`, two rows per
/// warp through asynchronous copies into local memory), `2r` (`matmul_pdl2r_*`, two rows per warp in registers),
/// `4` (`matmul_pdl_*`, one row per warp) or `0` (cuBLAS). On an H200, batch-1 decode steps took 4.70-4.72 ms with
/// `a` against 4.75-4.77 with `2r` (one process, 300 steps from context 256), and earlier 4.86 with `4` and 5.00 on
/// cuBLAS (BENCHMARKS.md).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PdlGemv {
    Off,
    OneRow,
    TwoRows,
    Async,
}

impl PdlGemv {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "0" => Self::Off,
            "4" => Self::OneRow,
            "1" | "2r" => Self::TwoRows,
            "a" => Self::Async,
            _ => return None,
        })
    }

    /// From `RSERVE_CUDA_PDL_GEMV` (unset or unknown: the default).
    pub fn from_env() -> Self {
        std::env::var("RSERVE_CUDA_PDL_GEMV").ok().and_then(|v| Self::parse(&v)).unwrap_or(Self::Async)
    }

    /// The entry points (bf16, f16), work-group size and weight rows per warp; None: cuBLAS.
    fn pick(self) -> Option<([&'static str; 2], usize, usize)> {
        match self {
            Self::Off => None,
            Self::OneRow => Some((["matmul_pdl_bf16", "matmul_pdl_f16"], GEMV_VEC_WG, 1)),
            Self::TwoRows => Some((["matmul_pdl2r_bf16", "matmul_pdl2r_f16"], GEMV_VEC_WG, 2)),
            Self::Async => Some((["matmul_pdla_bf16", "matmul_pdla_f16"], GEMV_ASYNC_WG, 2)),
        }
    }
}

/// Most rows a decode matmul may have to take the prefetching GEMV: 1, unless `RSERVE_CUDA_PDL_GEMV_ROWS` says
/// otherwise (at most GEMV_PDL_ROWS). On an H200 a 4-row decode step took 8.3 ms with it against 5.5 ms for 16
/// rows on cuBLAS: each warp reads the activations of every row, which at a few rows costs more than cuBLAS.
pub fn pdl_gemv_rows_from_env() -> usize {
    std::env::var("RSERVE_CUDA_PDL_GEMV_ROWS").ok().and_then(|v| v.parse().ok()).unwrap_or(1).min(GEMV_PDL_ROWS)
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
    b: &CudaBackend,
    qkv: &CuBuffer,
    positions: &CuBuffer,
    inv_freq: &CuBuffer,
    q_out: &CuBuffer,
    k_cache: &CuBuffer,
    v_cache: &CuBuffer,
    slots: &CuBuffer,
    n: usize,
    s: &QkvShape,
) -> Result<()> {
    let (hd, kv_w) = (s.head_dim, s.kv_heads * s.head_dim);
    let heads = s.heads + 2 * s.kv_heads;
    qkv.f32("rope_write_kv qkv", n * heads * hd)?;
    q_out.f32("rope_write_kv q_out", n * s.heads * hd)?;
    positions.u32("rope_write_kv positions", n)?;
    inv_freq.f32("rope_write_kv inv_freq", hd / 2)?;
    let (cache_len, kind) = kv_pair(k_cache, v_cache, "rope_write_kv")?;
    for &slot in &slots.u32("rope_write_kv slot mapping", n)?[..n] {
        if (slot as usize + 1) * kv_w > cache_len {
            return Err(be(format!("rope_write_kv: slot {slot} outside the cache")));
        }
    }
    let total = n * heads * (hd / 2);
    b.kernels
        .launch(["rope_write_kv", "rope_write_kv_bf16", "rope_write_kv_f16"][kind as usize])?
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
        .run(&b.stream, [round_up(total, ELEM_WG), 1, 1], [ELEM_WG, 1, 1])
}

/// The length (values) and kind (0 f32, 1 bf16, 2 f16) of a layer's K and V caches, which must agree.
pub(super) fn kv_pair(k: &CuBuffer, v: &CuBuffer, what: &str) -> Result<(usize, u32)> {
    match (k.kv(), v.kv()) {
        (Some((kl, kk)), Some((vl, vk))) if kk == vk => Ok((kl.min(vl), kk)),
        _ => Err(be(format!("{what}: the K and V caches must be KV-cache buffers of one type"))),
    }
}

/// `Op::SiluMul` over the fused gate/up rows.
pub(super) fn silu_mul(b: &CudaBackend, gate_up: &CuBuffer, out: &CuBuffer, rows: usize, width: usize) -> Result<()> {
    gate_up.f32("silu gate_up", rows * 2 * width)?;
    let kind = out.act_out("silu out", rows * width)? as usize;
    b.kernels
        .launch(["silu_mul", "silu_mul_bf16", "silu_mul_f16"][kind])?
        .buf(gate_up)
        .buf(out)
        .u32(width)
        .run(&b.stream, [round_up(width, ELEM_WG), rows, 1], [ELEM_WG, 1, 1])
}

pub(super) fn gather_rows(b: &CudaBackend, x: &CuBuffer, rows: &CuBuffer, out: &CuBuffer, num_rows: usize, width: usize) -> Result<()> {
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
        .run(&b.stream, [round_up(width, ELEM_WG), num_rows, 1], [ELEM_WG, 1, 1])
}

#[cfg(test)]
mod tests {
    use super::PdlGemv;
    use rserve_kernels::launch::{GEMV_ASYNC_STAGES, GEMV_ASYNC_WG, GEMV_VEC_WG};

    #[test]
    fn every_gemv_variant_launches_real_entry_points_in_whole_warps() {
        let matmul = rserve_kernels::KERNELS.iter().find(|(m, _)| *m == "matmul").expect("matmul module").1;
        for name in ["a", "2r", "1", "4"] {
            let (names, wg, rows_per_warp) = PdlGemv::parse(name).and_then(PdlGemv::pick).expect(name);
            for n in names {
                assert!(matmul.contains(&n), "{name}: {n} is not an entry point of matmul.cl");
            }
            assert!(wg % 32 == 0 && (wg == GEMV_VEC_WG || wg == GEMV_ASYNC_WG), "{name}: work-group {wg}");
            assert!((1..=2).contains(&rows_per_warp), "{name}: {rows_per_warp} rows per warp");
        }
        assert_eq!(PdlGemv::parse("0").map(PdlGemv::pick), Some(None), "0 is cuBLAS");
        assert_eq!(PdlGemv::parse("a8"), None, "unknown names are refused");
        // The asynchronous GEMV's ring index is `step & (stages - 1)`.
        assert!(GEMV_ASYNC_STAGES.is_power_of_two());
    }
}
