//! Every `Op` on every backend present (OpenCL on Intel's CPU runtime, CUDA where a GPU is, Level Zero on the null
//! driver for the call sequence; `backends::op_parity!`) against the CPU reference, on fresh random inputs with
//! NaN-poisoned outputs:
//! odd sizes, ragged batches, the first and last slot of a block, block sizes 1 to 128, grouped-query heads
//! (including groups larger than one work-group's head chunk), prefill chunks over cached prefixes, and contexts
//! longer than one split-KV partition. Relative error (max |diff| / max |cpu|) under 1e-5 for f32, 1e-2 for 16-bit
//! weights. Malformed indices are errors, not device writes.

mod backends;
mod level_zero_support;

use candle_core::{DType, Device, Tensor};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use rserve_engine::backend::kernels::MatmulPath;
use rserve_engine::backend::{Activation, AttentionMeta, AttnShape, Backend, Op, QkNorm, RopeIo};
use rserve_engine::sampling::{reference, RowParams, NO_LOGPROBS};
use rserve_kernels::launch::LOGPROBS_MAX_TOP;

use backends::{poisoned, random};

const F32_TOL: f32 = 1e-5;
const SG: MatmulPath = MatmulPath::SubGroup;
const WI: MatmulPath = MatmulPath::WorkItem;
const HALF_TOL: f32 = 1e-2;

fn weight<B: Backend>(b: &B, data: Vec<f32>, rows: usize, cols: usize, dtype: DType) -> B::Buffer {
    let t = Tensor::from_vec(data, (rows, cols), &Device::Cpu).unwrap().to_dtype(dtype).unwrap();
    b.upload_weight(&t).unwrap()
}

// ------------------------------------------------------------------------------------------------ embedding

fn embedding<B: Backend>(b: &B, rng: &mut StdRng, dtype: DType) -> Vec<backends::Output> {
    let (vocab, hidden, n) = (300, 100, 37);
    let table = weight(b, random(rng, vocab * hidden, 1.0), vocab, hidden, dtype);
    let mut ids: Vec<u32> = (0..n).map(|_| rng.gen_range(0..vocab as u32)).collect();
    ids[0] = 0;
    ids[n - 1] = vocab as u32 - 1;
    let ids = b.upload_u32(&ids).unwrap();
    let out = poisoned(b, n * hidden);
    b.run(Op::Embedding { table: &table, ids: &ids, out: &out, num_tokens: n, hidden, scale: 1.0 }).unwrap();
    vec![("out", b.download_f32(&out).unwrap(), hidden)]
}

op_parity!(embedding_f32, tol = 0.0, |b, rng| { embedding(b, &mut rng, DType::F32) });

op_parity!(embedding_scaled, tol = F32_TOL, |b, rng| {
    // Gemma's sqrt(hidden) normaliser.
    let (vocab, hidden, n) = (50, 64, 9);
    let table = weight(b, random(&mut rng, vocab * hidden, 1.0), vocab, hidden, DType::BF16);
    let ids = b.upload_u32(&(0..n as u32).map(|i| i * 5).collect::<Vec<_>>()).unwrap();
    let out = poisoned(b, n * hidden);
    b.run(Op::Embedding { table: &table, ids: &ids, out: &out, num_tokens: n, hidden, scale: 8.0 }).unwrap();
    vec![("out", b.download_f32(&out).unwrap(), hidden)]
});
op_parity!(embedding_bf16, tol = 0.0, |b, rng| { embedding(b, &mut rng, DType::BF16) });
op_parity!(embedding_f16, tol = 0.0, |b, rng| { embedding(b, &mut rng, DType::F16) });

// ------------------------------------------------------------------------------------------------ norms

fn norm<B: Backend>(b: &B, rng: &mut StdRng, fused: bool) -> Vec<backends::Output> {
    let mut outs = Vec::new();
    // Register path (width a multiple of 4, at most 8192) and the strided loop (1002, 8200).
    for (rows, hidden) in [(7, 576), (3, 1000), (1, 4096), (2, 1002), (1, 8200)] {
        let x = b.upload_f32(&random(rng, rows * hidden, 2.0)).unwrap();
        let w = b.upload_weight(&Tensor::from_vec(random(rng, hidden, 1.5), hidden, &Device::Cpu).unwrap()).unwrap();
        let out = poisoned(b, rows * hidden);
        let eps = 1e-5;
        if fused {
            let residual = b.upload_f32(&random(rng, rows * hidden, 2.0)).unwrap();
            b.run(Op::AddRmsNorm { x: &x, residual: &residual, weight: &w, out: &out, rows, hidden, eps }).unwrap();
            outs.push(("residual", b.download_f32(&residual).unwrap(), hidden));
        } else {
            b.run(Op::RmsNorm { x: &x, weight: &w, out: &out, rows, hidden, eps }).unwrap();
        }
        outs.push(("out", b.download_f32(&out).unwrap(), hidden));
    }
    outs
}

op_parity!(rms_norm, tol = F32_TOL, |b, rng| { norm(b, &mut rng, false) });

op_parity!(add_rms_norm, tol = F32_TOL, |b, rng| { norm(b, &mut rng, true) });

// ------------------------------------------------------------------------------------------------ matmul

/// Row counts on both sides of the skinny/tiled switch and of the work-item kernel's 4-row groups, k not a
/// multiple of 4, odd n, with and without a bias.
fn matmul<B: Backend>(b: &B, rng: &mut StdRng, dtype: DType) -> Vec<backends::Output> {
    let mut outs = Vec::new();
    for (m, k, n, bias) in [
        (1, 576, 1536, false),
        (4, 1024, 37, true),
        (3, 577, 1000, true),
        (16, 256, 190, false),
        (17, 300, 129, true),
        (5, 579, 33, true),
        (70, 576, 576, false),
    ] {
        let x = b.upload_f32(&random(rng, m * k, 1.0)).unwrap();
        let w = weight(b, random(rng, n * k, 0.5), n, k, dtype);
        let bias = bias.then(|| b.upload_f32(&random(rng, n, 1.0)).unwrap());
        let out = poisoned(b, m * n);
        b.run(Op::MatMul { x: &x, w: &w, bias: bias.as_ref(), out: &out, m, k, n }).unwrap();
        outs.push(("out", b.download_f32(&out).unwrap(), n));
    }
    outs
}

/// 16-bit weights whose activations come from the op before in the buffer the backend gives a matmul input
/// (`alloc_matmul_input`: 16-bit in the weight's type on OpenCL, Level Zero and CUDA, f32 on the CPU): a gated
/// activation writes them, the multiply reads them (every shape: GEMV, rows, tiled, k not a multiple of 8).
fn matmul_x16<B: Backend>(b: &B, rng: &mut StdRng, dtype: DType) -> Vec<backends::Output> {
    let mut outs = Vec::new();
    for (m, k, n) in [(1, 576, 1536), (4, 1024, 37), (3, 577, 100), (17, 296, 129), (70, 576, 200)] {
        let w = weight(b, random(rng, n * k, 0.5), n, k, dtype);
        let gate_up = b.upload_f32(&random(rng, m * 2 * k, 2.0)).unwrap();
        let x = b.alloc_matmul_input(m * k, &w).unwrap();
        b.run(Op::GatedAct { gate_up: &gate_up, out: &x, rows: m, width: k, act: Activation::Silu }).unwrap();
        let out = poisoned(b, m * n);
        b.run(Op::MatMul { x: &x, w: &w, bias: None, out: &out, m, k, n }).unwrap();
        outs.push(("out", b.download_f32(&out).unwrap(), n));
    }
    outs
}

