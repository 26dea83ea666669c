//! The packed matmul against the f32 matmul of the dequantized weights, for every format and kernel.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use rand::{Rng, SeedableRng};

use super::*;

/// The activations a packed matmul of `p` quantizes `x[m, k]` into (one term, or two).
pub(super) fn acts_for(p: &PackedMatrix, x: &[f32], m: usize, k: usize) -> QuantActs {
    match p.two_term_activations() {
        true => QuantActs::two_term(x, m, k),
        false => QuantActs::new(x, m, k),
    }
}

fn random(rng: &mut rand::rngs::StdRng, len: usize, amp: f32) -> Vec<f32> {
    (0..len).map(|_| rng.gen_range(-amp..amp)).collect()
}

/// `w` quantized by candle's (llama.cpp's) quantizer, as a packed matrix and as candle dequantizes it.
fn pack(w: &[f32], n: usize, k: usize, dtype: GgmlDType) -> (PackedMatrix, Vec<f32>) {
    let t = Tensor::from_slice(w, (n, k), &Device::Cpu).unwrap();
    let q = QTensor::quantize(&t, dtype).unwrap();
    let deq = q.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let p = PackedMatrix::new(Format::from_ggml(dtype).unwrap(), n, k, q.data().unwrap().into_owned()).unwrap();
    (p, deq)
}

/// Checks `got` against the f64 product of the dequantized weights `wd` with `x` (what the f32 path computes) and
/// with the quantized activations (what the integer path computes exactly, up to f32 rounding).
///
/// Bound against `x`: each activation is off by at most half its block's step (`|x - d q| <= d / 2`), so row `i`'s
/// output is off by at most `sum_j |w_j| d_b(j) / 2`. Rounding: the block sums are exact integers; each of the `nb`
/// scaled block terms and their sum round in f32, at most `(nb + 4) eps sum_j |w_j x^_j|` (plus the same for the
/// `Q4_1` minimum terms, inside the sum of |w x^| since `x^` carries them). `offsets`: the kernel shifted signed
/// values to unsigned ones (`rows16`: `Q8_0` by 128, `Q4_0` by 8, `Q5_0` by 16), so each block adds and takes away
/// about `max|w| sum|x^|` (`z |d|` is at most 1.01 max|w|), which rounds too.
pub(super) fn check(
    got: &[f32],
    wd: &[f32],
    x: &[f32],
    acts: &QuantActs,
    [m, k, n]: [usize; 3],
    offsets: bool,
    what: &str,
) {
    let nb = k / BLOCK;
    // Two terms (`QuantActs::two_term`: rows `m ..` the residual): `x^` is their sum, each term's dot rounds on its
    // own, and the last term's step bounds the error against `x`.
    let terms = acts.rows() / m;
    for i in 0..m {
        let term_rows: Vec<Vec<f32>> = (0..terms).map(|t| acts.dequantize_row(t * m + i)).collect();
        for j in 0..n {
            let w = &wd[j * k..(j + 1) * k];
            let exact_q: f64 = term_rows.iter().flat_map(|r| w.iter().zip(r)).map(|(&a, &b)| a as f64 * b as f64).sum();
            let exact: f64 = w.iter().zip(&x[i * k..]).map(|(&a, &b)| a as f64 * b as f64).sum();
            let mut mag = 0f64;
            for r in &term_rows {
                mag += w.iter().zip(r).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum::<f64>();
                if offsets {
                    for (wb, xb) in w.chunks_exact(BLOCK).zip(r.chunks_exact(BLOCK)) {
                        let wmax = wb.iter().fold(0f64, |a, v| a.max(v.abs() as f64));
                        mag += 2.0 * 1.01 * wmax * xb.iter().map(|v| v.abs() as f64).sum::<f64>();
                    }
                }
            }
            let round = (nb as f64 + 4.0) * f32::EPSILON as f64 * mag + 1e-30;
            let last = (terms - 1) * m + i;
            let step: f64 =
                w.iter().enumerate().map(|(t, &a)| a.abs() as f64 * acts.d[last * nb + t / BLOCK] as f64 / 2.0).sum();
            let g = got[i * n + j] as f64;
            assert!((g - exact_q).abs() <= round, "{what} [{i},{j}]: {g} vs {exact_q} (quantized x), bound {round}");
            assert!((g - exact).abs() <= step + round, "{what} [{i},{j}]: {g} vs {exact}, bound {}", step + round);
        }
    }
}

