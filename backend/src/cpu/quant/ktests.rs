//! The k-quants (`Q4_K`, `Q5_K`, `Q6_K`): block decoding against candle's (llama.cpp's) dequantization, the packed
//! matmul against the f32 matmul of the dequantized weights for every kernel, SIMD against the portable kernel on
//! arbitrary block bytes, and matrices stacked from mixed formats (a `Q4_K_M` file's fused projections).

use std::borrow::Cow;

use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::{Device, Tensor};
use rand::{Rng, SeedableRng};

use super::kblock::{isums, unpack};
use super::*;

const K_TYPES: [GgmlDType; 3] = [GgmlDType::Q4K, GgmlDType::Q5K, GgmlDType::Q6K];

fn random(rng: &mut rand::rngs::StdRng, len: usize, amp: f32) -> Vec<f32> {
    (0..len).map(|_| rng.gen_range(-amp..amp)).collect()
}

/// `w` quantized by candle's quantizer, as a packed matrix and as candle dequantizes it.
fn pack(w: &[f32], n: usize, k: usize, dtype: GgmlDType) -> (PackedMatrix, Vec<f32>) {
    let t = Tensor::from_slice(w, (n, k), &Device::Cpu).unwrap();
    let q = QTensor::quantize(&t, dtype).unwrap();
    let deq = q.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let p = PackedMatrix::new(Format::from_ggml(dtype).unwrap(), n, k, q.data().unwrap().into_owned()).unwrap();
    (p, deq)
}

/// `n` rows of `k` values of random block bytes (every scale, minimum and high-bit pattern), with finite f16
/// factors; as a packed matrix and as candle dequantizes the same bytes.
fn random_blocks(rng: &mut rand::rngs::StdRng, n: usize, k: usize, dtype: GgmlDType) -> (PackedMatrix, Vec<f32>) {
    let format = Format::from_ggml(dtype).unwrap();
    let mut data: Vec<u8> = (0..n * k / SUPER_BLOCK * format.block_bytes()).map(|_| rng.gen()).collect();
    let f16s: &[usize] = if format == Format::Q6_K { &[208] } else { &[0, 2] };
    for blk in data.chunks_exact_mut(format.block_bytes()) {
        for &at in f16s {
            let v = half::f16::from_f32(rng.gen_range(-0.02f32..0.02));
            blk[at..at + 2].copy_from_slice(&v.to_bits().to_le_bytes());
        }
    }
    let storage = QStorage::from_data(Cow::Borrowed(&data), &Device::Cpu, dtype).unwrap();
    let q = QTensor::new(storage, (n, k)).unwrap();
    let deq = q.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    (PackedMatrix::new(format, n, k, data).unwrap(), deq)
}

/// `sum_i (|d scale (q - offset)| + |dmin min|) |x^_i|` over row `j` of `p` and activation row `i`: bounds every
/// partial sum any kernel forms, and the f32 rounding of the dequantized weights times `x^`.
fn magnitude(p: &PackedMatrix, j: usize, acts: &KQuantActs, i: usize) -> f64 {
    let (format, row) = p.row(j);
    let xq = acts.dequantize_row(i);
    let mut mag = 0f64;
    for (b, blk) in row.chunks_exact(format.block_bytes()).enumerate() {
        let u = unpack(format, blk);
        for t in 0..SUPER_BLOCK {
            let s = t / 16;
            let w = (u.d as f64 * u.scale[s] as f64 * (u.q[t] as i32 - u.offset) as f64).abs()
                + (u.dmin as f64 * u.min[s] as f64).abs();
            mag += w * (xq[b * SUPER_BLOCK + t] as f64).abs();
        }
    }
    mag
}

