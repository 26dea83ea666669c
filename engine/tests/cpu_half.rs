//! The CPU backend's 16-bit paths against its f32 paths: matrix multiplies with bf16 / f16 weights (one matrix and a
//! fused projection kept as parts) at m = 1, 7 and 64, and paged attention over a bf16 / f16 KV cache written by
//! `RopeWriteKv`. The 16-bit results differ from f32 only by the rounding of weights or cached keys and values to
//! 16 bits (bf16: 8 significant bits, a relative 2^-9 per value; f16: 11 bits), which over sums of random-sign
//! terms stays under 1e-2 of the output's largest value (bf16) and 2e-3 (f16).

use candle_core::{DType, Device, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rserve_engine::backend::cpu::CpuBackend;
use rserve_engine::backend::{AttentionMeta, AttnShape, Backend, Op, RopeIo, WeightDType};

fn random(rng: &mut StdRng, len: usize, scale: f32) -> Vec<f32> {
    (0..len).map(|_| rng.gen_range(-scale..scale)).collect()
}

/// max |a - b| / max |b|.
fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    assert!(a.iter().all(|v| v.is_finite()), "non-finite output");
    let diff = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max);
    diff / b.iter().map(|v| v.abs()).fold(f32::MIN_POSITIVE, f32::max)
}

fn tolerance(dtype: DType) -> f32 {
    if dtype == DType::F16 {
        2e-3
    } else {
        1e-2
    }
}

fn tensor(data: &[f32], rows: usize, cols: usize, dtype: DType) -> Tensor {
    Tensor::from_slice(data, (rows, cols), &Device::Cpu).unwrap().to_dtype(dtype).unwrap()
}

fn matmul(
    b: &CpuBackend,
    w: &<CpuBackend as Backend>::Buffer,
    x: &[f32],
    bias: Option<&[f32]>,
    m: usize,
    k: usize,
    n: usize,
) -> Vec<f32> {
    let x = b.upload_f32(x).unwrap();
    let bias = bias.map(|v| b.upload_f32(v).unwrap());
    let out = b.upload_f32(&vec![f32::NAN; m * n]).unwrap();
    b.run(Op::MatMul { x: &x, w, bias: bias.as_ref(), out: &out, m, k, n }).unwrap();
    b.download_f32(&out).unwrap()
}

#[test]
fn sixteen_bit_weights_multiply_as_their_f32_values_at_batch_1_7_and_64() {
    let b = CpuBackend::new();
    let mut rng = StdRng::seed_from_u64(27);
    // A fused q/k/v-shaped weight of three parts with a bias, k with a tail beyond the SIMD width.
    let (k, parts) = (200, [48, 16, 16]);
    let n: usize = parts.iter().sum();
    let w = random(&mut rng, n * k, 0.1);
    let bias = random(&mut rng, n, 0.5);
    let w32 = b.upload_weight(&tensor(&w, n, k, DType::F32)).unwrap();
    for m in [1, 7, 64] {
        let x = random(&mut rng, m * k, 1.0);
        let want = matmul(&b, &w32, &x, Some(&bias), m, k, n);
        for dtype in [DType::BF16, DType::F16] {
            let whole = b.upload_weight(&tensor(&w, n, k, dtype)).unwrap();
            let mut rows = 0;
            let split: Vec<Tensor> = parts
                .iter()
                .map(|&r| {
                    rows += r;
                    tensor(&w[(rows - r) * k..rows * k], r, k, dtype)
                })
                .collect();
            let fused = b.upload_weight_rows(&split.iter().collect::<Vec<_>>()).unwrap();
            let got = matmul(&b, &whole, &x, Some(&bias), m, k, n);
            let got_fused = matmul(&b, &fused, &x, Some(&bias), m, k, n);
            let e = rel_err(&got, &want);
            assert!(e < tolerance(dtype), "{dtype:?} m={m}: relative error {e}");
            // The parts fill their own columns: the same numbers as the stacked matrix.
            assert_eq!(got_fused, got, "{dtype:?} m={m}: fused parts differ from the stacked matrix");
        }
    }
}

