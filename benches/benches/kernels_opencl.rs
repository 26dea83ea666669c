//! Criterion benchmarks of every OpenCL kernel through `OpenClBackend::run` (launch + wait for the queue), at
//! SmolLM2-135M's shapes (hidden 576, 9 query / 3 KV heads of 64, MLP 1536, vocabulary 49152, blocks of 16) and the
//! same cases as `cpu_ops.rs`, so the two can be read side by side. On Intel's CPU OpenCL runtime these numbers are
//! regression markers for the kernels, not GPU figures.
//!
//! Needs an OpenCL runtime that takes SPIR-V: `bash scripts/setup.d/20-opencl.sh && source scripts/env.d/20-opencl.sh`.
//! Without `OCL_ICD_VENDORS` the bench prints why and measures nothing.

use std::time::Duration;

use candle_core::{DType, Device, Tensor};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rserve_engine::backend::opencl::{ClBuffer, OpenClBackend, OpenClOptions};
use rserve_engine::backend::{AttentionMeta, Backend, Op};

const HIDDEN: usize = 576;
const HEADS: usize = 9;
const KV_HEADS: usize = 3;
const HEAD_DIM: usize = 64;
const INTERMEDIATE: usize = 1536;
const VOCAB: usize = 49152;
const BLOCK_SIZE: usize = 16;
const ROPE_THETA: f32 = 100_000.0;

fn backend() -> Option<OpenClBackend> {
    if std::env::var_os("OCL_ICD_VENDORS").is_none() {
        eprintln!("kernels_opencl: OCL_ICD_VENDORS is unset; run scripts/setup.d/20-opencl.sh and source scripts/env.d/20-opencl.sh");
        return None;
    }
    Some(OpenClBackend::new(&OpenClOptions::default()).expect("OpenCL backend"))
}

fn random(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
}

fn run(b: &OpenClBackend, op: Op<'_, ClBuffer>) {
    b.run(op).expect("op runs");
    b.finish().expect("queue finishes");
}

fn bench_elementwise(c: &mut Criterion) {
    let Some(be) = backend() else { return };
    let mut rng = StdRng::seed_from_u64(1);
    let mut g = c.benchmark_group("opencl_ops");
    for tokens in [1usize, 16, 512] {
        let x = be.upload_f32(&random(&mut rng, tokens * HIDDEN)).expect("upload");
        let res = be.upload_f32(&random(&mut rng, tokens * HIDDEN)).expect("upload");
        let w = be.upload_f32(&random(&mut rng, HIDDEN)).expect("upload");
        let out = be.alloc_f32(tokens * HIDDEN).expect("alloc");
        g.bench_function(BenchmarkId::new("rms_norm", tokens), |bch| {
            bch.iter(|| run(&be, Op::RmsNorm { x: &x, weight: &w, out: &out, rows: tokens, hidden: HIDDEN, eps: 1e-5 }))
        });
        g.bench_function(BenchmarkId::new("add_rms_norm", tokens), |bch| {
            bch.iter(|| {
                run(
                    &be,
                    Op::AddRmsNorm {
                        x: &x,
                        residual: &res,
                        weight: &w,
                        out: &out,
                        rows: tokens,
                        hidden: HIDDEN,
                        eps: 1e-5,
                    },
                )
            })
        });
        let row = KV_HEADS * HEAD_DIM;
        let qkv = be.upload_f32(&random(&mut rng, tokens * (HEADS * HEAD_DIM + 2 * row))).expect("upload");
        let q = be.alloc_f32(tokens * HEADS * HEAD_DIM).expect("alloc");
        let cache = be.alloc_f32(64 * BLOCK_SIZE * row).expect("alloc");
        let positions: Vec<u32> = (0..tokens as u32).map(|t| 1000 + t).collect();
        let pos = be.upload_u32(&positions).expect("upload");
        let inv: Vec<f32> =
            (0..HEAD_DIM / 2).map(|i| 1.0 / ROPE_THETA.powf(2.0 * i as f32 / HEAD_DIM as f32)).collect();
        let inv = be.upload_f32(&inv).expect("upload");
        let slots: Vec<u32> = (0..tokens as u32).map(|t| t * 2 % (64 * BLOCK_SIZE as u32)).collect();
        let slots = be.upload_u32(&slots).expect("upload");
        g.bench_function(BenchmarkId::new("rope_write_kv", tokens), |bch| {
            bch.iter(|| {
                run(
                    &be,
                    Op::RopeWriteKv {
                        qkv: &qkv,
                        positions: &pos,
                        inv_freq: &inv,
                        q_out: &q,
                        k_cache: &cache,
                        v_cache: &cache,
                        slot_mapping: &slots,
                        num_tokens: tokens,
                        num_heads: HEADS,
                        num_kv_heads: KV_HEADS,
                        head_dim: HEAD_DIM,
                        block_size: BLOCK_SIZE,
                    },
                )
            })
        });
        let gate_up = be.upload_f32(&random(&mut rng, tokens * 2 * INTERMEDIATE)).expect("upload");
        let act = be.alloc_f32(tokens * INTERMEDIATE).expect("alloc");
        g.bench_function(BenchmarkId::new("silu_mul", tokens), |bch| {
            bch.iter(|| run(&be, Op::SiluMul { gate_up: &gate_up, out: &act, rows: tokens, width: INTERMEDIATE }))
        });
        let table = Tensor::from_vec(random(&mut rng, 4096 * HIDDEN), (4096, HIDDEN), &Device::Cpu).expect("tensor");
        let table = be.upload_weight(&table).expect("upload");
        let ids: Vec<u32> = (0..tokens).map(|_| rng.gen_range(0..4096)).collect();
        let ids = be.upload_u32(&ids).expect("upload");
        g.bench_function(BenchmarkId::new("embedding", tokens), |bch| {
            bch.iter(|| {
                run(&be, Op::Embedding { table: &table, ids: &ids, out: &out, num_tokens: tokens, hidden: HIDDEN })
            })
        });
        let rows: Vec<u32> = (0..tokens as u32).rev().collect();
        let rows = be.upload_u32(&rows).expect("upload");
        g.bench_function(BenchmarkId::new("gather_rows", tokens), |bch| {
            bch.iter(|| run(&be, Op::GatherRows { x: &x, rows: &rows, out: &out, num_rows: tokens, width: HIDDEN }))
        });
    }
    g.finish();
}

