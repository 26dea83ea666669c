//! What `cpu_ops.rs` and `kernels_opencl.rs` share, so that the two time the same cases and can be read side by side:
//! SmolLM2-135M's shapes, random inputs, the `rope_write_kv` inputs, the paged-attention cases and the matmul cases.
//! Each bench includes this file as `mod op_cases;` and implements [`TimedBackend`] for its backend.

use candle_core::{DType, Device, Tensor};
use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Throughput};
use rand::rngs::StdRng;
use rand::Rng;
use rserve_engine::backend::{AttentionMeta, AttnShape, Backend, Op, RopeIo};

pub const HIDDEN: usize = 576;
pub const HEADS: usize = 9;
pub const KV_HEADS: usize = 3;
pub const HEAD_DIM: usize = 64;
pub const INTERMEDIATE: usize = 1536;
pub const VOCAB: usize = 49152;
pub const BLOCK_SIZE: usize = 16;
pub const ROPE_THETA: f32 = 100_000.0;
/// Slots of the KV cache `rope_write_kv` writes into (64 blocks).
pub const ROPE_CACHE_SLOTS: usize = 64 * BLOCK_SIZE;

/// A criterion group measuring wall time.
pub type Group<'a> = BenchmarkGroup<'a, WallTime>;

/// A backend as the benches time it.
pub trait TimedBackend: Backend {
    /// Runs `op` and returns once its work is done: what one timed iteration covers.
    fn run_timed(&self, op: Op<'_, Self::Buffer>);
}

/// `n` values uniform in [-1, 1).
fn random(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
}

/// An f32 buffer of `n` random values.
pub fn upload_random<E: Backend>(be: &E, rng: &mut StdRng, n: usize) -> E::Buffer {
    be.upload_f32(&random(rng, n)).expect("upload")
}

/// A random f32 weight of `[n, k]`.
pub fn random_weight(rng: &mut StdRng, n: usize, k: usize) -> Tensor {
    Tensor::from_vec(random(rng, n * k), (n, k), &Device::Cpu).expect("tensor")
}

/// A zeroed K or V cache of [`ROPE_CACHE_SLOTS`] slots.
pub fn alloc_rope_cache<E: Backend>(be: &E) -> E::Buffer {
    be.alloc_f32(ROPE_CACHE_SLOTS * KV_HEADS * HEAD_DIM).expect("alloc")
}

/// The inputs of `rope_write_kv` for `tokens` tokens at positions 1000, 1001, ...: random fused q/k/v rows, the
/// model's inverse frequencies, and the cache slot of each token.
pub struct RopeCase<B> {
    qkv: B,
    positions: B,
    inv_freq: B,
    q_out: B,
    slot_mapping: B,
    tokens: usize,
}

impl<B> RopeCase<B> {
    /// Token `t` writes its K and V rows to cache slot `slot(t)`; the q/k/v rows are drawn from `rng`.
    pub fn new<E: Backend<Buffer = B>>(be: &E, rng: &mut StdRng, tokens: usize, slot: impl Fn(u32) -> u32) -> Self {
        let qkv = upload_random(be, rng, tokens * (HEADS + 2 * KV_HEADS) * HEAD_DIM);
        let q_out = be.alloc_f32(tokens * HEADS * HEAD_DIM).expect("alloc");
        let positions: Vec<u32> = (0..tokens as u32).map(|t| 1000 + t).collect();
        let inv_freq: Vec<f32> =
            (0..HEAD_DIM / 2).map(|i| 1.0 / ROPE_THETA.powf(2.0 * i as f32 / HEAD_DIM as f32)).collect();
        let slots: Vec<u32> = (0..tokens as u32).map(slot).collect();
        RopeCase {
            qkv,
            positions: be.upload_u32(&positions).expect("upload"),
            inv_freq: be.upload_f32(&inv_freq).expect("upload"),
            q_out,
            slot_mapping: be.upload_u32(&slots).expect("upload"),
            tokens,
        }
    }

    /// The op, writing K to `k_cache` and V to `v_cache` (each of [`ROPE_CACHE_SLOTS`] slots; they may be one buffer).
    pub fn op<'a>(&'a self, k_cache: &'a B, v_cache: &'a B) -> Op<'a, B> {
        Op::RopeWriteKv {
            io: RopeIo {
                qkv: &self.qkv,
                positions: &self.positions,
                inv_freq: &self.inv_freq,
                q_out: &self.q_out,
                k_cache,
                v_cache,
                slot_mapping: &self.slot_mapping,
            },
            qk_norm: None,
            num_tokens: self.tokens,
            num_heads: HEADS,
            num_kv_heads: KV_HEADS,
            head_dim: HEAD_DIM,
            block_size: BLOCK_SIZE,
            mscale: 1.0,
        }
    }
}