op_parity!(matmul_x16_bf16_sub_group_and_tiled, tol = HALF_TOL, matmul = SG, |b, rng| {
    matmul_x16(b, &mut rng, DType::BF16)
});
op_parity!(matmul_x16_f16_sub_group_and_tiled, tol = HALF_TOL, matmul = SG, |b, rng| {
    matmul_x16(b, &mut rng, DType::F16)
});
op_parity!(matmul_x16_bf16_work_item, tol = HALF_TOL, matmul = WI, |b, rng| { matmul_x16(b, &mut rng, DType::BF16) });
op_parity!(matmul_f32_sub_group_and_tiled, tol = F32_TOL, matmul = SG, |b, rng| { matmul(b, &mut rng, DType::F32) });
op_parity!(matmul_bf16_sub_group_and_tiled, tol = HALF_TOL, matmul = SG, |b, rng| { matmul(b, &mut rng, DType::BF16) });
op_parity!(matmul_f16_sub_group_and_tiled, tol = HALF_TOL, matmul = SG, |b, rng| { matmul(b, &mut rng, DType::F16) });
op_parity!(matmul_f32_work_item, tol = F32_TOL, matmul = WI, |b, rng| { matmul(b, &mut rng, DType::F32) });
op_parity!(matmul_bf16_work_item, tol = HALF_TOL, matmul = WI, |b, rng| { matmul(b, &mut rng, DType::BF16) });
op_parity!(matmul_f16_work_item, tol = HALF_TOL, matmul = WI, |b, rng| { matmul(b, &mut rng, DType::F16) });

// ------------------------------------------------------------------------------------------------ silu, gather

op_parity!(silu_mul, tol = F32_TOL, |b, rng| {
    let mut outs = Vec::new();
    for (rows, width) in [(1, 10_007), (5, 1536), (3, 77)] {
        let gate_up = b.upload_f32(&random(&mut rng, rows * 2 * width, 8.0)).unwrap();
        let out = poisoned(b, rows * width);
        b.run(Op::GatedAct { gate_up: &gate_up, out: &out, rows, width, act: Activation::Silu }).unwrap();
        outs.push(("out", b.download_f32(&out).unwrap(), width));
    }
    outs
});

op_parity!(gelu_tanh_mul, tol = F32_TOL, |b, rng| {
    let mut outs = Vec::new();
    for (rows, width) in [(1, 10_007), (4, 640)] {
        let gate_up = b.upload_f32(&random(&mut rng, rows * 2 * width, 8.0)).unwrap();
        let out = poisoned(b, rows * width);
        b.run(Op::GatedAct { gate_up: &gate_up, out: &out, rows, width, act: Activation::GeluTanh }).unwrap();
        outs.push(("out", b.download_f32(&out).unwrap(), width));
    }
    outs
});

op_parity!(swiglu_oai_mul, tol = F32_TOL, |b, rng| {
    // Inputs up to +-12: gates and ups past gpt-oss's limit of 7 are clamped.
    let mut outs = Vec::new();
    for (rows, width) in [(1, 2880), (3, 77)] {
        let gate_up = b.upload_f32(&random(&mut rng, rows * 2 * width, 12.0)).unwrap();
        let out = poisoned(b, rows * width);
        b.run(Op::GatedAct { gate_up: &gate_up, out: &out, rows, width, act: Activation::SwigluOai }).unwrap();
        outs.push(("out", b.download_f32(&out).unwrap(), width));
    }
    outs
});

op_parity!(soft_cap, tol = F32_TOL, |b, rng| {
    let (rows, width) = (3, 1001);
    let x = b.upload_f32(&random(&mut rng, rows * width, 80.0)).unwrap();
    b.run(Op::SoftCap { x: &x, rows, width, cap: 30.0 }).unwrap();
    vec![("x", b.download_f32(&x).unwrap(), width)]
});

op_parity!(gather_rows, tol = 0.0, |b, rng| {
    let (rows_in, width, num_rows) = (23, 577, 9);
    let x = b.upload_f32(&random(&mut rng, rows_in * width, 1.0)).unwrap();
    let mut rows: Vec<u32> = (0..num_rows).map(|_| rng.gen_range(0..rows_in as u32)).collect();
    rows[0] = rows_in as u32 - 1;
    rows[1] = rows[2];
    let rows = b.upload_u32(&rows).unwrap();
    let out = poisoned(b, num_rows * width);
    b.run(Op::GatherRows { x: &x, rows: &rows, out: &out, num_rows, width }).unwrap();
    vec![("out", b.download_f32(&out).unwrap(), width)]
});

/// A step's ids, some taken from the previous step's samples (`Op::FeedTokens`); `from` past `prev_len` (every
/// third row, and one row naming the index just past the samples) keeps the host's id. Returns the ids and the
/// values expected.
fn fed_ids<B: Backend>(b: &B, rng: &mut StdRng) -> (Vec<u32>, Vec<u32>) {
    let (count, prev_len) = (37, 20);
    let host: Vec<u32> = (0..count).map(|_| rng.gen_range(0..50_000)).collect();
    let prev: Vec<u32> = (0..prev_len + 3).map(|_| rng.gen_range(0..50_000)).collect();
    let mut from: Vec<u32> =
        (0..count).map(|i| if i % 3 == 0 { u32::MAX } else { rng.gen_range(0..prev_len as u32) }).collect();
    from[1] = prev_len as u32;
    from[2] = prev_len as u32 - 1;
    let want = host.iter().zip(&from).map(|(&h, &f)| if (f as usize) < prev_len { prev[f as usize] } else { h });
    let want = want.collect();
    let (ids, prev, from) = (b.upload_u32(&host).unwrap(), b.upload_u32(&prev).unwrap(), b.upload_u32(&from).unwrap());
    b.run(Op::FeedTokens { ids: &ids, prev: &prev, from: &from, count, prev_len }).unwrap();
    (b.download_u32(&ids, count).unwrap(), want)
}

op_parity!(feed_tokens, tol = 0.0, |b, rng| {
    let (got, _) = fed_ids(b, &mut rng);
    vec![("ids", got.iter().map(|&t| t as f32).collect(), got.len())]
});

#[test]
fn feed_tokens_takes_the_named_samples_and_keeps_the_rest() {
    let (got, want) = fed_ids(&rserve_engine::backend::cpu::CpuBackend::new(), &mut backends::rng(7));
    assert_eq!(got, want);
}

op_parity!(mask_logits, tol = 0.0, |b, rng| {
    let mut outs = Vec::new();
    // A vocabulary that is not a multiple of 32 (the last word is partial) and one that is; rows with every token
    // allowed, with none, and random ones.
    for (rows, vocab) in [(4usize, 1000usize), (2, 4096)] {
        let words = vocab.div_ceil(32);
        let mut mask: Vec<u32> = (0..rows * words).map(|_| rng.gen()).collect();
        mask[..words].fill(u32::MAX);
        mask[words..2 * words].fill(0);
        let logits = b.upload_f32(&random(&mut rng, rows * vocab, 4.0)).unwrap();
        let mask = b.upload_u32(&mask).unwrap();
        b.run(Op::MaskLogits { logits: &logits, mask: &mask, rows, vocab }).unwrap();
        // -inf (masked) as a finite marker, so the comparison sees exactly which logits each backend masked.
        let got = b.download_f32(&logits).unwrap().into_iter().map(|x| if x == f32::NEG_INFINITY { -1e3 } else { x });
        outs.push(("logits", got.collect(), vocab));
    }
    outs
});

// ------------------------------------------------------------------------------------------------ rope + KV store

