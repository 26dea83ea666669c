//! Criterion benchmarks of the CPU backend's ops (`CpuBackend::run`) at SmolLM2-135M's shapes (hidden 576, 9 query
//! heads and 3 KV heads of 64, MLP 1536, vocabulary 49152, KV blocks of 16 tokens), f32 weights as the engine loads
//! them:
//! - `rms_norm` and `rope` for 1 and 16 tokens (one decode step at batch 1 and 16);
//! - `paged_attention_decode`: one query token per sequence over 1k and 4k cached tokens, 1 and 16 sequences;
//! - `matmul`: the decode-step projections (q/o 576x576, k/v 192x576, gate/up 1536x576, down 576x1536, LM head
//!   49152x576) at 1 and 16 rows, and one prefill-sized 128-row product.
//! - `matmul_bf16_8b`: bf16 weights (`--dtype bfloat16`, `backend/cpu/matmul16.rs`) at Llama-3.1-8B's gate/up
//!   (28672x4096, 235 MB: streamed from memory) at 1, 16 and 128 rows; throughput in weight bytes, to set against the
//!   host's read bandwidth.
//!
//! Inputs are random; only the shapes matter for time. The cases are built by `op_cases/mod.rs`, which
//! `kernels_opencl.rs` shares.

use std::time::Duration;

use candle_core::DType;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use rand::rngs::StdRng;
use rand::SeedableRng;
use rserve_engine::backend::cpu::{CpuBackend, CpuBuffer};
use rserve_engine::backend::{Backend, Op};

mod op_cases;
use op_cases::{alloc_rope_cache, bench_matmuls, bench_paged_attention, upload_random, RopeCase, TimedBackend, HIDDEN};

impl TimedBackend for CpuBackend {
    fn run_timed(&self, op: Op<'_, CpuBuffer>) {
        self.run(op).expect("op runs");
    }
}

fn bench_elementwise(c: &mut Criterion) {
    let be = CpuBackend::new();
    let mut rng = StdRng::seed_from_u64(1);
    let mut g = c.benchmark_group("cpu_ops");
    for tokens in [1usize, 16] {
        let x = upload_random(&be, &mut rng, tokens * HIDDEN);
        let w = upload_random(&be, &mut rng, HIDDEN);
        let out = be.alloc_f32(tokens * HIDDEN).expect("alloc");
        g.bench_function(BenchmarkId::new("rms_norm", tokens), |bch| {
            bch.iter(|| {
                be.run_timed(Op::RmsNorm { x: &x, weight: &w, out: &out, rows: tokens, hidden: HIDDEN, eps: 1e-5 })
            })
        });
        let rope = RopeCase::new(&be, &mut rng, tokens, |t| t * 3);
        let (k_cache, v_cache) = (alloc_rope_cache(&be), alloc_rope_cache(&be));
        g.bench_function(BenchmarkId::new("rope_write_kv", tokens), |bch| {
            bch.iter(|| be.run_timed(rope.op(&k_cache, &v_cache)))
        });
    }
    g.finish();
}

fn bench_attention(c: &mut Criterion) {
    let be = CpuBackend::new();
    let mut rng = StdRng::seed_from_u64(2);
    let mut g = c.benchmark_group("paged_attention_decode");
    for context in [1024usize, 4096] {
        for seqs in [1usize, 16] {
            let id = BenchmarkId::new(format!("ctx{context}"), format!("{seqs}seq"));
            bench_paged_attention(&be, &mut g, id, &mut rng, seqs, context, 1);
        }
    }
    g.finish();
}

fn bench_matmul(c: &mut Criterion) {
    let be = CpuBackend::new();
    let mut rng = StdRng::seed_from_u64(3);
    let mut g = c.benchmark_group("matmul");
    bench_matmuls(&be, &mut g, &mut rng, |_| &[DType::F32]);
    g.finish();
}

fn bench_matmul_bf16_8b(c: &mut Criterion) {
    let be = CpuBackend::new();
    let mut rng = StdRng::seed_from_u64(4);
    let mut g = c.benchmark_group("matmul_bf16_8b");
    let (n, k) = (2 * 14336, 4096);
    let w = op_cases::random_weight(&mut rng, n, k).to_dtype(DType::BF16).expect("bf16");
    let wb = be.upload_weight(&w).expect("upload");
    for m in [1usize, 16, 128] {
        let x = upload_random(&be, &mut rng, m * k);
        let out = be.alloc_f32(m * n).expect("alloc");
        g.throughput(criterion::Throughput::Bytes((n * k * 2) as u64));
        g.bench_function(BenchmarkId::new("gate_up_28672x4096", format!("m{m}")), |bch| {
            bch.iter(|| be.run_timed(Op::MatMul { x: &x, w: &wb, bias: None, out: &out, m, k, n }))
        });
    }
    g.finish();
}

fn config() -> Criterion {
    Criterion::default().sample_size(20).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3))
}

criterion_group!(name = benches; config = config(); targets = bench_elementwise, bench_attention, bench_matmul,
    bench_matmul_bf16_8b);
criterion_main!(benches);
