//! Helpers of the device-backend test files (`backend_ops.rs`, `opencl_*.rs`): opening each device, fresh random
//! inputs, NaN-poisoned outputs, the comparison against the CPU reference, and `op_parity!`, the one test matrix
//! that runs an op case on every backend present.
//!
//! OpenCL needs a runtime that takes SPIR-V (Intel's CPU runtime: scripts/setup.d/20-opencl.sh); its part is skipped
//! with a loud message when `OCL_ICD_VENDORS` is unset, and when it is set (scripts/test.sh and CI set it through
//! scripts/env.d/20-opencl.sh) a missing or broken runtime fails the tests. CUDA runs where a GPU is. Level Zero
//! runs on the loader's null driver (`RSERVE_ZE_NULL_DRIVER_DIR`, scripts/env.d/30-level-zero.sh) in a child process,
//! which checks the whole host-side call sequence but computes nothing.
#![allow(dead_code)]

use std::sync::{Mutex, MutexGuard, OnceLock};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rserve_engine::backend::cuda::CudaBackend;
use rserve_engine::backend::kernels::KernelTuning;
use rserve_engine::backend::opencl::{OpenClBackend, OpenClOptions};
use rserve_engine::backend::Backend;

/// A new OpenCL backend from `RSERVE_OPENCL_PLATFORM` / `RSERVE_OPENCL_DEVICE` (defaults otherwise), or None (with
/// a message) when `OCL_ICD_VENDORS` is unset.
pub fn opencl() -> Option<OpenClBackend> {
    if std::env::var_os("OCL_ICD_VENDORS").is_none() {
        eprintln!(
            "SKIPPED: OCL_ICD_VENDORS is unset, so the OpenCL tests do not run. Set up Intel's CPU runtime with \
             `bash scripts/setup.d/20-opencl.sh` and `source scripts/env.d/20-opencl.sh` (scripts/test.sh does both)"
        );
        return None;
    }
    let opts = OpenClOptions {
        platform: std::env::var("RSERVE_OPENCL_PLATFORM").ok(),
        device: std::env::var("RSERVE_OPENCL_DEVICE").ok().and_then(|d| d.parse().ok()),
    };
    match OpenClBackend::new(&opts) {
        Ok(b) => Some(b),
        Err(e) => panic!("OCL_ICD_VENDORS is set but the OpenCL backend does not start: {e}"),
    }
}

/// One backend shared by the tests of a process (building the kernels takes seconds on the CPU runtime); tests
/// take turns through the lock.
pub fn shared_opencl() -> Option<MutexGuard<'static, OpenClBackend>> {
    static SHARED: OnceLock<Option<Mutex<OpenClBackend>>> = OnceLock::new();
    let b = SHARED.get_or_init(|| opencl().map(Mutex::new)).as_ref()?;
    // A test that failed while holding the lock leaves a usable backend behind.
    let guard = b.lock().unwrap_or_else(|e| e.into_inner());
    guard.tuning_cell().set(KernelTuning::opencl(guard.info().is_cpu)).expect("the default tuning is valid");
    Some(guard)
}

/// One CUDA backend shared by the tests of a process, or None when this host has no usable NVIDIA GPU.
pub fn shared_cuda() -> Option<MutexGuard<'static, CudaBackend>> {
    static SHARED: OnceLock<Option<Mutex<CudaBackend>>> = OnceLock::new();
    let b = SHARED.get_or_init(|| CudaBackend::new(0).ok().map(Mutex::new)).as_ref()?;
    Some(b.lock().unwrap_or_else(|e| e.into_inner()))
}

/// The tolerance of a CUDA run for a case of CPU tolerance `tol`: exact stays exact; elsewhere cuBLAS rounds
/// activations of 16-bit matmuls to 16 bits and accumulates in another order (`cuda_check` uses the same bounds).
pub fn cuda_tol(tol: f32) -> f32 {
    if tol == 0.0 {
        0.0
    } else if tol >= 1e-2 {
        2e-2
    } else {
        tol.max(1e-4)
    }
}