op_parity!(rope_write_kv, tol = F32_TOL, |b, rng| { rope(b, &mut rng, false, false) });
op_parity!(rope_write_kv_long_table_and_mscale, tol = F32_TOL, |b, rng| { rope(b, &mut rng, true, false) });
op_parity!(rope_write_kv_qk_norm, tol = F32_TOL, |b, rng| { rope(b, &mut rng, false, true) });

/// With `long`: cos/sin scaled (YaRN / LongRoPE attention factor) and half the positions reading the second table
/// (bit 31, LongRoPE's long factors). With `norm`: q and k heads RMS-normalised first (Qwen3, Gemma 3); the
/// shapes include Gemma 3's 256-wide heads and a head narrower than a sub-group.
fn rope<B: Backend>(b: &B, rng: &mut StdRng, long: bool, norm: bool) -> Vec<backends::Output> {
    let mut outs = Vec::new();
    let shapes = [(16, 9, 3, 64), (32, 32, 8, 128), (64, 2, 1, 80), (1, 2, 2, 64), (16, 8, 4, 256), (4, 3, 1, 36)];
    for (block_size, heads, kv_heads, head_dim) in shapes {
        let num_blocks = 7;
        let row = kv_heads * head_dim;
        let len = num_blocks * block_size * row;
        let (kc, vc) = (b.upload_f32(&random(rng, len, 1.0)).unwrap(), b.upload_f32(&random(rng, len, 1.0)).unwrap());
        // First and last slot of a block, the cache's last slot, and a few random ones.
        let mut slots = vec![0, block_size as u32 - 1, 2 * block_size as u32, (num_blocks * block_size) as u32 - 1];
        slots.extend((0..5).map(|_| rng.gen_range(0..(num_blocks * block_size) as u32)));
        slots.sort();
        slots.dedup();
        slots.shuffle(rng);
        let n = slots.len();
        let qkv = b.upload_f32(&random(rng, n * (heads + 2 * kv_heads) * head_dim, 2.0)).unwrap();
        let q = poisoned(b, n * heads * head_dim);
        let pos: Vec<u32> =
            (0..n).map(|i| rng.gen_range(0..5000) | if long && i % 2 == 1 { 1 << 31 } else { 0 }).collect();
        let tables = if long { 2 } else { 1 };
        let freq: Vec<f32> = (0..tables * head_dim / 2)
            .map(|i| {
                let (t, i) = (i / (head_dim / 2), i % (head_dim / 2));
                1.0 / 10000f32.powf(2.0 * i as f32 / head_dim as f32) / (1.0 + 3.0 * t as f32)
            })
            .collect();
        let (pos, freq, slots) =
            (b.upload_u32(&pos).unwrap(), b.upload_f32(&freq).unwrap(), b.upload_u32(&slots).unwrap());
        let w = |rng: &mut StdRng| {
            b.upload_weight(&Tensor::from_vec(random(rng, head_dim, 1.5), head_dim, &Device::Cpu).unwrap()).unwrap()
        };
        let (wq, wk) = (w(rng), w(rng));
        b.run(Op::RopeWriteKv {
            io: RopeIo {
                qkv: &qkv,
                positions: &pos,
                inv_freq: &freq,
                q_out: &q,
                k_cache: &kc,
                v_cache: &vc,
                slot_mapping: &slots,
            },
            qk_norm: norm.then_some(QkNorm { q_weight: &wq, k_weight: &wk, eps: 1e-6 }),
            num_tokens: n,
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim,
            block_size,
            mscale: if long { 1.19 } else { 1.0 },
        })
        .unwrap();
        outs.push(("q", b.download_f32(&q).unwrap(), head_dim));
        outs.push(("k_cache", b.download_f32(&kc).unwrap(), row));
        outs.push(("v_cache", b.download_f32(&vc).unwrap(), row));
    }
    outs
}

// ------------------------------------------------------------------------------------------------ attention

struct Attn {
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    block_size: usize,
    /// (query rows, context length) per sequence.
    seqs: &'static [(usize, usize)],
}

/// Random caches (every block, used or not), blocks handed out in random order, q random, out poisoned.
fn attention<B: Backend>(b: &B, rng: &mut StdRng, name: &'static str, c: &Attn) -> backends::Output {
    attention_with(b, rng, name, c, None, None)
}

/// `attention` on a sliding-window layer and / or with soft-capped scores.
fn attention_with<B: Backend>(
    b: &B,
    rng: &mut StdRng,
    name: &'static str,
    c: &Attn,
    window: Option<usize>,
    softcap: Option<f32>,
) -> backends::Output {
    attention_scored(b, rng, name, c, &Scoring { window, softcap, sinks: None })
}

/// How scores are formed beyond `q . k * scale`: a sliding window, soft-capping, per-head sink logits.
struct Scoring<'s> {
    window: Option<usize>,
    softcap: Option<f32>,
    sinks: Option<&'s [f32]>,
}

/// `attention` with any `Scoring`.
fn attention_scored<B: Backend>(
    b: &B,
    rng: &mut StdRng,
    name: &'static str,
    c: &Attn,
    &Scoring { window, softcap, sinks }: &Scoring,
) -> backends::Output {
    let bs = c.block_size;
    let per_seq: Vec<usize> = c.seqs.iter().map(|&(_, ctx)| ctx.div_ceil(bs)).collect();
    let num_blocks = per_seq.iter().sum::<usize>() + 3;
    let mut blocks: Vec<u32> = (0..num_blocks as u32).collect();
    blocks.shuffle(rng);
    let max_blocks = per_seq.iter().copied().max().unwrap_or(1).max(1);
    let mut tables = vec![0u32; c.seqs.len() * max_blocks];
    let mut next = blocks.into_iter();
    for (s, &n) in per_seq.iter().enumerate() {
        for j in 0..n {
            tables[s * max_blocks + j] = next.next().unwrap();
        }
    }
    let mut query_start = vec![0u32];
    for &(q, _) in c.seqs {
        query_start.push(query_start.last().unwrap() + q as u32);
    }
    let context_lens: Vec<u32> = c.seqs.iter().map(|&(_, ctx)| ctx as u32).collect();
    let rows = *query_start.last().unwrap() as usize;
    let cache_len = num_blocks * bs * c.kv_heads * c.head_dim;
    let kc = b.upload_f32(&random(rng, cache_len, 1.0)).unwrap();
    let vc = b.upload_f32(&random(rng, cache_len, 1.0)).unwrap();
    let q = b.upload_f32(&random(rng, rows * c.heads * c.head_dim, 1.0)).unwrap();
    let out = poisoned(b, rows * c.heads * c.head_dim);
    let (qs_buf, ctx_buf, bt_buf) =
        (b.upload_u32(&query_start).unwrap(), b.upload_u32(&context_lens).unwrap(), b.upload_u32(&tables).unwrap());
    let meta = AttentionMeta::new([&qs_buf, &ctx_buf, &bt_buf], [&query_start, &context_lens, &tables], max_blocks, bs)
        .unwrap();
    b.run(Op::PagedAttention {
        q: &q,
        k_cache: &kc,
        v_cache: &vc,
        out: &out,
        meta: &meta,
        shape: AttnShape {
            num_heads: c.heads,
            num_kv_heads: c.kv_heads,
            head_dim: c.head_dim,
            block_size: bs,
            scale: 1.0 / (c.head_dim as f32).sqrt(),
            window,
            softcap,
        },
        sinks: sinks.map(|s| b.upload_f32(s).unwrap()).as_ref(),
    })
    .unwrap();
    (name, b.download_f32(&out).unwrap(), c.head_dim)
}