/// Whether the kernel reads a layout with the values shifted to unsigned (`rows16`).
fn unsigned(kernel: Kernel) -> bool {
    kernel == Kernel::Avx512Rows16
}

#[test]
fn packed_matmul_matches_dequantized_f32_for_every_format_and_kernel() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(27);
    let (k, n) = (256, 37);
    for dtype in [GgmlDType::Q8_0, GgmlDType::Q4_0, GgmlDType::Q4_1, GgmlDType::Q5_0, GgmlDType::Q5_1] {
        // Q4_1 gets weights with a non-zero mean, so the minimum term matters.
        let mut w = random(&mut rng, n * k, 1.0);
        if matches!(dtype, GgmlDType::Q4_1 | GgmlDType::Q5_1) {
            w.iter_mut().for_each(|v| *v += 0.7);
        }
        let (p, wd) = pack(&w, n, k, dtype);
        assert_eq!(p.dequantize(), wd, "{dtype:?}: block decoding differs from candle's");
        for (m, two_term) in [1, 3, 4, 5, 16, 37].into_iter().flat_map(|m| [(m, false), (m, true)]) {
            let p = p.clone().with_two_term_activations(two_term);
            let mut x = random(&mut rng, m * k, 3.0);
            x[..BLOCK].iter_mut().for_each(|v| *v = 0.0); // an all-zero block (scale 0)
            let acts = acts_for(&p, &x, m, k);
            for kernel in Kernel::available() {
                let mut out = vec![f32::NAN; m * n];
                matmul_with(kernel, &x, &p, &mut out, m, k, n).unwrap();
                let offsets = unsigned(kernel) && p.format().shift() != 0;
                let what = format!("{dtype:?} {kernel:?} m={m} two terms {two_term}");
                check(&out, &wd, &x, &acts, [m, k, n], offsets, &what);
            }
        }
    }
}

#[test]
fn simd_kernels_equal_the_scalar_kernel() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let (m, k, n) = (7, 512, 21);
    for dtype in [GgmlDType::Q8_0, GgmlDType::Q4_0, GgmlDType::Q4_1, GgmlDType::Q5_0, GgmlDType::Q5_1] {
        let (mut p, _) = pack(&random(&mut rng, n * k, 2.0), n, k, dtype);
        if dtype == GgmlDType::Q8_0 {
            // -128 is a valid stored value (llama.cpp never writes it, a file may): |w| = 128 must not saturate.
            p.parts[0].data.iter_mut().skip(2).step_by(34).for_each(|b| *b = 0x80);
        }
        let x = random(&mut rng, m * k, 1.0);
        // Q8_0 in two terms (as a Q8_0 model loads), the others in one.
        let p = p.with_two_term_activations(dtype == GgmlDType::Q8_0);
        let acts = acts_for(&p, &x, m, k);
        let terms = acts.rows() / m;
        let mut want = vec![0f32; m * n];
        matmul_with(Kernel::Scalar, &x, &p, &mut want, m, k, n).unwrap();
        // The exact integer sums, block by block, give each output's magnitude for the rounding bound.
        for kernel in Kernel::available() {
            let mut got = vec![0f32; m * n];
            matmul_with(kernel, &x, &p, &mut got, m, k, n).unwrap();
            for i in 0..m {
                for j in 0..n {
                    let mut mag = 0f64;
                    let blocks = p.row(j).1.chunks_exact(p.format().block_bytes()).enumerate();
                    for ((b, blk), r) in blocks.flat_map(|b| (0..terms).map(move |t| (b, t * m + i))) {
                        let (isum, d, mn) = dot::block_isum(p.format(), blk, &acts.q[r * k + b * BLOCK..]);
                        let (xd, xs) = (acts.d[r * (k / BLOCK) + b] as f64, acts.s[r * (k / BLOCK) + b] as f64);
                        mag += (d as f64 * xd * isum as f64).abs() + (mn as f64 * xs).abs();
                        // The unsigned layouts' shift (128 or 8 steps of d) is added and taken away.
                        if unsigned(kernel) {
                            let zero = p.format().shift() as f64;
                            let xabs: f64 =
                                acts.q[r * k + b * BLOCK..][..BLOCK].iter().map(|&q| q.unsigned_abs() as f64).sum();
                            mag += 2.0 * zero * (d as f64).abs() * xd * xabs;
                        }
                    }
                    let tol = 2.0 * (k / BLOCK + 4) as f64 * f32::EPSILON as f64 * mag;
                    let (a, b) = (got[i * n + j] as f64, want[i * n + j] as f64);
                    assert!((a - b).abs() <= tol, "{dtype:?} {kernel:?} [{i},{j}]: {a} vs scalar {b} (tol {tol})");
                }
            }
        }
    }
}

