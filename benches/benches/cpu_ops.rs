//! Criterion benchmarks of the CPU backend's ops (`CpuBackend::run`) at SmolLM2-135M's shapes (hidden 576, 9 query
//! heads and 3 KV heads of 64, MLP 1536, vocabulary 49152, KV blocks of 16 tokens), f32 weights as the engine loads
//! them:
//! - `rms_norm` and `rope` for 1 and 16 tokens (one decode step at batch 1 and 16);
//! - `paged_attention_decode`: one query token per sequence over 1k and 4k cached tokens, 1 and 16 sequences;
//! - `matmul`: the decode-step projections (q/o 576x576, k/v 192x576, gate/up 1536x576, down 576x1536, LM head
//!   49152x576) at 1 and 16 rows, and one prefill-sized 128-row product.
//!
//! Inputs are random; only the shapes matter for time.

use std::time::Duration;

use candle_core::{Device, Tensor};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rserve_engine::backend::cpu::{CpuBackend, CpuBuffer};
use rserve_engine::backend::{AttentionMeta, Backend, Op};

const HIDDEN: usize = 576;
const HEADS: usize = 9;
const KV_HEADS: usize = 3;
const HEAD_DIM: usize = 64;
const INTERMEDIATE: usize = 1536;
const VOCAB: usize = 49152;
const BLOCK_SIZE: usize = 16;
const ROPE_THETA: f32 = 100_000.0;

fn random(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
}

fn run(b: &CpuBackend, op: Op<'_, CpuBuffer>) {
    b.run(op).expect("op runs");
}

fn bench_elementwise(c: &mut Criterion) {
    let be = CpuBackend::new();
    let mut rng = StdRng::seed_from_u64(1);
    let mut g = c.benchmark_group("cpu_ops");
    for tokens in [1usize, 16] {
        let x = be.upload_f32(&random(&mut rng, tokens * HIDDEN)).expect("upload");
        let w = be.upload_f32(&random(&mut rng, HIDDEN)).expect("upload");
        let out = be.alloc_f32(tokens * HIDDEN).expect("alloc");
        g.bench_function(BenchmarkId::new("rms_norm", tokens), |bch| {
            bch.iter(|| run(&be, Op::RmsNorm { x: &x, weight: &w, out: &out, rows: tokens, hidden: HIDDEN, eps: 1e-5 }))
        });
        let row = KV_HEADS * HEAD_DIM;
        let qkv = be.upload_f32(&random(&mut rng, tokens * (HEADS * HEAD_DIM + 2 * row))).expect("upload");
        let q = be.alloc_f32(tokens * HEADS * HEAD_DIM).expect("alloc");
        let (k_cache, v_cache) =
            (be.alloc_f32(64 * BLOCK_SIZE * row).expect("alloc"), be.alloc_f32(64 * BLOCK_SIZE * row).expect("alloc"));
        let positions: Vec<u32> = (0..tokens as u32).map(|t| 1000 + t).collect();
        let pos = be.upload_u32(&positions).expect("upload");
        let slots = be.upload_u32(&(0..tokens as u32).map(|t| t * 3).collect::<Vec<_>>()).expect("upload");
        let inv: Vec<f32> =
            (0..HEAD_DIM / 2).map(|i| 1.0 / ROPE_THETA.powf(2.0 * i as f32 / HEAD_DIM as f32)).collect();
        let inv = be.upload_f32(&inv).expect("upload");
        g.bench_function(BenchmarkId::new("rope_write_kv", tokens), |bch| {
            bch.iter(|| {
                run(
                    &be,
                    Op::RopeWriteKv {
                        qkv: &qkv,
                        positions: &pos,
                        inv_freq: &inv,
                        q_out: &q,
                        k_cache: &k_cache,
                        v_cache: &v_cache,
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
    }
    g.finish();
}

fn bench_attention(c: &mut Criterion) {
    let be = CpuBackend::new();
    let mut rng = StdRng::seed_from_u64(2);
    let mut g = c.benchmark_group("paged_attention_decode");
    for context in [1024usize, 4096] {
        for seqs in [1usize, 16] {
            let blocks_per_seq = context / BLOCK_SIZE;
            let num_blocks = seqs * blocks_per_seq;
            let cache_len = num_blocks * BLOCK_SIZE * KV_HEADS * HEAD_DIM;
            let k_cache = be.upload_f32(&random(&mut rng, cache_len)).expect("upload");
            let v_cache = be.upload_f32(&random(&mut rng, cache_len)).expect("upload");
            let q = be.upload_f32(&random(&mut rng, seqs * HEADS * HEAD_DIM)).expect("upload");
            let out = be.alloc_f32(seqs * HEADS * HEAD_DIM).expect("alloc");
            // Blocks of different sequences interleaved, as after a while of serving.
            let tables: Vec<u32> =
                (0..seqs).flat_map(|s| (0..blocks_per_seq).map(move |b| (b * seqs + s) as u32)).collect();
            let query_start: Vec<u32> = (0..=seqs as u32).collect();
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
            g.throughput(Throughput::Elements((seqs * context) as u64));
            g.bench_function(BenchmarkId::new(format!("ctx{context}"), format!("{seqs}seq")), |bch| {
                bch.iter(|| {
                    run(
                        &be,
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
    }
    g.finish();
}

fn bench_matmul(c: &mut Criterion) {
    let be = CpuBackend::new();
    let mut rng = StdRng::seed_from_u64(3);
    let mut g = c.benchmark_group("matmul");
    let shapes = [
        ("q_o_576x576", HIDDEN, HIDDEN),
        ("k_v_192x576", KV_HEADS * HEAD_DIM, HIDDEN),
        ("gate_up_1536x576", INTERMEDIATE, HIDDEN),
        ("down_576x1536", HIDDEN, INTERMEDIATE),
        ("lm_head_49152x576", VOCAB, HIDDEN),
    ];
    for (name, n, k) in shapes {
        let w = Tensor::from_vec(random(&mut rng, n * k), (n, k), &Device::Cpu).expect("tensor");
        let w = be.upload_weight(&w).expect("upload");
        let rows: &[usize] = if name.starts_with("gate") { &[1, 16, 128] } else { &[1, 16] };
        for &m in rows {
            let x = be.upload_f32(&random(&mut rng, m * k)).expect("upload");
            let out = be.alloc_f32(m * n).expect("alloc");
            g.throughput(Throughput::Elements((2 * m * n * k) as u64));
            g.bench_function(BenchmarkId::new(name, format!("m{m}")), |bch| {
                bch.iter(|| run(&be, Op::MatMul { x: &x, w: &w, bias: None, out: &out, m, k, n }))
            });
        }
    }
    g.finish();
}

fn config() -> Criterion {
    Criterion::default().sample_size(20).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3))
}

criterion_group!(name = benches; config = config(); targets = bench_elementwise, bench_attention, bench_matmul);
criterion_main!(benches);