/// Checks `got` against the f64 product of the dequantized weights `wd` with the quantized activations (what the
/// integer path computes, up to f32 rounding) and with `x` (within half an activation step per value).
///
/// Rounding: each super-block adds two scaled integer sums (three roundings each) and the dequantized weights are
/// themselves rounded twice per value, so `(2 nb + 8) eps` times `magnitude` bounds it.
fn check(got: &[f32], p: &PackedMatrix, wd: &[f32], x: &[f32], [m, k, n]: [usize; 3], what: &str) {
    let acts = KQuantActs::new(x, m, k);
    let nb = k / SUPER_BLOCK;
    for i in 0..m {
        let xq = acts.dequantize_row(i);
        for j in 0..n {
            let w = &wd[j * k..(j + 1) * k];
            let exact_q: f64 = w.iter().zip(&xq).map(|(&a, &b)| a as f64 * b as f64).sum();
            let exact: f64 = w.iter().zip(&x[i * k..]).map(|(&a, &b)| a as f64 * b as f64).sum();
            let round = (2 * nb + 8) as f64 * f32::EPSILON as f64 * magnitude(p, j, &acts, i) + 1e-30;
            let step: f64 =
                w.iter().enumerate().map(|(t, &a)| a.abs() as f64 * acts.scale(i, t / SUPER_BLOCK) as f64 / 2.0).sum();
            let g = got[i * n + j] as f64;
            assert!((g - exact_q).abs() <= round, "{what} [{i},{j}]: {g} vs {exact_q} (quantized x), bound {round}");
            assert!((g - exact).abs() <= step + round, "{what} [{i},{j}]: {g} vs {exact}, bound {}", step + round);
        }
    }
}

/// Whether `kernel` multiplies `dtype` through the interleaved layout (`rows16`), with activations quantized per 32
/// values rather than per 256.
fn interleaved(kernel: Kernel, dtype: GgmlDType) -> bool {
    kernel == Kernel::Avx512Rows16 && dtype != GgmlDType::Q6K
}

#[test]
fn k_quant_blocks_decode_as_candle_dequantizes_them() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(4);
    for dtype in K_TYPES {
        let (p, wd) = pack(&random(&mut rng, 3 * 512, 1.0), 3, 512, dtype);
        assert_eq!(p.format(), Format::from_ggml(dtype).unwrap());
        assert_eq!(p.byte_len(), 3 * 2 * p.format().block_bytes());
        assert!(p.dequantize() == wd, "{dtype:?}: quantized blocks decode differently from candle");
        let (p, wd) = random_blocks(&mut rng, 4, 1024, dtype);
        assert!(p.dequantize() == wd, "{dtype:?}: random block bytes decode differently from candle");
    }
}

#[test]
fn k_quant_rows_must_be_whole_super_blocks() {
    // SmolLM2's 576-wide rows are 18 blocks of 32 but not whole super-blocks.
    let e = PackedMatrix::new(Format::Q4_K, 2, 576, vec![0; 2 * 576 / 256 * 144]).unwrap_err().to_string();
    assert!(e.contains("576") && e.contains("256"), "{e}");
    let e = PackedMatrix::new(Format::Q6_K, 2, 512, vec![0; 419]).unwrap_err().to_string();
    assert!(e.contains("840") && e.contains("419"), "{e}");
}

#[test]
fn k_quant_matmul_matches_dequantized_f32_for_every_kernel() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(270);
    // An odd number of super-blocks and of output rows.
    let (k, n) = (768, 37);
    for dtype in K_TYPES {
        // A non-zero mean, so the minimums (Q4_K, Q5_K) matter.
        let mut w = random(&mut rng, n * k, 1.0);
        w.iter_mut().for_each(|v| *v += 0.4);
        let (p, wd) = pack(&w, n, k, dtype);
        for m in [1, 3, 4, 5, 16] {
            let mut x = random(&mut rng, m * k, 3.0);
            x[..SUPER_BLOCK].iter_mut().for_each(|v| *v = 0.0); // an all-zero super-block (scale 0)
            x[SUPER_BLOCK + 7] = 40.0; // an outlier channel
            for kernel in Kernel::available() {
                let mut out = vec![f32::NAN; m * n];
                matmul_with(kernel, &x, &p, &mut out, m, k, n).unwrap();
                let what = format!("{dtype:?} {kernel:?} m={m}");
                if interleaved(kernel, dtype) {
                    super::tests::check(&out, &wd, &x, &QuantActs::new(&x, m, k), [m, k, n], false, &what);
                } else {
                    check(&out, &p, &wd, &x, [m, k, n], &what);
                }
            }
        }
    }
}

