//! cuBLAS and the asynchronous-copy GEMV: 16-bit weight matmuls at Llama-3.1-8B's shapes and at decode sizes, and
//! every kernel check run twice, once with the asynchronous-copy GEMV taking up to `GEMV_PDL_ROWS` rows and once
//! with the matmuls that read 16-bit activations on cuBLAS alone.

use candle_core::DType;
use rand::rngs::StdRng;
use rserve_engine::backend::cpu::CpuBackend;
use rserve_engine::backend::cuda::CudaBackend;

use crate::common::{rand_vec, R};
use crate::ops::{both, AttnSpec, Check, OpSpec};

/// 16-bit weight matmuls (bf16 without a bias, f16 with one) against the CPU's f32 activations.
pub fn specs(r: &mut StdRng) -> Vec<Check> {
    let mut specs: Vec<Check> = Vec::new();
    // bf16/f16: the CPU multiplies f32 activations by the 16-bit weights; cuBLAS rounds activations to 16 bits too,
    // so relative errors of a few 1e-3 are expected (bf16 has 8 significant bits).
    // Decode-sized shapes of 16-bit weights too: rows past the asynchronous GEMV's limit and a k that is not a
    // multiple of 8 (cuBLAS).
    let shapes =
        [(1, 4096, 1024), (7, 576, 1536), (300, 1024, 515), (1, 4096, 6144), (2, 14336, 4096), (4, 4096, 1000)];
    for (m, k, n) in shapes.into_iter().chain([(3, 100, 77), (16, 4096, 512)]) {
        for (dtype, tol, bias) in [(DType::BF16, 2e-2, false), (DType::F16, 5e-3, true)] {
            let name = format!("matmul_{dtype:?}{} {m}x{k}x{n}", if bias { "+bias" } else { "" });
            let (x, w) = (rand_vec(r, m * k, 1.0), rand_vec(r, n * k, 0.05));
            let bias = bias.then(|| rand_vec(r, n, 1.0));
            specs.push((name, tol, OpSpec::MatMul { x, w, dtype, bias, m, k, n }));
        }
    }
    specs
}

/// Runs `specs` on both backends under the two tunings below, then restores the default; returns the failures.
pub fn check_on_both_paths(cpu: &CpuBackend, gpu: &CudaBackend, specs: &[Check]) -> R<usize> {
    let mut fails = 0;
    // Every check with the asynchronous-copy GEMV taking up to GEMV_PDL_ROWS rows (the default is 1), then the checks
    // whose matmuls read 16-bit activations again on cuBLAS alone.
    let default = gpu.tuning_cell().get();
    let mut all_rows = default;
    all_rows.async_gemv_rows = if default.pdl { rserve_kernels::launch::GEMV_PDL_ROWS } else { 0 };
    let mut cublas = default;
    cublas.async_gemv_rows = 0;
    for (label, tuning, only_x16) in [("", all_rows, false), (" (cublas)", cublas, true)] {
        gpu.tuning_cell().set(tuning)?;
        for (name, tol, spec) in specs {
            let x16 = matches!(
                spec,
                OpSpec::NormMatMul { .. }
                    | OpSpec::SiluMatMul { .. }
                    | OpSpec::Attention(AttnSpec { o_proj: Some(_), .. })
            );
            if only_x16 && !x16 {
                continue;
            }
            let name = format!("{name}{label}");
            if let Err(e) = both(cpu, gpu, &name, *tol, &mut fails, |b| b.check(spec)) {
                fails += 1;
                println!("kernel-check {name:<34} FAIL error: {e}");
            }
        }
    }
    gpu.tuning_cell().set(default)?;
    Ok(fails)
}