/// `seqs` sequences of `context` cached tokens, each computing its last `query` tokens.
fn bench_attention_case(
    be: &OpenClBackend,
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    seqs: usize,
    context: usize,
    query: usize,
) {
    let mut rng = StdRng::seed_from_u64(2);
    let blocks_per_seq = context.div_ceil(BLOCK_SIZE);
    let num_blocks = seqs * blocks_per_seq;
    let cache_len = num_blocks * BLOCK_SIZE * KV_HEADS * HEAD_DIM;
    let k_cache = be.upload_f32(&random(&mut rng, cache_len)).expect("upload");
    let v_cache = be.upload_f32(&random(&mut rng, cache_len)).expect("upload");
    let rows = seqs * query;
    let q = be.upload_f32(&random(&mut rng, rows * HEADS * HEAD_DIM)).expect("upload");
    let out = be.alloc_f32(rows * HEADS * HEAD_DIM).expect("alloc");
    // Blocks of different sequences interleaved, as after a while of serving.
    let tables: Vec<u32> = (0..seqs).flat_map(|s| (0..blocks_per_seq).map(move |b| (b * seqs + s) as u32)).collect();
    let query_start: Vec<u32> = (0..=seqs as u32).map(|s| s * query as u32).collect();
    let context_lens = vec![context as u32; seqs];
    let (qs, cl, bt) = (
        be.upload_u32(&query_start).expect("upload"),
        be.upload_u32(&context_lens).expect("upload"),
        be.upload_u32(&tables).expect("upload"),
    );
    let meta = AttentionMeta {
        num_seqs: seqs,
        query_start: &qs,
        context_lens: &cl,
        block_tables: &bt,
        max_blocks_per_seq: blocks_per_seq,
        host_query_start: &query_start,
        host_context_lens: &context_lens,
        host_block_tables: &tables,
    };
    g.throughput(Throughput::Elements((seqs * context * query) as u64));
    g.bench_function(BenchmarkId::new(name, format!("ctx{context}/{seqs}seq/q{query}")), |bch| {
        bch.iter(|| {
            run(
                be,
                Op::PagedAttention {
                    q: &q,
                    k_cache: &k_cache,
                    v_cache: &v_cache,
                    out: &out,
                    meta: &meta,
                    num_heads: HEADS,
                    num_kv_heads: KV_HEADS,
                    head_dim: HEAD_DIM,
                    block_size: BLOCK_SIZE,
                    scale: 1.0 / (HEAD_DIM as f32).sqrt(),
                },
            )
        })
    });
}

fn bench_attention(c: &mut Criterion) {
    let Some(be) = backend() else { return };
    let mut g = c.benchmark_group("opencl_paged_attention");
    for context in [1024usize, 4096] {
        for seqs in [1usize, 16] {
            bench_attention_case(&be, &mut g, "decode", seqs, context, 1);
        }
    }
    bench_attention_case(&be, &mut g, "prefill", 1, 512, 512);
    bench_attention_case(&be, &mut g, "prefill_chunk_after_prefix", 1, 2048, 256);
    g.finish();
}

fn bench_matmul(c: &mut Criterion) {
    let Some(be) = backend() else { return };
    let mut rng = StdRng::seed_from_u64(3);
    let mut g = c.benchmark_group("opencl_matmul");
    let shapes = [
        ("q_o_576x576", HIDDEN, HIDDEN),
        ("k_v_192x576", KV_HEADS * HEAD_DIM, HIDDEN),
        ("gate_up_1536x576", INTERMEDIATE, HIDDEN),
        ("down_576x1536", HIDDEN, INTERMEDIATE),
        ("lm_head_49152x576", VOCAB, HIDDEN),
    ];
    for (name, n, k) in shapes {
        let w = Tensor::from_vec(random(&mut rng, n * k), (n, k), &Device::Cpu).expect("tensor");
        let dtypes: &[DType] =
            if name.starts_with("gate") { &[DType::F32, DType::BF16, DType::F16] } else { &[DType::F32] };
        for &dtype in dtypes {
            let wb = be.upload_weight(&w.to_dtype(dtype).expect("dtype")).expect("upload");
            let rows: &[usize] = if name.starts_with("gate") { &[1, 16, 128] } else { &[1, 16] };
            for &m in rows {
                let x = be.upload_f32(&random(&mut rng, m * k)).expect("upload");
                let out = be.alloc_f32(m * n).expect("alloc");
                g.throughput(Throughput::Elements((2 * m * n * k) as u64));
                let id = if dtype == DType::F32 { name.to_string() } else { format!("{name}_{}", dtype.as_str()) };
                g.bench_function(BenchmarkId::new(id, format!("m{m}")), |bch| {
                    bch.iter(|| run(&be, Op::MatMul { x: &x, w: &wb, bias: None, out: &out, m, k, n }))
                });
            }
        }
    }
    g.finish();
}

fn config() -> Criterion {
    Criterion::default().sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(2))
}

criterion_group!(name = benches; config = config(); targets = bench_elementwise, bench_attention, bench_matmul);
criterion_main!(benches);