#[test]
fn k_quant_simd_kernels_equal_the_portable_kernel_on_arbitrary_blocks() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(71);
    let (m, k, n) = (7, 512, 21);
    for dtype in K_TYPES {
        let (p, _) = random_blocks(&mut rng, n, k, dtype);
        let mut x = random(&mut rng, m * k, 1.0);
        // Full-scale activations of one sign in a super-block: the largest `maddubs` pairs and per-16 sums.
        x[k..k + SUPER_BLOCK].iter_mut().for_each(|v| *v = -1.0);
        let acts = KQuantActs::new(&x, m, k);
        let mut want = vec![0f32; m * n];
        matmul_with(Kernel::Scalar, &x, &p, &mut want, m, k, n).unwrap();
        for kernel in Kernel::available() {
            let mut got = vec![0f32; m * n];
            matmul_with(kernel, &x, &p, &mut got, m, k, n).unwrap();
            if interleaved(kernel, dtype) {
                // Activations quantized per 32 values: against the f32 product within that quantization.
                let acts = QuantActs::new(&x, m, k);
                super::tests::check(&got, &p.dequantize(), &x, &acts, [m, k, n], false, &format!("{dtype:?} rows16"));
                continue;
            }
            for i in 0..m {
                for j in 0..n {
                    let tol = 2.0 * (2 * k / SUPER_BLOCK + 8) as f64 * f32::EPSILON as f64 * magnitude(&p, j, &acts, i);
                    let (a, b) = (got[i * n + j] as f64, want[i * n + j] as f64);
                    assert!((a - b).abs() <= tol, "{dtype:?} {kernel:?} [{i},{j}]: {a} vs portable {b} (tol {tol})");
                }
            }
        }
    }
}

#[test]
fn portable_integer_sums_equal_the_dequantized_dot_in_exact_arithmetic() {
    // `isums` against the per-value definition, in f64 (exact at these sizes), on arbitrary blocks.
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    for dtype in K_TYPES {
        let (p, _) = random_blocks(&mut rng, 2, 256, dtype);
        let x = random(&mut rng, 256, 1.0);
        let acts = KQuantActs::new(&x, 1, 256);
        for j in 0..2 {
            let (format, row) = p.row(j);
            let u = unpack(format, row);
            let (isum, msum) = isums(&u, &acts.q, &acts.bsums);
            let want_i: i64 =
                (0..256).map(|t| u.scale[t / 16] as i64 * (u.q[t] as i64 - u.offset as i64) * acts.q[t] as i64).sum();
            let want_m: i64 = (0..256).map(|t| u.min[t / 16] as i64 * acts.q[t] as i64).sum();
            assert_eq!((isum as i64, msum as i64), (want_i, want_m), "{dtype:?} row {j}");
        }
    }
}