op_parity!(attention_sinks, tol = F32_TOL, |b, rng| {
    // gpt-oss's sinks: one decode partition, split-KV partitions (the reduce), prefill tiles, a sliding window; the
    // sink logits span small, typical and dominating values (head 3's 40 outweighs every key: the output is tiny
    // but must still match, with no overflow in the normalisation).
    let sinks: Vec<f32> = (0..32).map(|h| if h == 3 { 40.0 } else { (h as f32 - 16.0) * 0.4 }).collect();
    let seqs = &[(1, 1), (1, 40), (1, 700), (1, 1300)];
    let decode = Attn { heads: 16, kv_heads: 4, head_dim: 64, block_size: 16, seqs };
    let seqs = &[(70, 70), (33, 100), (1, 9)];
    let prefill = Attn { heads: 32, kv_heads: 8, head_dim: 64, block_size: 16, seqs };
    let sunk = Scoring { window: None, softcap: None, sinks: Some(&sinks) };
    vec![
        attention_scored(b, &mut rng, "decode", &decode, &Scoring { window: None, ..sunk }),
        attention_scored(b, &mut rng, "decode window", &decode, &Scoring { window: Some(128), ..sunk }),
        attention_scored(b, &mut rng, "prefill", &prefill, &Scoring { window: None, ..sunk }),
        attention_scored(b, &mut rng, "prefill window", &prefill, &Scoring { window: Some(32), ..sunk }),
    ]
});

op_parity!(attention_sliding_window_decode, tol = F32_TOL, |b, rng| {
    // Contexts shorter than, equal to and longer than the window; with a 300-key window over split-KV partitions
    // of 256 (the partitions count from the first visible key, so 1300 keys need 2, not 6).
    let seqs = &[(1, 1), (1, 15), (1, 16), (1, 17), (1, 33), (1, 200)];
    let small = Attn { heads: 8, kv_heads: 4, head_dim: 64, block_size: 16, seqs };
    let seqs = &[(1, 512), (1, 299), (1, 1300), (1, 301)];
    let long = Attn { heads: 32, kv_heads: 8, head_dim: 128, block_size: 32, seqs };
    vec![
        attention_with(b, &mut rng, "window16", &small, Some(16), None),
        attention_with(b, &mut rng, "window300", &long, Some(300), None),
    ]
});

op_parity!(attention_sliding_window_prefill, tol = F32_TOL, |b, rng| {
    // Chunks longer than the window, over cached prefixes, mixed with decode rows; the tiled prefill kernel (head
    // dim 64) and the per-row fallback (256, Gemma's heads).
    let seqs = &[(37, 37), (20, 100), (1, 50), (40, 48), (2, 700), (1, 1)];
    let tiled = Attn { heads: 8, kv_heads: 4, head_dim: 64, block_size: 16, seqs };
    let wide = Attn { heads: 4, kv_heads: 2, head_dim: 256, block_size: 16, seqs: &[(30, 30), (9, 40), (1, 45)] };
    vec![
        attention_with(b, &mut rng, "tiled", &tiled, Some(16), None),
        attention_with(b, &mut rng, "tiled_window_past_tile", &tiled, Some(70), None),
        attention_with(b, &mut rng, "wide", &wide, Some(16), None),
    ]
});

op_parity!(attention_soft_capped, tol = F32_TOL, |b, rng| {
    // Gemma 2: capped scores, on a sliding-window layer and a global one, decode and prefill rows.
    let seqs = &[(30, 30), (1, 300), (5, 60), (1, 7)];
    let c = Attn { heads: 8, kv_heads: 4, head_dim: 64, block_size: 16, seqs };
    vec![
        attention_with(b, &mut rng, "global", &c, None, Some(0.5)),
        attention_with(b, &mut rng, "window", &c, Some(16), Some(0.5)),
    ]
});

op_parity!(attention_decode_ragged_gqa, tol = F32_TOL, |b, rng| {
    let seqs = &[(1, 1), (1, 15), (1, 16), (1, 17), (1, 33), (1, 200)];
    let c = Attn { heads: 9, kv_heads: 3, head_dim: 64, block_size: 16, seqs };
    vec![attention(b, &mut rng, "out", &c)]
});

op_parity!(attention_decode_split_kv, tol = F32_TOL, |b, rng| {
    // Partitions of ATTN_MAX_PARTITION (256) keys: 512 fill two exactly; 513, 1100 and 1300 need 3, 5 and 6 (the
    // last one partial).
    let seqs = &[(1, 512), (1, 513), (1, 1100), (1, 7), (1, 1300)];
    let c = Attn { heads: 32, kv_heads: 8, head_dim: 128, block_size: 32, seqs };
    vec![attention(b, &mut rng, "out", &c)]
});

op_parity!(attention_decode_group_larger_than_a_chunk, tol = F32_TOL, |b, rng| {
    // 16 query heads share one kv head (two head chunks per work-group grid row), plus a 12-head group.
    let a = Attn { heads: 16, kv_heads: 1, head_dim: 64, block_size: 64, seqs: &[(1, 600), (1, 64), (1, 65)] };
    let c = Attn { heads: 24, kv_heads: 2, head_dim: 64, block_size: 8, seqs: &[(1, 40), (1, 9)] };
    vec![attention(b, &mut rng, "mqa", &a), attention(b, &mut rng, "group12", &c)]
});

op_parity!(attention_prefill_chunks_over_cached_prefixes, tol = F32_TOL, |b, rng| {
    // Whole prompts, chunks after a cached prefix, a long prefix past one partition, and decode rows, mixed.
    let seqs = &[(37, 37), (20, 100), (1, 50), (5, 5), (16, 48), (2, 700), (1, 1)];
    let c = Attn { heads: 9, kv_heads: 3, head_dim: 64, block_size: 16, seqs };
    vec![attention(b, &mut rng, "out", &c)]
});

op_parity!(attention_every_block_size, tol = F32_TOL, |b, rng| {
    let mut outs = Vec::new();
    for bs in [1, 8, 16, 32, 64, 128] {
        let c =
            Attn { heads: 8, kv_heads: 2, head_dim: 64, block_size: bs, seqs: &[(9, 30), (1, 129), (24, 24), (1, 64)] };
        outs.push(attention(b, &mut rng, "out", &c));
    }
    outs
});

op_parity!(attention_head_dims, tol = F32_TOL, |b, rng| {
    let mut outs = Vec::new();
    // 80 and 96: not powers of two; 128 with plain multi-head attention, the tiled prefill's largest head; 256 and
    // 320: prefill rows fall back to the per-row kernel.
    for (heads, kv_heads, head_dim) in [(4, 2, 80), (6, 3, 96), (4, 4, 128), (4, 1, 256), (2, 1, 320)] {
        let c = Attn { heads, kv_heads, head_dim, block_size: 16, seqs: &[(13, 20), (1, 33), (3, 3)] };
        outs.push(attention(b, &mut rng, "out", &c));
    }
    outs
});

op_parity!(attention_batch_shape_changes_between_calls, tol = F32_TOL, |b, rng| {
    // The OpenCL backend reuses its work split while the batch shape stays the same: change it and come back.
    let a = Attn { heads: 9, kv_heads: 3, head_dim: 64, block_size: 16, seqs: &[(5, 20), (1, 600)] };
    let c = Attn { heads: 9, kv_heads: 3, head_dim: 64, block_size: 16, seqs: &[(1, 21), (1, 601), (3, 3)] };
    vec![attention(b, &mut rng, "a", &a), attention(b, &mut rng, "c", &c), attention(b, &mut rng, "a again", &a)]
});

// ------------------------------------------------------------------------------------------------ encoder ops