/// A new seed per run (printed by `compare` on failure so a failing case can be replayed with RSERVE_TEST_SEED).
pub fn fresh_seed() -> u64 {
    std::env::var("RSERVE_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| rand::thread_rng().gen())
}

pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// `len` values uniform in [-scale, scale).
pub fn random(rng: &mut StdRng, len: usize, scale: f32) -> Vec<f32> {
    (0..len).map(|_| rng.gen_range(-scale..scale)).collect()
}

/// An f32 buffer filled with NaN, so values an op fails to write are caught.
pub fn poisoned<B: Backend>(b: &B, len: usize) -> B::Buffer {
    b.upload_f32(&vec![f32::NAN; len]).expect("upload")
}

/// One named output of a case, compared in vectors of `width` values (a head, a matrix row, a hidden row).
pub type Output = (&'static str, Vec<f32>, usize);

/// Checks every output of a device run against the CPU run: all values finite (no poison left) and, per vector of
/// `width` values, `max |got - want| / max |want| <= tol`.
pub fn compare(test: &str, device: &str, seed: u64, got: &[Output], want: &[Output], tol: f32) {
    assert_eq!(got.len(), want.len(), "{test}: output count");
    for ((name, g, width), (_, w, _)) in got.iter().zip(want) {
        assert_eq!(g.len(), w.len(), "{test}/{name}: length");
        if let Some(i) = w.iter().position(|v| !v.is_finite()) {
            panic!("{test}/{name}: the CPU reference left a non-finite value at {i} (seed {seed})");
        }
        if let Some(i) = g.iter().position(|v| !v.is_finite()) {
            panic!("{test}/{name}: {device} output {i} is {} (unwritten or overflowed; seed {seed})", g[i]);
        }
        let (mut worst, mut at) = (0f32, 0);
        for (c, (gv, wv)) in g.chunks(*width).zip(w.chunks(*width)).enumerate() {
            let scale = wv.iter().fold(0f32, |m, v| m.max(v.abs())).max(f32::MIN_POSITIVE);
            for (i, (a, b)) in gv.iter().zip(wv).enumerate() {
                if (a - b).abs() / scale > worst {
                    worst = (a - b).abs() / scale;
                    at = c * width + i;
                }
            }
        }
        assert!(
            worst <= tol,
            "{test}/{name}: relative error {worst:e} > {tol:e} at {at}: {device} {} vs cpu {} (seed {seed}; replay \
             with RSERVE_TEST_SEED={seed})",
            g[at],
            w[at]
        );
    }
}

/// The one op test matrix: `$body` (a function of a backend and an rng returning `Output`s) runs on the CPU
/// reference, then with the same seed on every other backend present, each compared with the CPU's outputs: OpenCL
/// (relative tolerance `$tol`; `matmul = ...` picks its matmul kernels), CUDA where a GPU is (`cuda_tol($tol)`), and
/// Level Zero on the null driver in a child process (the host-side call sequence under the validation layer: every
/// op and download must succeed; nothing is computed, so nothing is compared).
#[macro_export]
macro_rules! op_parity {
    ($name:ident, tol = $tol:expr, $(matmul = $kernels:expr,)? |$b:ident, $rng:ident| $body:block) => {
        #[test]
        fn $name() {
            #[allow(unused_mut)]
            fn case<B: rserve_engine::backend::Backend>($b: &B, mut $rng: rand::rngs::StdRng) -> Vec<backends::Output> {
                $body
            }
            let seed = backends::fresh_seed();
            if level_zero_support::in_child() {
                let lz = rserve_engine::backend::level_zero::open("level-zero").expect("the null driver's device");
                case(&lz, backends::rng(seed));
                println!("LZ-OPS: ok");
                return;
            }
            let want = case(&rserve_engine::backend::cpu::CpuBackend::new(), backends::rng(seed));
            match backends::shared_opencl() {
                Some(cl) => {
                    $({
                        let mut t = cl.tuning_cell().get();
                        t.matmul = $kernels;
                        cl.tuning_cell().set(t).unwrap();
                    })?
                    let got = case(&*cl, backends::rng(seed));
                    drop(cl);
                    backends::compare(stringify!($name), "opencl", seed, &got, &want, $tol);
                }
                None => {}
            }
            if let Some(gpu) = backends::shared_cuda() {
                let got = case(&*gpu, backends::rng(seed));
                drop(gpu);
                backends::compare(stringify!($name), "cuda", seed, &got, &want, backends::cuda_tol($tol));
            }
            level_zero_support::null_driver_case(stringify!($name));
        }
    };
}
