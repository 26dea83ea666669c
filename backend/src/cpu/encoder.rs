//! The encoder ops on the CPU, the reference the kernels are checked against: LayerNorm with a bias (and the
//! residual add a post-norm layer folds into it), the exact GELU, and bidirectional attention within each sequence
//! of a flattened batch over the fused q/k/v projection. Rows (and, for attention, (sequence, head) pairs) are split
//! over rayon's threads.

use rayon::prelude::*;

use super::be;
use crate::error::Result;

/// `out = layernorm(x + residual) * weight + bias` per row of `hidden` values (biased variance, as torch's).
#[allow(clippy::too_many_arguments)]
pub(super) fn layer_norm(
    x: &[f32],
    residual: Option<&[f32]>,
    weight: &[f32],
    bias: &[f32],
    out: &mut [f32],
    rows: usize,
    hidden: usize,
    eps: f32,
) -> Result<()> {
    let n = rows * hidden;
    if x.len() < n
        || out.len() < n
        || residual.is_some_and(|r| r.len() < n)
        || weight.len() < hidden
        || bias.len() < hidden
    {
        return Err(be(format!("layer_norm: buffers too small for {rows} rows of {hidden}")));
    }
    out[..n].par_chunks_mut(hidden.max(1)).enumerate().for_each(|(r, o)| {
        let xs = &x[r * hidden..(r + 1) * hidden];
        match residual {
            Some(res) => o.iter_mut().zip(xs).zip(&res[r * hidden..]).for_each(|((o, &a), &b)| *o = a + b),
            None => o.copy_from_slice(xs),
        }
        let mean = o.iter().map(|&v| v as f64).sum::<f64>() / hidden as f64;
        let var = o.iter().map(|&v| (v as f64 - mean) * (v as f64 - mean)).sum::<f64>() / hidden as f64;
        let inv = 1.0 / (var + eps as f64).sqrt();
        for ((o, &w), &b) in o.iter_mut().zip(weight).zip(bias) {
            *o = ((*o as f64 - mean) * inv) as f32 * w + b;
        }
    });
    Ok(())
}

/// erf on f32 as a rational function of x^2 on [-4, 4] (+-1 beyond, where erf is 1 in f32): only multiplies, adds
/// and one division, so a loop of it vectorises, where a call to `erff` per value is most of a GELU layer's time.
/// Within 1e-6 of libm's `erff` (the unit test below).
pub(super) fn erf_f32(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let mut p = -2.726_142_3e-10_f32;
    p = p * x2 + 2.770_681_4e-8;
    p = p * x2 + -2.101_024e-6;
    p = p * x2 + -5.692_506_4e-5;
    p = p * x2 + -7.349_906_3e-4;
    p = p * x2 + -2.954_6e-3;
    p = p * x2 + -1.609_603_3e-2;
    let mut q = -1.456_607_2e-5_f32;
    q = q * x2 + -2.133_740_6e-4;
    q = q * x2 + -1.682_827e-3;
    q = q * x2 + -7.373_329e-3;
    q = q * x2 + -1.426_474e-2;
    x * p / q
}