/// LayerNorm with a bias over hidden sizes odd and even, below and above one work-group's width, with and without
/// the residual folded in.
fn layer_norm<B: Backend>(b: &B, rng: &mut StdRng, with_residual: bool) -> Vec<backends::Output> {
    let mut outs = Vec::new();
    for (rows, hidden) in [(7, 384), (3, 1001), (1, 768), (5, 37), (2, 4099)] {
        // An offset mean, so the variance is not the mean square.
        let x: Vec<f32> = random(rng, rows * hidden, 2.0).into_iter().map(|v| v + 0.75).collect();
        let x = b.upload_f32(&x).unwrap();
        let vector = |v: Vec<f32>| b.upload_weight(&Tensor::from_vec(v, hidden, &Device::Cpu).unwrap()).unwrap();
        let (w, bias) = (vector(random(rng, hidden, 1.5)), vector(random(rng, hidden, 0.5)));
        let residual = with_residual.then(|| b.upload_f32(&random(rng, rows * hidden, 2.0)).unwrap());
        let out = poisoned(b, rows * hidden);
        let op = Op::LayerNorm {
            x: &x,
            residual: residual.as_ref(),
            weight: &w,
            bias: &bias,
            out: &out,
            rows,
            hidden,
            eps: 1e-12,
        };
        b.run(op).unwrap();
        outs.push(("out", b.download_f32(&out).unwrap(), hidden));
        if let Some(r) = &residual {
            outs.push(("residual (unchanged)", b.download_f32(r).unwrap(), hidden));
        }
    }
    outs
}

op_parity!(layer_norm_plain, tol = F32_TOL, |b, rng| { layer_norm(b, &mut rng, false) });
op_parity!(layer_norm_residual, tol = F32_TOL, |b, rng| { layer_norm(b, &mut rng, true) });

op_parity!(gelu_erf, tol = F32_TOL, |b, rng| {
    let mut outs = Vec::new();
    for len in [64, 1001, 10_007] {
        let x = b.upload_f32(&random(&mut rng, len, 6.0)).unwrap();
        let out = poisoned(b, len);
        b.run(Op::Gelu { x: &x, out: &out, len }).unwrap();
        // Compared whole: far below zero, 1 + erf is a difference of nearly equal values on either side.
        outs.push(("out", b.download_f32(&out).unwrap(), len));
    }
    outs
});

/// Encoder attention over sequences of the given lengths (`num_heads` heads of `head_dim`), compared per head.
fn encoder_attention<B: Backend>(
    b: &B,
    rng: &mut StdRng,
    lens: &[u32],
    num_heads: usize,
    head_dim: usize,
) -> backends::Output {
    let mut starts = vec![0u32];
    lens.iter().for_each(|l| starts.push(starts.last().unwrap() + l));
    let num_tokens = *starts.last().unwrap() as usize;
    let width = num_heads * head_dim;
    let qkv = b.upload_f32(&random(rng, num_tokens * 3 * width, 2.0)).unwrap();
    let query_start = b.upload_u32(&starts).unwrap();
    let out = poisoned(b, num_tokens * width);
    let op = Op::EncoderAttention {
        qkv: &qkv,
        query_start: &query_start,
        out: &out,
        num_seqs: lens.len(),
        num_tokens,
        num_heads,
        head_dim,
        scale: 1.0 / (head_dim as f32).sqrt(),
    };
    b.run(op).unwrap();
    ("out", b.download_f32(&out).unwrap(), head_dim)
}

op_parity!(encoder_attention_shapes, tol = F32_TOL, |b, rng| {
    vec![
        // One token alone; several sequences of 1 to 70 rows (more keys than one step of the online softmax).
        encoder_attention(b, &mut rng, &[1], 2, 64),
        encoder_attention(b, &mut rng, &[5, 1, 70, 3], 4, 64),
        // BERT-base's heads over a sequence longer than two steps; a head dim not a multiple of 4.
        encoder_attention(b, &mut rng, &[130, 2], 12, 64),
        encoder_attention(b, &mut rng, &[4, 7], 3, 6),
        // Head dims of one pass (128) and of several (200, 258: the keys are scored once a pass).
        encoder_attention(b, &mut rng, &[65, 9], 2, 128),
        encoder_attention(b, &mut rng, &[12, 1], 1, 200),
        encoder_attention(b, &mut rng, &[3, 20], 1, 258),
    ]
});

// ------------------------------------------------------------------------------------------------ bad input

#[test]
fn out_of_range_indices_are_errors() {
    let Some(b) = backends::shared_opencl() else { return };
    let b = &*b;
    let table = weight(b, vec![0.5; 40], 10, 4, DType::F32);
    let out = b.alloc_f32(8).unwrap();
    let ids = b.upload_u32(&[3, 10]).unwrap();
    let e =
        b.run(Op::Embedding { table: &table, ids: &ids, out: &out, num_tokens: 2, hidden: 4, scale: 1.0 }).unwrap_err();
    assert!(e.to_string().contains("outside the vocabulary"), "{e}");

    let (qkv, q, cache) = (b.upload_f32(&[1.0; 24]).unwrap(), b.alloc_f32(8).unwrap(), b.alloc_f32(4 * 8).unwrap());
    let (slots, pos, freq) =
        (b.upload_u32(&[4]).unwrap(), b.upload_u32(&[0]).unwrap(), b.upload_f32(&[1.0; 4]).unwrap());
    let op = Op::RopeWriteKv {
        io: RopeIo {
            qkv: &qkv,
            positions: &pos,
            inv_freq: &freq,
            q_out: &q,
            k_cache: &cache,
            v_cache: &cache,
            slot_mapping: &slots,
        },
        qk_norm: None,
        num_tokens: 1,
        num_heads: 1,
        num_kv_heads: 1,
        head_dim: 8,
        block_size: 2,
        mscale: 1.0,
    };
    assert!(b.run(op).unwrap_err().to_string().contains("outside the cache"));

    let rows = b.upload_u32(&[2]).unwrap();
    let x = b.upload_f32(&[0.0; 8]).unwrap();
    let e = b.run(Op::GatherRows { x: &x, rows: &rows, out: &out, num_rows: 1, width: 4 }).unwrap_err();
    assert!(e.to_string().contains("row 2"), "{e}");

    let w = weight(b, vec![0.0; 12], 3, 4, DType::BF16);
    let e = b.run(Op::MatMul { x: &x, w: &w, bias: None, out: &out, m: 2, k: 4, n: 4 }).unwrap_err();
    assert!(e.to_string().contains("op expects [4, 4]"), "{e}");

    // A block table entry past the cache.
    let (qs, ctx, bt) = (b.upload_u32(&[0, 1]).unwrap(), b.upload_u32(&[3]).unwrap(), b.upload_u32(&[0, 9]).unwrap());
    let meta = AttentionMeta::new([&qs, &ctx, &bt], [&[0, 1], &[3], &[0, 9]], 2, 2).unwrap();
    let op = Op::PagedAttention {
        q: &x,
        k_cache: &cache,
        v_cache: &cache,
        out: &out,
        meta: &meta,
        shape: AttnShape {
            num_heads: 1,
            num_kv_heads: 1,
            head_dim: 8,
            block_size: 2,
            scale: 1.0,
            window: None,
            softcap: None,
        },
        sinks: None,
    };
    assert!(b.run(op).unwrap_err().to_string().contains("outside the cache"));

    // Encoder attention whose query starts run past its rows.
    let (qkv, qs) = (b.upload_f32(&[0.5; 2 * 3 * 4]).unwrap(), b.upload_u32(&[0, 3]).unwrap());
    let op = Op::EncoderAttention {
        qkv: &qkv,
        query_start: &qs,
        out: &out,
        num_seqs: 1,
        num_tokens: 2,
        num_heads: 1,
        head_dim: 4,
        scale: 1.0,
    };
    assert!(b.run(op).unwrap_err().to_string().contains("query start 3"));
}