/// Writes random q/k/v rows of a prefill chunk and a few decode rows into a cache of `dtype` through `RopeWriteKv`,
/// then attends over it: the attention output and q.
fn write_and_attend(b: &CpuBackend, dtype: WeightDType, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    let (heads, kv_heads, hd, bs) = (8, 2, 64, 16);
    let num_blocks = 12;
    let len = num_blocks * bs * kv_heads * hd;
    let (kc, vc) = (b.alloc_kv_cache(len, dtype).unwrap(), b.alloc_kv_cache(len, dtype).unwrap());
    // Two sequences: 40 tokens (blocks 5, 2, 9) and 20 tokens (blocks 0, 7), every token written in one step.
    let tables: Vec<u32> = vec![5, 2, 9, 0, 7, 0];
    let seqs = [(40usize, 0usize), (20, 1)];
    let mut slots = Vec::new();
    let mut positions = Vec::new();
    for &(n, s) in &seqs {
        for t in 0..n {
            slots.push(tables[s * 3 + t / bs] * bs as u32 + (t % bs) as u32);
            positions.push(t as u32);
        }
    }
    let n = slots.len();
    let qkv = b.upload_f32(&random(&mut rng, n * (heads + 2 * kv_heads) * hd, 2.0)).unwrap();
    let q = b.upload_f32(&vec![f32::NAN; n * heads * hd]).unwrap();
    let freq: Vec<f32> = (0..hd / 2).map(|i| 1.0 / 10000f32.powf(2.0 * i as f32 / hd as f32)).collect();
    let (pos, freq, slot_buf) =
        (b.upload_u32(&positions).unwrap(), b.upload_f32(&freq).unwrap(), b.upload_u32(&slots).unwrap());
    let io = RopeIo {
        qkv: &qkv,
        positions: &pos,
        inv_freq: &freq,
        q_out: &q,
        k_cache: &kc,
        v_cache: &vc,
        slot_mapping: &slot_buf,
    };
    b.run(Op::RopeWriteKv {
        io,
        qk_norm: None,
        num_tokens: n,
        num_heads: heads,
        num_kv_heads: kv_heads,
        head_dim: hd,
        block_size: bs,
        mscale: 1.0,
    })
    .unwrap();
    let query_start = vec![0u32, 40, 60];
    let context_lens = vec![40u32, 20];
    let out = b.upload_f32(&vec![f32::NAN; n * heads * hd]).unwrap();
    let (qs_buf, ctx_buf, bt_buf) =
        (b.upload_u32(&query_start).unwrap(), b.upload_u32(&context_lens).unwrap(), b.upload_u32(&tables).unwrap());
    let meta = AttentionMeta::new([&qs_buf, &ctx_buf, &bt_buf], [&query_start, &context_lens, &tables], 3, bs).unwrap();
    b.run(Op::PagedAttention {
        q: &q,
        k_cache: &kc,
        v_cache: &vc,
        out: &out,
        meta: &meta,
        shape: AttnShape {
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim: hd,
            block_size: bs,
            scale: 1.0 / (hd as f32).sqrt(),
            window: None,
            softcap: None,
        },
        sinks: None,
    })
    .unwrap();
    let mut all = b.download_f32(&out).unwrap();
    all.extend(b.download_f32(&q).unwrap());
    all
}

#[test]
fn attention_over_a_16_bit_kv_cache_matches_the_f32_cache() {
    let b = CpuBackend::new();
    let want = write_and_attend(&b, WeightDType::F32, 5);
    for (dtype, tol) in [(WeightDType::BF16, tolerance(DType::BF16)), (WeightDType::F16, tolerance(DType::F16))] {
        let got = write_and_attend(&b, dtype, 5);
        let e = rel_err(&got, &want);
        assert!(e < tol, "{dtype:?}: relative error {e}");
        // Not the f32 numbers: the cache really is 16-bit.
        assert!(e > 0.0, "{dtype:?}: identical to the f32 cache");
    }
}

#[test]
fn the_kv_cache_is_the_compute_dtype_unless_asked_otherwise() {
    let b = CpuBackend::new();
    assert_eq!(b.kv_cache_dtype(WeightDType::F32), WeightDType::F32);
    assert_eq!(b.kv_cache_dtype(WeightDType::BF16), WeightDType::BF16);
    let b = b.with_kv_cache_dtype(Some(WeightDType::F16));
    assert_eq!(b.kv_cache_dtype(WeightDType::F32), WeightDType::F16);
}