/// The exact GELU of one value.
pub(super) fn gelu_erf(x: f32) -> f32 {
    0.5 * x * (1.0 + erf_f32(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// `out = gelu(x)` over `len` values.
pub(super) fn gelu(x: &[f32], out: &mut [f32], len: usize) -> Result<()> {
    if x.len() < len || out.len() < len {
        return Err(be(format!("gelu: buffers too small for {len} values")));
    }
    out[..len].par_chunks_mut(4096).zip(x[..len].par_chunks(4096)).for_each(|(o, x)| {
        o.iter_mut().zip(x).for_each(|(o, &v)| *o = gelu_erf(v));
    });
    Ok(())
}

/// `a . b` in 16 independent lanes (summed at the end), which the compiler vectorises; a plain running sum is a
/// chain of dependent scalar adds.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..16 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Bidirectional attention of every row of each sequence over that sequence's keys (`Op::EncoderAttention`).
#[allow(clippy::too_many_arguments)]
pub(super) fn encoder_attention(
    qkv: &[f32],
    query_start: &[u32],
    out: &mut [f32],
    num_seqs: usize,
    num_tokens: usize,
    num_heads: usize,
    head_dim: usize,
    scale: f32,
) -> Result<()> {
    let width = num_heads * head_dim;
    if query_start.len() < num_seqs + 1
        || query_start[0] != 0
        || query_start[num_seqs] as usize != num_tokens
        || query_start[..=num_seqs].windows(2).any(|w| w[0] > w[1])
    {
        return Err(be(format!("encoder_attention: query_start does not split {num_tokens} rows into {num_seqs}")));
    }
    if qkv.len() < num_tokens * 3 * width || out.len() < num_tokens * width {
        return Err(be(format!("encoder_attention: buffers too small for {num_tokens} rows of {num_heads} heads")));
    }
    let row = 3 * width;
    // Each task writes the rows of one sequence; within it, heads and rows in turn.
    let mut parts: Vec<&mut [f32]> = Vec::with_capacity(num_seqs);
    let mut rest = &mut out[..num_tokens * width];
    for s in 0..num_seqs {
        let len = (query_start[s + 1] - query_start[s]) as usize * width;
        let (a, b) = rest.split_at_mut(len);
        parts.push(a);
        rest = b;
    }
    parts.into_par_iter().enumerate().for_each(|(s, o)| {
        let (t0, t1) = (query_start[s] as usize, query_start[s + 1] as usize);
        let mut scores = vec![0f32; t1 - t0];
        for h in 0..num_heads {
            for i in t0..t1 {
                let q = &qkv[i * row + h * head_dim..][..head_dim];
                let mut max = f32::NEG_INFINITY;
                for (j, sc) in (t0..t1).zip(scores.iter_mut()) {
                    let k = &qkv[j * row + width + h * head_dim..][..head_dim];
                    *sc = dot(q, k) * scale;
                    max = max.max(*sc);
                }
                let mut sum = 0f32;
                scores.iter_mut().for_each(|sc| {
                    *sc = (*sc - max).exp();
                    sum += *sc;
                });
                let dst = &mut o[(i - t0) * width + h * head_dim..][..head_dim];
                dst.fill(0.0);
                for (j, &p) in (t0..t1).zip(scores.iter()) {
                    let v = &qkv[j * row + 2 * width + h * head_dim..][..head_dim];
                    dst.iter_mut().zip(v).for_each(|(d, &v)| *d += p * v);
                }
                let inv = 1.0 / sum;
                dst.iter_mut().for_each(|d| *d *= inv);
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_norm_matches_the_definition() {
        let x = [1.0f32, 2.0, 3.0, 4.0];
        let res = [0.5f32, 0.5, 0.5, 0.5];
        let mut out = [0f32; 4];
        layer_norm(&x, Some(&res), &[1.0, 2.0, 1.0, 1.0], &[0.0, 0.0, 1.0, 0.0], &mut out, 1, 4, 0.0).unwrap();
        // mean 3, variance 1.25 of (1.5, 2.5, 3.5, 4.5)
        let s = 1.25f32.sqrt();
        let want = [-1.5 / s, 2.0 * -0.5 / s, 0.5 / s + 1.0, 1.5 / s];
        out.iter().zip(want).for_each(|(a, b)| assert!((a - b).abs() < 1e-6, "{out:?} vs {want:?}"));
    }

    #[test]
    fn the_rational_erf_is_libms_within_1e_6() {
        let worst =
            (-8000..=8000).map(|i| i as f32 * 1e-3).map(|x| (erf_f32(x) - libm::erff(x)).abs()).fold(0f32, f32::max);
        assert!(worst < 1e-6, "largest difference {worst}");
    }

    #[test]
    fn gelu_is_the_erf_form() {
        assert_eq!(gelu_erf(0.0), 0.0);
        assert!((gelu_erf(1.0) - 0.841_344_7).abs() < 1e-6);
        assert!((gelu_erf(-1.0) + 0.158_655_26).abs() < 1e-6);
    }

    #[test]
    fn each_row_sees_its_whole_sequence_and_nothing_else() {
        // Two sequences (2 rows, 1 row), one head of 1 dimension: q, k, v per row.
        let qkv = [1.0f32, 0.0, 10.0, 1.0, 1.0, 20.0, 1.0, 5.0, 30.0];
        let mut out = [0f32; 3];
        encoder_attention(&qkv, &[0, 2, 3], &mut out, 2, 3, 1, 1, 1.0).unwrap();
        // Rows 0 and 1: softmax over keys (0, 1) = (1, e) / (1 + e) of values (10, 20), the same for both rows.
        let e = std::f32::consts::E;
        let want = (10.0 + 20.0 * e) / (1.0 + e);
        assert!((out[0] - want).abs() < 1e-4 && (out[1] - want).abs() < 1e-4, "{out:?}");
        assert_eq!(out[2], 30.0);
        assert!(encoder_attention(&qkv, &[0, 2, 4], &mut out, 2, 3, 1, 1, 1.0).is_err());
    }
}