// ------------------------------------------------------------------------------------------------ routed experts

/// One mixture-of-experts MLP through the four ops (route, group, gate/up multiply, activation, down multiply,
/// combine), and through the two ungrouped ones after the same routing (equal to the grouped result): one token (each pair alone in a tile), decode-sized batches, routing skewed so one expert's pairs fill
/// several tiles, a prefill-sized batch (the tiled multiply), widths that do not split into 8-value pieces,
/// renormalised and plain top-k weights, f32 and 16-bit expert weights, with and without gpt-oss's per-expert
/// biases (`MoeBias` after each multiply). Each case also runs as expert parallelism
/// would, over two disjoint shares of the experts (the skewed expert inside one and outside the other): the two
/// partial outputs must add up to the whole layer's on the same backend.
fn moe<B: Backend>(b: &B, rng: &mut StdRng, dtype: DType) -> Vec<backends::Output> {
    use rserve_engine::backend::{moe_max_tiles, HeldExperts, MoeInput, MoeTiles};
    let mut outs = Vec::new();
    for (tokens, experts, top_k, hidden, inter, renormalize, skew, cut, with_bias) in [
        (1, 8, 2, 64, 48, true, 0.0, 3, false),
        (1, 8, 2, 64, 48, true, 0.0, 3, true),
        (5, 60, 4, 96, 40, false, 0.0, 31, true),
        (37, 16, 2, 64, 24, true, 4.0, 3, false),
        // Widths not a multiple of 8: 16-bit experts through the scalar loads.
        (3, 8, 2, 36, 20, true, 0.0, 4, true),
        // Prefill-sized: 300 tokens over 8 experts fill several 64-row blocks per expert (the tiled multiply), one
        // expert skewed so blocks also split between experts.
        (300, 8, 2, 72, 40, false, 1.0, 4, true),
    ] {
        let x = b.upload_f32(&random(rng, tokens * hidden, 1.0)).unwrap();
        let mut logits = random(rng, tokens * experts, 2.0);
        // Skewed routing: expert 3 first for every token, so its pairs span several tiles.
        logits.chunks_mut(experts).for_each(|l| l[3] += skew);
        let logits = b.upload_f32(&logits).unwrap();
        let (gate_up, down) =
            (random(rng, experts * 2 * inter * hidden, 0.2), random(rng, experts * hidden * inter, 0.2));
        let (gate_up_bias, down_bias) = (random(rng, experts * 2 * inter, 0.5), random(rng, experts * hidden, 0.5));
        let pairs = tokens * top_k;
        let ids = b.alloc_u32_output(pairs).unwrap();
        let weights = poisoned(b, pairs);
        b.run(Op::MoeRoute {
            logits: &logits,
            ids: &ids,
            weights: &weights,
            rows: tokens,
            experts,
            top_k,
            renormalize,
        })
        .unwrap();
        // Experts `first .. first + held` of the layer (all of them, or one share).
        let layer = |first: usize, held: usize| {
            let gate_up = &gate_up[first * 2 * inter * hidden..(first + held) * 2 * inter * hidden];
            let gate_up = weight(b, gate_up.to_vec(), held * 2 * inter, hidden, dtype);
            let down = &down[first * hidden * inter..(first + held) * hidden * inter];
            let down = weight(b, down.to_vec(), held * hidden, inter, dtype);
            let max_tiles = moe_max_tiles(pairs, held);
            let rows = max_tiles * rserve_kernels::launch::MOE_TILE_M;
            let (sorted, tile_expert, slot) = (
                b.alloc_u32_output(rows).unwrap(),
                b.alloc_u32_output(max_tiles).unwrap(),
                b.alloc_u32_output(pairs).unwrap(),
            );
            let tiles = MoeTiles { sorted: &sorted, tile_expert: &tile_expert, slot: &slot, max_tiles };
            b.run(Op::MoeAlign { ids: &ids, tiles: &tiles, pairs, experts: held, first_expert: first }).unwrap();
            let h = b.alloc_f32(rows * 2 * inter).unwrap();
            let input = MoeInput::Tokens { top_k, tokens };
            b.run(Op::MoeMatMul { x: &x, w: &gate_up, tiles: &tiles, input, out: &h, k: hidden, n: 2 * inter })
                .unwrap();
            let rows_of = |v: &[f32], width: usize| b.upload_f32(&v[first * width..(first + held) * width]).unwrap();
            if with_bias {
                let bias = rows_of(&gate_up_bias, 2 * inter);
                b.run(Op::MoeBias { x: &h, bias: &bias, tiles: &tiles, width: 2 * inter }).unwrap();
            }
            let act = b.alloc_f32(rows * inter).unwrap();
            // gpt-oss's experts: biases and its clamped SwiGLU together.
            let act_kind = if with_bias { Activation::SwigluOai } else { Activation::Silu };
            b.run(Op::GatedAct { gate_up: &h, out: &act, rows, width: inter, act: act_kind }).unwrap();
            let y = b.alloc_f32(rows * hidden).unwrap();
            let input = MoeInput::Slots;
            b.run(Op::MoeMatMul { x: &act, w: &down, tiles: &tiles, input, out: &y, k: inter, n: hidden }).unwrap();
            if with_bias {
                let bias = rows_of(&down_bias, hidden);
                b.run(Op::MoeBias { x: &y, bias: &bias, tiles: &tiles, width: hidden }).unwrap();
            }
            let out = poisoned(b, tokens * hidden);
            b.run(Op::MoeCombine {
                y: &y,
                tiles: &tiles,
                weights: &weights,
                out: &out,
                rows: tokens,
                top_k,
                width: hidden,
            })
            .unwrap();
            // The same layer without grouping (`MoePairGateUp`, `MoePairDown`): poisoned buffers, so a pair routed
            // to experts not held here must be neither written nor read.
            let held = HeldExperts { first, count: held };
            let (gu_bias, d_bias) =
                (with_bias.then(|| rows_of(&gate_up_bias, 2 * inter)), with_bias.then(|| rows_of(&down_bias, hidden)));
            let pair_act = poisoned(b, pairs * inter);
            b.run(Op::MoePairGateUp {
                x: &x,
                w: &gate_up,
                bias: gu_bias.as_ref(),
                ids: &ids,
                out: &pair_act,
                tokens,
                top_k,
                k: hidden,
                width: inter,
                held,
                act: act_kind,
            })
            .unwrap();
            let pair_out = poisoned(b, tokens * hidden);
            b.run(Op::MoePairDown {
                x: &pair_act,
                w: &down,
                bias: d_bias.as_ref(),
                ids: &ids,
                weights: &weights,
                out: &pair_out,
                tokens,
                top_k,
                k: inter,
                n: hidden,
                held,
            })
            .unwrap();
            (b.download_f32(&out).unwrap(), b.download_f32(&pair_out).unwrap())
        };
        let (whole, whole_pairs) = layer(0, experts);
        let ((low, low_pairs), (high, high_pairs)) = (layer(0, cut), layer(cut, experts - cut));
        for (i, w) in whole.iter().enumerate() {
            let sum = low[i] + high[i];
            assert!((sum - w).abs() <= 1e-4 * (1.0 + w.abs()), "shares {cut}/{}: {sum} vs {w} at {i}", experts - cut);
            let pair_sum = low_pairs[i] + high_pairs[i];
            for (v, what) in [(whole_pairs[i], "ungrouped"), (pair_sum, "ungrouped shares")] {
                assert!((v - w).abs() <= 1e-4 * (1.0 + w.abs()), "{what}: {v} vs grouped {w} at {i}");
            }
        }
        outs.push(("weights", b.download_f32(&weights).unwrap(), top_k));
        outs.push(("out", whole, hidden));
        outs.push(("out of the second share", high, hidden));
        outs.push(("ungrouped out", whole_pairs, hidden));
        outs.push(("ungrouped out of the second share", high_pairs, hidden));
    }
    outs
}