#[test]
fn mixed_format_stacks_multiply_as_their_parts() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let k = 512;
    let parts: Vec<(PackedMatrix, Vec<f32>)> =
        [(GgmlDType::Q4K, 5), (GgmlDType::Q4K, 2), (GgmlDType::Q6K, 3), (GgmlDType::Q8_0, 4), (GgmlDType::Q5K, 17)]
            .into_iter()
            .map(|(dtype, n)| pack(&random(&mut rng, n * k, 1.0), n, k, dtype))
            .collect();
    let refs: Vec<&PackedMatrix> = parts.iter().map(|(p, _)| p).collect();
    let cat = PackedMatrix::cat_rows(&refs).unwrap();
    let n = cat.dims()[0];
    // The two Q4_K matrices join into one part.
    assert_eq!(cat.formats(), [(Format::Q4_K, 7), (Format::Q6_K, 3), (Format::Q8_0, 4), (Format::Q5_K, 17)]);
    assert_eq!(cat.byte_len(), refs.iter().map(|p| p.byte_len()).sum::<usize>());
    assert_eq!(cat.dequantize(), parts.iter().flat_map(|(_, d)| d.clone()).collect::<Vec<_>>());
    let order: Vec<usize> = (0..n).rev().collect();
    let back = cat.select_rows(&order).select_rows(&order);
    assert_eq!(back.formats(), cat.formats());
    assert_eq!(back.dequantize(), cat.dequantize());
    for m in [1, 3, 6] {
        let x = random(&mut rng, m * k, 2.0);
        for kernel in Kernel::available() {
            let mut got = vec![f32::NAN; m * n];
            matmul_with(kernel, &x, &cat, &mut got, m, k, n).unwrap();
            let mut j0 = 0;
            for p in &refs {
                let pn = p.dims()[0];
                let mut want = vec![0f32; m * pn];
                matmul_with(kernel, &x, p, &mut want, m, k, pn).unwrap();
                for i in 0..m {
                    assert_eq!(
                        got[i * n + j0..i * n + j0 + pn],
                        want[i * pn..(i + 1) * pn],
                        "{kernel:?} m={m} row {i}"
                    );
                }
                j0 += pn;
            }
        }
    }
}

#[test]
fn a_q4_k_m_fused_projection_stays_packed_in_the_cpu_backend() {
    use crate::cpu::{CpuBackend, CpuBuffer};
    use crate::{Backend, Op};
    let mut rng = rand::rngs::StdRng::seed_from_u64(12);
    let k = 256;
    let mut keep = Keep::default();
    let mut tensors = Vec::new();
    // q and k in Q4_K, v in Q6_K, as llama.cpp's Q4_K_M mix writes them.
    for (dtype, n) in [(GgmlDType::Q4K, 8), (GgmlDType::Q4K, 4), (GgmlDType::Q6K, 4)] {
        let (p, wd) = pack(&random(&mut rng, n * k, 1.0), n, k, dtype);
        let t = Tensor::from_vec(wd, (n, k), &Device::Cpu).unwrap();
        register(&t, p, &mut keep);
        tensors.push(t);
    }
    let be = CpuBackend::with_packed_weights(true);
    let parts: Vec<&Tensor> = tensors.iter().collect();
    let w = be.upload_weight_rows(&parts).unwrap();
    match &w {
        CpuBuffer::Packed(p) => assert_eq!(p.formats(), [(Format::Q4_K, 12), (Format::Q6_K, 4)]),
        other => panic!("the fused Q4_K / Q6_K projection was not kept packed: {other:?}"),
    }
    // And it multiplies as the dequantized stack does, within the activation quantization.
    let (m, n) = (2, 16);
    let x = random(&mut rng, m * k, 1.0);
    let (xb, out) = (be.upload_f32(&x).unwrap(), be.alloc_f32(m * n).unwrap());
    be.run(Op::MatMul { x: &xb, w: &w, bias: None, out: &out, m, k, n }).unwrap();
    let got = be.download_f32(&out).unwrap();
    let wd = Tensor::cat(&parts, 0).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let acts = KQuantActs::new(&x, m, k);
    for i in 0..m {
        for j in 0..n {
            let exact: f64 = (0..k).map(|t| wd[j * k + t] as f64 * x[i * k + t] as f64).sum();
            let step: f64 = (0..k).map(|t| wd[j * k + t].abs() as f64 * acts.scale(i, 0) as f64 / 2.0).sum();
            let g = got[i * n + j] as f64;
            assert!((g - exact).abs() <= step * 1.01 + 1e-5, "[{i},{j}]: {g} vs {exact} (step bound {step})");
        }
    }
}
