//! Criterion benchmarks of every OpenCL kernel through `OpenClBackend::run` (launch + wait for the queue), at
//! SmolLM2-135M's shapes (hidden 576, 9 query / 3 KV heads of 64, MLP 1536, vocabulary 49152, blocks of 16) and the
//! same cases as `cpu_ops.rs` (both build them with `op_cases/mod.rs`), so the two can be read side by side. On
//! Intel's CPU OpenCL runtime these numbers are regression markers for the kernels, not GPU figures.
//!
//! Needs an OpenCL runtime that takes SPIR-V: `bash scripts/setup.d/20-opencl.sh && source scripts/env.d/20-opencl.sh`.
//! Without `OCL_ICD_VENDORS` the bench prints why and measures nothing.

use std::time::Duration;

use candle_core::DType;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rserve_engine::backend::opencl::{ClBuffer, OpenClBackend, OpenClOptions};
use rserve_engine::backend::{Activation, Backend, Op};

mod op_cases;
use op_cases::{
    alloc_rope_cache, bench_matmuls, bench_paged_attention, random_weight, upload_random, RopeCase, TimedBackend,
    HIDDEN, INTERMEDIATE, ROPE_CACHE_SLOTS,
};

fn backend() -> Option<OpenClBackend> {
    if std::env::var_os("OCL_ICD_VENDORS").is_none() {
        eprintln!("kernels_opencl: OCL_ICD_VENDORS is unset; run scripts/setup.d/20-opencl.sh and source scripts/env.d/20-opencl.sh");
        return None;
    }
    Some(OpenClBackend::new(&OpenClOptions::default()).expect("OpenCL backend"))
}

impl TimedBackend for OpenClBackend {
    fn run_timed(&self, op: Op<'_, ClBuffer>) {
        self.run(op).expect("op runs");
        self.finish().expect("queue finishes");
    }
}

fn bench_elementwise(c: &mut Criterion) {
    let Some(be) = backend() else { return };
    let mut rng = StdRng::seed_from_u64(1);
    let mut g = c.benchmark_group("opencl_ops");
    for tokens in [1usize, 16, 512] {
        let x = upload_random(&be, &mut rng, tokens * HIDDEN);
        let res = upload_random(&be, &mut rng, tokens * HIDDEN);
        let w = upload_random(&be, &mut rng, HIDDEN);
        let out = be.alloc_f32(tokens * HIDDEN).expect("alloc");
        g.bench_function(BenchmarkId::new("rms_norm", tokens), |bch| {
            bch.iter(|| {
                be.run_timed(Op::RmsNorm { x: &x, weight: &w, out: &out, rows: tokens, hidden: HIDDEN, eps: 1e-5 })
            })
        });
        g.bench_function(BenchmarkId::new("add_rms_norm", tokens), |bch| {
            bch.iter(|| {
                be.run_timed(Op::AddRmsNorm {
                    x: &x,
                    residual: &res,
                    weight: &w,
                    out: &out,
                    rows: tokens,
                    hidden: HIDDEN,
                    eps: 1e-5,
                })
            })
        });
        // K and V into one cache; 512 tokens wrap around its slots.
        let rope = RopeCase::new(&be, &mut rng, tokens, |t| t * 2 % ROPE_CACHE_SLOTS as u32);
        let cache = alloc_rope_cache(&be);
        g.bench_function(BenchmarkId::new("rope_write_kv", tokens), |bch| {
            bch.iter(|| be.run_timed(rope.op(&cache, &cache)))
        });
        let gate_up = upload_random(&be, &mut rng, tokens * 2 * INTERMEDIATE);
        let act = be.alloc_f32(tokens * INTERMEDIATE).expect("alloc");
        g.bench_function(BenchmarkId::new("silu_mul", tokens), |bch| {
            bch.iter(|| {
                be.run_timed(Op::GatedAct {
                    gate_up: &gate_up,
                    out: &act,
                    rows: tokens,
                    width: INTERMEDIATE,
                    act: Activation::Silu,
                })
            })
        });
        let table = be.upload_weight(&random_weight(&mut rng, 4096, HIDDEN)).expect("upload");
        let ids: Vec<u32> = (0..tokens).map(|_| rng.gen_range(0..4096)).collect();
        let ids = be.upload_u32(&ids).expect("upload");
        g.bench_function(BenchmarkId::new("embedding", tokens), |bch| {
            bch.iter(|| {
                be.run_timed(Op::Embedding {
                    table: &table,
                    ids: &ids,
                    out: &out,
                    num_tokens: tokens,
                    hidden: HIDDEN,
                    scale: 1.0,
                })
            })
        });
        let rows: Vec<u32> = (0..tokens as u32).rev().collect();
        let rows = be.upload_u32(&rows).expect("upload");
        g.bench_function(BenchmarkId::new("gather_rows", tokens), |bch| {
            bch.iter(|| be.run_timed(Op::GatherRows { x: &x, rows: &rows, out: &out, num_rows: tokens, width: HIDDEN }))
        });
    }
    g.finish();
}

fn bench_attention(c: &mut Criterion) {
    let Some(be) = backend() else { return };
    let mut g = c.benchmark_group("opencl_paged_attention");
    // Each case draws its inputs from a fresh generator.
    let mut case = |name: &str, seqs: usize, context: usize, query: usize| {
        let id = BenchmarkId::new(name, format!("ctx{context}/{seqs}seq/q{query}"));
        bench_paged_attention(&be, &mut g, id, &mut StdRng::seed_from_u64(2), seqs, context, query);
    };
    for context in [1024usize, 4096] {
        for seqs in [1usize, 16] {
            case("decode", seqs, context, 1);
        }
    }
    case("prefill", 1, 512, 512);
    case("prefill_chunk_after_prefix", 1, 2048, 256);
    g.finish();
}

fn bench_matmul(c: &mut Criterion) {
    let Some(be) = backend() else { return };
    let mut rng = StdRng::seed_from_u64(3);
    let mut g = c.benchmark_group("opencl_matmul");
    bench_matmuls(&be, &mut g, &mut rng, |name| {
        if name.starts_with("gate") {
            &[DType::F32, DType::BF16, DType::F16]
        } else {
            &[DType::F32]
        }
    });
    g.finish();
}

fn config() -> Criterion {
    Criterion::default().sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(2))
}

criterion_group!(name = benches; config = config(); targets = bench_elementwise, bench_attention, bench_matmul);
criterion_main!(benches);