#[test]
fn rows_permute_and_stack_as_blocks() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let (a, da) = pack(&random(&mut rng, 4 * 64, 1.0), 4, 64, GgmlDType::Q4_1);
    let (b, db) = pack(&random(&mut rng, 2 * 64, 1.0), 2, 64, GgmlDType::Q4_1);
    let cat = PackedMatrix::cat_rows(&[&a, &b]).unwrap();
    assert_eq!(cat.dequantize(), [da.clone(), db].concat());
    let sel = a.select_rows(&[2, 0, 3, 1]);
    let want: Vec<f32> = [2, 0, 3, 1].iter().flat_map(|&r| da[r * 64..(r + 1) * 64].to_vec()).collect();
    assert_eq!(sel.dequantize(), want);
    // Two-term activations survive a permutation, and a stack takes them only when every matrix has them.
    let (a2, b2) = (a.clone().with_two_term_activations(true), b.clone().with_two_term_activations(true));
    assert!(a2.select_rows(&[1, 0, 2, 3]).two_term_activations());
    assert!(PackedMatrix::cat_rows(&[&a2, &b2]).unwrap().two_term_activations());
    assert!(!PackedMatrix::cat_rows(&[&a2, &b]).unwrap().two_term_activations());
    let (c, _) = pack(&random(&mut rng, 2 * 32, 1.0), 2, 32, GgmlDType::Q8_0);
    assert!(PackedMatrix::cat_rows(&[&a, &c]).is_none(), "widths must not mix");
}

#[test]
fn prefill_sized_q6_k_batches_take_dequantized_tiles_without_activation_error() {
    // Above `INTEGER_ROWS` rows `Q6_K` (and every format where `Avx512Rows16` does not run) goes through f32 tiles
    // of the dequantized weights: f32 rounding only. n spans two tiles and a partial one.
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let (m, k, n) = (matmul::INTEGER_ROWS + 3, 256, 1100);
    let (p, wd) = pack(&random(&mut rng, n * k, 1.0), n, k, GgmlDType::Q6K);
    let x = random(&mut rng, m * k, 2.0);
    let bias = random(&mut rng, n, 1.0);
    let mut out = vec![f32::NAN; m * n];
    super::matmul(&x, &p, Some(&bias), &mut out, m, k, n).unwrap();
    for i in 0..m {
        for j in 0..n {
            let exact: f64 = (0..k).map(|t| wd[j * k + t] as f64 * x[i * k + t] as f64).sum::<f64>() + bias[j] as f64;
            let mag: f64 = (0..k).map(|t| (wd[j * k + t] as f64 * x[i * k + t] as f64).abs()).sum::<f64>();
            // f32 GEMM rounding only: k products and sums, plus the bias add.
            let tol = (k as f64 + 2.0) * f32::EPSILON as f64 * (mag + bias[j].abs() as f64);
            let g = out[i * n + j] as f64;
            assert!((g - exact).abs() <= tol, "[{i},{j}]: {g} vs {exact} (tol {tol})");
        }
    }
}

#[test]
fn prefill_sized_batches_of_32_value_formats_take_the_fastest_kernel() {
    // With `Avx512Rows16` the integer kernel runs at every row count (it beats the f32 GEMM there), for every format
    // but `Q6_K`; elsewhere the dequantized tiles do. Either way `matmul` at prefill size is what that path computes.
    let mut rng = rand::rngs::StdRng::seed_from_u64(12);
    let (m, k, n) = (matmul::INTEGER_ROWS + 5, 96, 70);
    let (p, wd) = pack(&random(&mut rng, n * k, 1.0), n, k, GgmlDType::Q8_0);
    let p = p.with_two_term_activations(true);
    let x = random(&mut rng, m * k, 2.0);
    let mut out = vec![f32::NAN; m * n];
    super::matmul(&x, &p, None, &mut out, m, k, n).unwrap();
    if Kernel::detect() == Kernel::Avx512Rows16 {
        check(&out, &wd, &x, &acts_for(&p, &x, m, k), [m, k, n], true, "Q8_0 prefill rows16");
    } else {
        let mut want = vec![0f32; m * n];
        matmul::dense_tiles(&x, &p, &mut want, m, k, n).unwrap();
        assert_eq!(out, want);
    }
}