op_parity!(moe_f32, tol = F32_TOL, |b, rng| { moe(b, &mut rng, DType::F32) });
op_parity!(moe_bf16, tol = HALF_TOL, |b, rng| { moe(b, &mut rng, DType::BF16) });
op_parity!(moe_f16, tol = HALF_TOL, |b, rng| { moe(b, &mut rng, DType::F16) });

// ------------------------------------------------------------------------------------------------ sampling

op_parity!(adjust_logits, tol = F32_TOL, |b, rng| {
    // Distinct (row, token) pairs (every row's first and last token, random others): repetition penalties on
    // positive and negative logits, additive edits alone, both; more edits than one work-group.
    let (rows, vocab) = (5usize, 1000usize);
    let logits = b.upload_f32(&random(&mut rng, rows * vocab, 4.0)).unwrap();
    let mut pairs: Vec<(u32, u32)> = (0..rows as u32).flat_map(|r| [(r, 0), (r, vocab as u32 - 1)]).collect();
    while pairs.len() < 300 {
        let p = (rng.gen_range(0..rows as u32), rng.gen_range(0..vocab as u32));
        if !pairs.contains(&p) {
            pairs.push(p);
        }
    }
    let (mut edits, mut values) = (Vec::new(), Vec::new());
    for (i, &(r, t)) in pairs.iter().enumerate() {
        edits.extend([r, t]);
        let mul = if i % 3 == 0 { 1.0 } else { rng.gen_range(0.5..2.0) };
        let add = if i % 3 == 1 { 0.0 } else { rng.gen_range(-2.0..2.0) };
        values.extend([mul, add]);
    }
    let (edits, values) = (b.upload_u32(&edits).unwrap(), b.upload_f32(&values).unwrap());
    let count = pairs.len();
    b.run(Op::AdjustLogits { logits: &logits, edits: &edits, values: &values, count, rows, vocab }).unwrap();
    vec![("logits", b.download_f32(&logits).unwrap(), vocab)]
});

op_parity!(row_logprobs, tol = 1e-4, |b, rng| {
    // Logits in quarter steps (many ties: equal logits come lower id first), masked tokens in the wide rows, a
    // constant row, rows that want nothing, no alternatives, some, the most; a vocabulary smaller than the request.
    const W: usize = 1 + LOGPROBS_MAX_TOP;
    let want = [NO_LOGPROBS, 0, 1, 5, LOGPROBS_MAX_TOP as u32, 3];
    let rows = want.len();
    let mut outs = Vec::new();
    for vocab in [3000usize, 37, 7] {
        let mut l: Vec<f32> = (0..rows * vocab).map(|_| rng.gen_range(-16..16) as f32 * 0.25).collect();
        if vocab > 100 {
            for _ in 0..rows * vocab / 10 {
                let i = rng.gen_range(0..l.len());
                l[i] = f32::NEG_INFINITY;
            }
        }
        l[4 * vocab..5 * vocab].fill(1.5);
        let ids: Vec<u32> = (0..rows).map(|_| rng.gen_range(0..vocab as u32)).collect();
        for (r, &id) in ids.iter().enumerate() {
            l[r * vocab + id as usize] = 0.75;
        }
        let logits = b.upload_f32(&l).unwrap();
        let (ids, want) = (b.upload_u32(&ids).unwrap(), b.upload_u32(&want).unwrap());
        // Finite markers where nothing is written, so both backends must leave the same entries alone.
        let values = b.upload_f32(&vec![-99.0; rows * W]).unwrap();
        let top_ids = b.upload_u32(&vec![0xdead; rows * LOGPROBS_MAX_TOP]).unwrap();
        b.run(Op::RowLogprobs {
            logits: &logits,
            ids: &ids,
            want: &want,
            values: &values,
            top_ids: &top_ids,
            rows,
            vocab,
        })
        .unwrap();
        outs.push(("values", b.download_f32(&values).unwrap(), W));
        // One id a vector: any difference is a relative error of at least 1 / vocab.
        let top = b.download_u32(&top_ids, rows * LOGPROBS_MAX_TOP).unwrap();
        outs.push(("top_ids", top.into_iter().map(|t| t as f32).collect(), 1));
    }
    outs
});

op_parity!(sample_rows_greedy, tol = 0.0, |b, rng| {
    // Greedy rows (temperature 0, below 1e-5, top-k 1 at a high temperature) take the CPU's argmax exactly: ties
    // to the lowest index, NaN never; rows with nothing finite give 0; a row with one finite token always draws it.
    let vocab = 1000;
    let greedy = RowParams::GREEDY;
    let hot = RowParams { temperature: 1.0, seed: 5, ..greedy };
    let plain = random(&mut rng, vocab, 4.0);
    let mut tied = random(&mut rng, vocab, 4.0);
    for i in [10, 500, 999] {
        tied[i] = 9.0;
    }
    let mut holes = random(&mut rng, vocab, 4.0);
    for i in [3, 77, 400] {
        holes[i] = f32::NAN;
    }
    holes[5] = f32::NEG_INFINITY;
    holes[6] = 8.0;
    let mut one = vec![f32::NEG_INFINITY; vocab];
    one[613] = -3.0;
    let rows: Vec<(Vec<f32>, RowParams)> = vec![
        (plain, greedy),
        (tied.clone(), greedy),
        (tied, RowParams { top_k: 1, temperature: 2.0, ..hot }),
        (holes.clone(), greedy),
        (holes, RowParams { temperature: 1e-6, ..hot }),
        (vec![f32::NEG_INFINITY; vocab], greedy),
        (vec![f32::NEG_INFINITY; vocab], hot),
        (one.clone(), RowParams { top_p: 0.9, ..hot }),
        (one, RowParams { top_k: 20, min_p: 0.1, ..hot }),
    ];
    let n = rows.len();
    let logits = b.upload_f32(&rows.iter().flat_map(|(l, _)| l.clone()).collect::<Vec<_>>()).unwrap();
    let params = b.upload_u32(&rows.iter().flat_map(|(_, p)| p.pack()).collect::<Vec<_>>()).unwrap();
    let ids = b.upload_u32(&vec![u32::MAX; n]).unwrap();
    b.run(Op::SampleRows { logits: &logits, params: &params, ids: &ids, rows: n, vocab }).unwrap();
    vec![("ids", b.download_u32(&ids, n).unwrap().into_iter().map(|t| t as f32).collect(), 1)]
});

/// A sampling test on every backend present: `$body` runs with `$dev` the backend's name on the CPU reference,
/// OpenCL and CUDA (where present) and checks its own results; on the Level Zero null driver (a child process, as
/// `op_parity!`) it runs with `$dev` None: the call sequence only, nothing to check.
macro_rules! every_backend {
    ($name:ident, |$b:ident, $dev:ident| $body:block) => {
        #[test]
        fn $name() {
            fn case<B: Backend>($b: &B, $dev: Option<&str>) $body
            if level_zero_support::in_child() {
                let lz = rserve_engine::backend::level_zero::open("level-zero").expect("the null driver's device");
                case(&lz, None);
                println!("LZ-OPS: ok");
                return;
            }
            case(&rserve_engine::backend::cpu::CpuBackend::new(), Some("cpu"));
            if let Some(cl) = backends::shared_opencl() {
                case(&*cl, Some("opencl"));
            }
            if let Some(gpu) = backends::shared_cuda() {
                case(&*gpu, Some("cuda"));
            }
            level_zero_support::null_driver_case(stringify!($name));
        }
    };
}

