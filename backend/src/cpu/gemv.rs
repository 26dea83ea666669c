//! Skinny matrix multiply for decode-sized batches with f32 weights: `out[m, n] = x[m, k] . w[n, k]^T` with `m`
//! small (16-bit weights: `matmul16`).
//!
//! candle's GEMM packs the whole weight matrix on every call, which costs more than the multiply when `m` is a few
//! rows; here each weight row is streamed once and dotted with every input row while it sits in L1. Rows are split across rayon threads. AVX2+FMA is used when the CPU has it (checked at run
//! time), with a portable fallback.

use rayon::prelude::*;

/// A weight matrix's elements, row-major `[n, k]`.
pub(super) enum WeightRows<'a> {
    F32(&'a [f32]),
}

/// Largest `m` the skinny path takes; above it the packed GEMM wins.
pub(super) const MAX_ROWS: usize = 16;

pub(super) fn gemv(x: &[f32], w: WeightRows<'_>, out: &mut [f32], m: usize, k: usize, n: usize) {
    // Column-major result (one chunk of m values per weight row), transposed into `out` at the end.
    let mut t = vec![0f32; n * m];
    let WeightRows::F32(v) = w;
    t.par_chunks_mut(m).enumerate().with_min_len(32).for_each(|(j, o)| {
        let row = &v[j * k..(j + 1) * k];
        for (i, o) in o.iter_mut().enumerate() {
            *o = dot(&x[i * k..(i + 1) * k], row);
        }
    });
    for j in 0..n {
        for i in 0..m {
            out[i * n + j] = t[j * m + i];
        }
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the features were just detected on this CPU.
            return unsafe { dot_avx2(a, b) };
        }
    }
    dot_portable(a, b)
}

fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        for l in 0..8 {
            acc[l] += a[c * 8 + l] * b[c * 8 + l];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for i in chunks * 8..a.len() {
        s += a[i] * b[i];
    }
    s
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (u, acc) in acc.iter_mut().enumerate() {
            let va = _mm256_loadu_ps(pa.add(i + 8 * u));
            let vb = _mm256_loadu_ps(pb.add(i + 8 * u));
            *acc = _mm256_fmadd_ps(va, vb, *acc);
        }
        i += 32;
    }
    while i + 8 <= n {
        acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), acc[0]);
        i += 8;
    }
    let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), s);
    let mut total: f32 = lanes.iter().sum();
    while i < n {
        total += a[i] * b[i];
        i += 1;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_a_naive_product() {
        let (m, k, n) = (3, 77, 50);
        let x: Vec<f32> = (0..m * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0).collect();
        let w: Vec<f32> = (0..n * k).map(|i| ((i * 53 % 89) as f32 - 44.0) / 30.0).collect();
        let want: Vec<f32> =
            (0..m * n).map(|o| (0..k).map(|t| x[(o / n) * k + t] * w[(o % n) * k + t]).sum()).collect();
        let mut out = vec![0.0; m * n];
        gemv(&x, WeightRows::F32(&w), &mut out, m, k, n);
        for (a, b) in out.iter().zip(&want) {
            assert!((a - b).abs() <= 1e-4, "{a} vs {b}");
        }
        assert!((dot_portable(&x[..k], &w[..k]) - dot(&x[..k], &w[..k])).abs() < 1e-4);
    }
}