/// Times `PagedAttention` as benchmark `id`: `seqs` sequences of `context` cached tokens (blocks of different
/// sequences interleaved, as after a while of serving), each computing its last `query` tokens (1: a decode step);
/// random cache and queries from `rng`. Throughput counts query tokens times context.
pub fn bench_paged_attention<E: TimedBackend>(
    be: &E,
    g: &mut Group<'_>,
    id: BenchmarkId,
    rng: &mut StdRng,
    seqs: usize,
    context: usize,
    query: usize,
) {
    let blocks_per_seq = context.div_ceil(BLOCK_SIZE);
    let num_blocks = seqs * blocks_per_seq;
    let cache_len = num_blocks * BLOCK_SIZE * KV_HEADS * HEAD_DIM;
    let k_cache = upload_random(be, rng, cache_len);
    let v_cache = upload_random(be, rng, cache_len);
    let rows = seqs * query;
    let q = upload_random(be, rng, rows * HEADS * HEAD_DIM);
    let out = be.alloc_f32(rows * HEADS * HEAD_DIM).expect("alloc");
    let tables: Vec<u32> = (0..seqs).flat_map(|s| (0..blocks_per_seq).map(move |b| (b * seqs + s) as u32)).collect();
    let query_start: Vec<u32> = (0..=seqs as u32).map(|s| s * query as u32).collect();
    let context_lens = vec![context as u32; seqs];
    let (qs, cl, bt) = (
        be.upload_u32(&query_start).expect("upload"),
        be.upload_u32(&context_lens).expect("upload"),
        be.upload_u32(&tables).expect("upload"),
    );
    let meta = AttentionMeta::new([&qs, &cl, &bt], [&query_start, &context_lens, &tables], blocks_per_seq, BLOCK_SIZE)
        .expect("consistent metadata");
    g.throughput(Throughput::Elements((seqs * context * query) as u64));
    g.bench_function(id, |bch| {
        bch.iter(|| {
            be.run_timed(Op::PagedAttention {
                q: &q,
                k_cache: &k_cache,
                v_cache: &v_cache,
                out: &out,
                meta: &meta,
                shape: AttnShape {
                    num_heads: HEADS,
                    num_kv_heads: KV_HEADS,
                    head_dim: HEAD_DIM,
                    block_size: BLOCK_SIZE,
                    scale: 1.0 / (HEAD_DIM as f32).sqrt(),
                    window: None,
                    softcap: None,
                },
                sinks: None,
            })
        })
    });
}

/// Times `MatMul` for the decode-step projections (q/o 576x576, k/v 192x576, gate/up 1536x576, down 576x1536, LM head
/// 49152x576) at 1 and 16 rows, gate/up also at 128 (a prefill chunk), with the weight in each dtype `dtypes(name)`
/// lists (benchmark ids get `_bf16` / `_f16` for those other than f32); random weights and inputs from `rng`.
pub fn bench_matmuls<E: TimedBackend>(
    be: &E,
    g: &mut Group<'_>,
    rng: &mut StdRng,
    dtypes: impl Fn(&str) -> &'static [DType],
) {
    let shapes = [
        ("q_o_576x576", HIDDEN, HIDDEN),
        ("k_v_192x576", KV_HEADS * HEAD_DIM, HIDDEN),
        ("gate_up_1536x576", INTERMEDIATE, HIDDEN),
        ("down_576x1536", HIDDEN, INTERMEDIATE),
        ("lm_head_49152x576", VOCAB, HIDDEN),
    ];
    for (name, n, k) in shapes {
        let w = random_weight(rng, n, k);
        for &dtype in dtypes(name) {
            let wb = be.upload_weight(&w.to_dtype(dtype).expect("dtype")).expect("upload");
            let rows: &[usize] = if name.starts_with("gate") { &[1, 16, 128] } else { &[1, 16] };
            for &m in rows {
                let x = upload_random(be, rng, m * k);
                let out = be.alloc_f32(m * n).expect("alloc");
                g.throughput(Throughput::Elements((2 * m * n * k) as u64));
                let id = if dtype == DType::F32 { name.to_string() } else { format!("{name}_{}", dtype.as_str()) };
                g.bench_function(BenchmarkId::new(id, format!("m{m}")), |bch| {
                    bch.iter(|| be.run_timed(Op::MatMul { x: &x, w: &wb, bias: None, out: &out, m, k, n }))
                });
            }
        }
    }
}