/// Token counts of `draws` draws from `logits` under `p` at output positions 0 .. draws: many rows of the same
/// logits per launch.
fn draw_counts<B: Backend>(b: &B, logits: &[f32], p: RowParams, draws: usize) -> Vec<u64> {
    let vocab = logits.len();
    let rows = draws.min(10_000);
    let l = b.upload_f32(&logits.repeat(rows)).unwrap();
    let ids = b.upload_u32(&vec![u32::MAX; rows]).unwrap();
    let mut counts = vec![0u64; vocab];
    for start in (0..draws).step_by(rows) {
        let params: Vec<u32> = (0..rows).flat_map(|i| RowParams { position: (start + i) as u64, ..p }.pack()).collect();
        let params = b.upload_u32(&params).unwrap();
        b.run(Op::SampleRows { logits: &l, params: &params, ids: &ids, rows, vocab }).unwrap();
        for id in b.download_u32(&ids, rows).unwrap() {
            // (The null driver computes nothing.)
            if let Some(c) = counts.get_mut(id as usize) {
                *c += 1;
            }
        }
    }
    counts
}

/// `draws` draws on the device fit the exact distribution (`sampling::reference`, chi-square at p = 0.001).
fn check_distribution<B: Backend>(b: &B, dev: Option<&str>, logits: &[f32], p: RowParams, draws: usize) {
    let counts = draw_counts(b, logits, p, draws);
    let Some(dev) = dev else { return };
    let probs = reference::distribution(logits, &p);
    let (stat, dof) = reference::chi_square(&counts, &probs, draws as u64);
    let limit = reference::chi_square_limit(dof);
    assert!(stat < limit, "{dev}: {p:?}: chi-square {stat:.1} with {dof} dof (limit {limit:.1})");
}

/// The logits of the distribution tests: 300 tokens with ties (the sampler's own unit test uses the same).
fn sampling_logits() -> Vec<f32> {
    (0..300).map(|i| ((i * 37 % 101) as f32 * 0.05).sin() * 2.5).collect()
}

const DIST_BASE: RowParams = RowParams { temperature: 1.0, seed: 7, ..RowParams::GREEDY };

every_backend!(sample_rows_temperature, |b, dev| {
    check_distribution(b, dev, &sampling_logits(), DIST_BASE, 100_000);
});
every_backend!(sample_rows_cold, |b, dev| {
    check_distribution(b, dev, &sampling_logits(), RowParams { temperature: 0.7, ..DIST_BASE }, 100_000);
});
every_backend!(sample_rows_top_k, |b, dev| {
    check_distribution(b, dev, &sampling_logits(), RowParams { top_k: 20, ..DIST_BASE }, 100_000);
});
every_backend!(sample_rows_top_p, |b, dev| {
    let p = RowParams { top_p: 0.9, temperature: 0.7, ..DIST_BASE };
    check_distribution(b, dev, &sampling_logits(), p, 100_000);
});
every_backend!(sample_rows_min_p, |b, dev| {
    check_distribution(b, dev, &sampling_logits(), RowParams { min_p: 0.1, ..DIST_BASE }, 100_000);
});
every_backend!(sample_rows_all_filters, |b, dev| {
    let p = RowParams { top_k: 50, top_p: 0.8, min_p: 0.05, temperature: 1.3, ..DIST_BASE };
    check_distribution(b, dev, &sampling_logits(), p, 100_000);
});
every_backend!(sample_rows_greedy_draws, |b, dev| {
    check_distribution(b, dev, &sampling_logits(), RowParams { temperature: 0.0, ..DIST_BASE }, 100_000);
});
every_backend!(sample_rows_wide_vocabulary, |b, dev| {
    // Several tokens per work-item of a draw (2500 over 1024 work-items, the last chunks short): the scan of chunk
    // sums and the re-scan of one chunk.
    let logits = random(&mut backends::rng(3), 2500, 3.0);
    let p = RowParams { top_p: 0.95, top_k: 400, temperature: 0.8, ..DIST_BASE };
    check_distribution(b, dev, &logits, p, 20_000);
});

every_backend!(sample_rows_seeded_row_in_any_batch, |b, dev| {
    // A seeded row draws the same token alone, at any place of a batch of any size, among rows of other logits and
    // parameters.
    let vocab = 3000;
    let mut rng = backends::rng(11);
    let logits = random(&mut rng, vocab, 3.0);
    let mut seen = Vec::new();
    for position in 0..6u64 {
        let p = RowParams { temperature: 0.8, top_p: 0.9, top_k: 100, seed: 42, position, ..RowParams::GREEDY };
        let mut got = Vec::new();
        for (batch, at) in [(1usize, 0usize), (5, 2), (37, 36), (64, 0)] {
            let mut l = random(&mut rng, batch * vocab, 3.0);
            l[at * vocab..(at + 1) * vocab].copy_from_slice(&logits);
            let params: Vec<u32> = (0..batch)
                .flat_map(|r| {
                    let other =
                        RowParams { temperature: rng.gen_range(0.5..1.5), seed: rng.gen(), ..RowParams::GREEDY };
                    (if r == at { p } else { other }).pack()
                })
                .collect();
            let (l, params) = (b.upload_f32(&l).unwrap(), b.upload_u32(&params).unwrap());
            let ids = b.upload_u32(&vec![u32::MAX; batch]).unwrap();
            b.run(Op::SampleRows { logits: &l, params: &params, ids: &ids, rows: batch, vocab }).unwrap();
            got.push(b.download_u32(&ids, batch).unwrap()[at]);
        }
        if let Some(dev) = dev {
            assert!(got.iter().all(|&t| t == got[0] && (t as usize) < vocab), "{dev}: position {position}: {got:?}");
        }
        seen.push(got[0]);
    }
    if let Some(dev) = dev {
        // Different positions draw from the stream's different places (not all the same token).
        assert!(seen.iter().any(|&t| t != seen[0]), "{dev}: {seen:?}");
    }
});

every_backend!(argmax_rows_takes_the_lowest_index_of_the_maximum, |b, dev| {
    // Rows of several widths (shorter and longer than a work-group) with planted ties, NaNs and -inf rows, against
    // the host sampler's rule (`sampling::draw::argmax`): the lowest index among equal maxima, NaN never wins, 0 for a
    // row without a number above -inf.
    let mut rng = backends::rng(19);
    for (rows, width) in [(1usize, 7usize), (5, 300), (64, 2500), (3, 32_000)] {
        let mut x = random(&mut rng, rows * width, 4.0);
        for r in 0..rows {
            let row = &mut x[r * width..(r + 1) * width];
            match r % 4 {
                1 => {
                    let (a, c) = (rng.gen_range(0..width), rng.gen_range(0..width));
                    (row[a], row[c]) = (9.0, 9.0);
                }
                2 => {
                    row[rng.gen_range(0..width)] = f32::NAN;
                    row[0] = f32::NAN;
                }
                3 if r == 3 => row.iter_mut().for_each(|v| *v = f32::NEG_INFINITY),
                _ => {}
            }
        }
        let want: Vec<u32> = x.chunks(width).map(rserve_engine::backend::sampling::draw::argmax).collect();
        let (xb, out) = (b.upload_f32(&x).unwrap(), b.upload_u32(&vec![u32::MAX; rows]).unwrap());
        b.run(Op::ArgmaxRows { x: &xb, out: &out, rows, width }).unwrap();
        let got = b.download_u32(&out, rows).unwrap();
        if let Some(dev) = dev {
            assert_eq!(got, want, "{dev}: {rows} rows of {width}");
        }
    }
});