#[test]
fn the_interleaved_layout_holds_the_same_products() {
    // `rows16` with portable arithmetic against the f32 product: the layout on any CPU (the SIMD kernel is checked
    // against the scalar one above where it runs). 21 rows: a whole group and a partial one.
    let mut rng = rand::rngs::StdRng::seed_from_u64(16);
    let (m, n) = (3, 21);
    let cases = [
        (GgmlDType::Q8_0, 160),
        (GgmlDType::Q4_0, 160),
        (GgmlDType::Q4_1, 160),
        (GgmlDType::Q5_0, 160),
        (GgmlDType::Q5_1, 160),
        (GgmlDType::Q4K, 512),
        (GgmlDType::Q5K, 512),
    ];
    for (dtype, k) in cases {
        let mut w = random(&mut rng, n * k, 1.5);
        if matches!(dtype, GgmlDType::Q4_1 | GgmlDType::Q5_1 | GgmlDType::Q4K | GgmlDType::Q5K) {
            w.iter_mut().for_each(|v| *v += 0.5);
        }
        let (p, wd) = pack(&w, n, k, dtype);
        let x = random(&mut rng, m * k, 2.0);
        let acts = QuantActs::new(&x, m, k);
        let t = p.parts[0].rows16(k).expect("every format but Q6_K interleaves");
        assert_eq!(t.allocated(), rows16::Rows16::bytes(p.format(), n, k), "{dtype:?}: the counted bytes");
        let mut got = vec![0f32; m * n];
        for g in 0..n.div_ceil(rows16::LANES) {
            let mut tile = [[f32::NAN; rows16::LANES]; 3];
            t.dot_tile_portable(g, &acts, 0, &mut tile);
            for (i, o) in tile.iter().enumerate() {
                for (j, v) in o.iter().enumerate().filter(|(j, _)| g * rows16::LANES + j < n) {
                    got[i * n + g * rows16::LANES + j] = *v;
                }
            }
        }
        check(&got, &wd, &x, &acts, [m, k, n], p.format().shift() != 0, &format!("{dtype:?} rows16"));
    }
}

#[test]
fn a_nan_activation_makes_its_rows_outputs_nan_and_no_other_rows() {
    // The f32 path's behaviour: the quantizers must not round a NaN to 0 and give finite logits for a broken row.
    let mut rng = rand::rngs::StdRng::seed_from_u64(13);
    let (k, n) = (512, 40);
    let formats = [GgmlDType::Q8_0, GgmlDType::Q4_0, GgmlDType::Q4_1, GgmlDType::Q4K, GgmlDType::Q6K];
    for dtype in formats {
        let (p, _) = pack(&random(&mut rng, n * k, 1.0), n, k, dtype);
        // Two-term activations exist for Q8_0 weights only.
        let twos: &[bool] = if dtype == GgmlDType::Q8_0 { &[false, true] } else { &[false] };
        for &two in twos {
            let p = p.clone().with_two_term_activations(two);
            for m in [1, 4, 16, matmul::INTEGER_ROWS + 1] {
                let mut x = random(&mut rng, m * k, 2.0);
                let bad = m / 2;
                x[bad * k + 300] = f32::NAN;
                for kernel in Kernel::available() {
                    let mut out = vec![0f32; m * n];
                    matmul_with(kernel, &x, &p, &mut out, m, k, n).unwrap();
                    for (i, row) in out.chunks(n).enumerate() {
                        let ok =
                            if i == bad { row.iter().all(|v| v.is_nan()) } else { row.iter().all(|v| v.is_finite()) };
                        assert!(ok, "{dtype:?} two={two} {kernel:?} m={m} row {i} (NaN in row {bad}): {row:?}");
                    }
                }
            }
        }
    }
}
