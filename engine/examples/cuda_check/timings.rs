//! `cuda_check bench MODEL_DIR`: timings on random bf16 weights of a real model's shape (no checkpoint needed): every
//! matmul shape of the model at 1..256 rows as the default path runs it (µs, weight GB/s), decode steps through
//! `ModelRunner<CudaBackend>` (graph replay vs eager, ms per step) for the defaults and each `KernelTuning` variant given, and
//! prefill steps as the server runs them.

use rand::{Rng, SeedableRng};
use rserve_engine::backend::cuda::CudaBackend;
use rserve_engine::backend::{Backend, Op};
use rserve_engine::model::{BlockId, ScheduledSeq, TokenId};
use rserve_engine::runner::{ModelRunner, RunnerOptions, StepRunner};

use crate::common::{rand_vec, R};

/// Timing on random bf16 weights of a real model shape (no checkpoint needed).
pub fn bench(dir: &str, tuning_variants: &[String]) -> R<()> {
    let resolved = rserve_engine::weights::dummy::resolve(dir)?;
    let params = resolved.load_params()?;
    let gpu = CudaBackend::new(0)?;
    let (h, inter, kv, vocab) =
        (params.hidden_size, params.intermediate_size, params.num_kv_heads * params.head_dim, params.vocab_size);
    println!("bench: {} ({})", dir, gpu.device_name());
    println!("matmul | shape (k -> n) | rows | path | us | weight GB/s");
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let shapes = if std::env::var("RSERVE_BENCH_SKIP_MATMUL").is_ok() {
        vec![]
    } else {
        vec![(h, h + 2 * kv), (h, h), (h, 2 * inter), (inter, h), (h, vocab)]
    };
    for (k, n) in shapes {
        // Enough copies of the weight to stream past the 60 MB L2 on every call.
        let bytes = k * n * 2;
        let copies = (256_000_000 / bytes).clamp(1, 16);
        let ws: Vec<_> = (0..copies)
            .map(|_| {
                let v: Vec<half::bf16> = (0..k * n).map(|_| half::bf16::from_f32(rng.gen_range(-0.05..0.05))).collect();
                gpu.upload_weight(&candle_core::Tensor::from_vec(v, (n, k), &candle_core::Device::Cpu).unwrap())
                    .unwrap()
            })
            .collect();
        for m in [1usize, 2, 4, 8, 16, 64, 256] {
            let x = gpu.upload_f32(&rand_vec(&mut rng, m * k, 1.0))?;
            let out = gpu.alloc_f32(m * n)?;
            {
                let path = "default";
                let mm = |i: usize| gpu.run(Op::MatMul { x: &x, w: &ws[i % copies], bias: None, out: &out, m, k, n });
                for i in 0..3 {
                    mm(i)?;
                }
                gpu.synchronize()?;
                let reps = 30;
                let t0 = gpu.record_event()?;
                for i in 0..reps {
                    mm(i)?;
                }
                let t1 = gpu.record_event()?;
                gpu.synchronize()?;
                let us = t0.elapsed_ms(&t1)? as f64 * 1e3 / reps as f64;
                println!("matmul | {k} -> {n} | {m} | {path} | {us:.1} | {:.0}", bytes as f64 / us / 1e3);
            }
        }
    }
    drop(gpu);
    let t0 = std::time::Instant::now();
    let weights = rserve_engine::weights::dummy::dummy(&params, candle_core::DType::BF16, 0)?;
    let bs = 16;
    let (ctx, max_batch) = (256usize, 256usize);
    // Room for the warm-up and timed steps of both modes (each starts again at `ctx`).
    let timed: usize = std::env::var("RSERVE_BENCH_STEPS").ok().and_then(|v| v.parse().ok()).unwrap_or(30);
    let per_seq = (ctx + 3 + timed.max(64) + 1).div_ceil(bs);
    let opts = RunnerOptions { max_model_len: 2048, max_num_seqs: 256, enforce_eager: false, ..Default::default() };
    let mut runner = ModelRunner::with_options(CudaBackend::new(0)?, &params, &weights, per_seq * max_batch, bs, opts)?;
    drop(weights);
    println!("bench: dummy weights generated and uploaded in {:.1} s", t0.elapsed().as_secs_f64());
    println!("decode | batch | mode | ms per step | tok/s");
    let batches: Vec<usize> = std::env::var("RSERVE_BENCH_BATCHES")
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 16, 64, 256]);
    // RSERVE_BENCH_GRAPH_ONLY skips the eager steps, RSERVE_BENCH_STEPS sets the timed steps (30), and
    // RSERVE_BENCH_SKIP_PREFILL the prefill table: for A/B runs of kernel variants.
    let modes: &[bool] = if std::env::var_os("RSERVE_BENCH_GRAPH_ONLY").is_some() { &[false] } else { &[false, true] };
    // Each further argument is a variant to time as well: `KEY=VALUE[,KEY=VALUE]` settings of `KernelTuning` (e.g.
    // `partition=32` or `async_gemv_rows=0`), graphs captured anew for each, in this one process (one set of weights).
    let mut variants = vec![String::new()];
    variants.extend(tuning_variants.iter().cloned());
    let default = runner.backend().tuning_cell().get();
    for variant in &variants {
        let mut t = default;
        for setting in variant.split(',').filter(|s| !s.is_empty()) {
            t.set(setting)?;
        }
        runner.backend().tuning_cell().set(t)?;
        runner.clear_recordings();
        if !variant.is_empty() {
            println!("tuning-variant {variant}");
        }
        for &batch in &batches {
            for &eager in modes {
                runner.set_enforce_eager(eager);
                let tables: Vec<Vec<BlockId>> =
                    (0..batch).map(|i| BlockId::run((i * per_seq) as u32, per_seq)).collect();
                let mut pos = ctx;
                let mut step = |pos: usize| -> R<()> {
                    let seqs: Vec<ScheduledSeq> = tables
                        .iter()
                        .enumerate()
                        .map(|(i, t)| ScheduledSeq::new(vec![TokenId((i * 7 + pos) as u32 % 1000)], pos, t.clone(), bs))
                        .collect();
                    runner.execute_greedy(&seqs)?.ok_or("no greedy")?;
                    Ok(())
                };
                for _ in 0..3 {
                    step(pos)?;
                    pos += 1;
                }
                let steps = timed;
                let t0 = std::time::Instant::now();
                for _ in 0..steps {
                    step(pos)?;
                    pos += 1;
                }
                let ms = t0.elapsed().as_secs_f64() * 1e3 / steps as f64;
                println!(
                    "decode | {batch} | {} | {ms:.2} | {:.0}",
                    if eager { "eager" } else { "graph" },
                    batch as f64 * 1e3 / ms
                );
            }
        }
    }
    // Prefill steps as the server runs them (eager): the default step budget of 2048 new tokens, as 16 prompts of
    // 128 tokens and as 4 of 512.
    if std::env::var_os("RSERVE_BENCH_SKIP_PREFILL").is_some() {
        return Ok(());
    }
    runner.set_enforce_eager(true);
    println!("prefill | seqs x tokens | ms per step | prompt tok/s");
    for (nseq, len) in [(16usize, 128usize), (4, 512)] {
        let nb = len.div_ceil(bs);
        let batch: Vec<ScheduledSeq> = (0..nseq)
            .map(|i| {
                let tokens = (0..len).map(|j| TokenId(((j * 31 + i * 7) % 1000) as u32)).collect();
                ScheduledSeq::new(tokens, 0, BlockId::run((i * nb) as u32, nb), bs)
            })
            .collect();
        for _ in 0..2 {
            runner.execute_greedy(&batch)?.ok_or("no greedy")?;
        }
        let steps = 16;
        let t0 = std::time::Instant::now();
        for _ in 0..steps {
            runner.execute_greedy(&batch)?.ok_or("no greedy")?;
        }
        let ms = t0.elapsed().as_secs_f64() * 1e3 / steps as f64;
        println!("prefill | {nseq}x{len} | {ms:.2} | {:.0}", (nseq * len) as f64 * 1e3 / ms);
    }
    Ok(())
}
