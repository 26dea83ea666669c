//! Activations quantized per 32-value block to int8 (llama.cpp's `Q8_0` for activations, with an f32 scale):
//! `d = max|x| / 127`, `q = round(x / d)`. The per-block `d * sum(q)` is kept too, for formats with a minimum
//! (`Q4_1`: `sum(w * x) = d_w d_x sum(q_w q_x) + m_w d_x sum(q_x)`).
//!
//! `two_term` adds a second set of rows holding the first quantization's residual `x - d q`, quantized the same way
//! (its scale about `d / 254`), for weights precise enough to want it (`PackedMatrix::with_two_term_activations`):
//! a kernel dots the weights with both sets as ordinary rows, so every kernel
//! takes them, and the two outputs are added.

use rayon::prelude::*;

use super::BLOCK;

/// Blocks quantized per rayon task (above it a batch is split; a decode row of a few thousand values is not).
const BLOCKS_PER_TASK: usize = 512;

/// `x` rounded half away from zero, as `f32::round` does, without its library call (which the baseline x86-64
/// target makes per value): the largest f32 below 0.5 added with `x`'s sign, then truncated. The addition's own
/// rounding carries the ties (0.5 + 0.49999997 rounds to 1.0), so it is exact for every f32 in range.
#[inline(always)]
fn round(x: f32) -> i32 {
    (x + 0.49999997f32.copysign(x)) as i32
}

/// A block's scale, `max|x| / 127`; NaN when the block holds a NaN or an infinity (`f32::max` would skip a NaN and
/// the block would quantize as if it were 0), so such an activation makes its row's products NaN, as on the f32
/// path. One pass: `v * 0` is 0 for a finite value and NaN otherwise, and the sum keeps it.
pub(super) fn block_scale(xb: &[f32]) -> f32 {
    let (amax, poison) = xb.iter().fold((0f32, 0f32), |(a, z), &v| (a.max(v.abs()), z + v * 0.0));
    amax / 127.0 + poison
}

/// Quantizes whole blocks of `x` into `q`, one scale `d` and one `d * sum(q)` per block.
fn quantize(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    for (b, (xb, qb)) in x.chunks_exact(BLOCK).zip(q.chunks_exact_mut(BLOCK)).enumerate() {
        let scale = block_scale(xb);
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in qb.iter_mut().zip(xb) {
            // |v * inv| <= 127 up to the rounding of `inv`, which the clamp absorbs.
            let r = round(v * inv).clamp(-127, 127) as i8;
            *q = r;
            sum += r as i32;
        }
        d[b] = scale;
        s[b] = scale * sum as f32;
    }
}

/// `rows` activation rows of `k` values each, quantized.
#[derive(Debug, Clone)]
pub struct QuantActs {
    pub(super) k: usize,
    pub(super) q: Vec<i8>,
    /// One scale per block, `rows * k / 32`.
    pub(super) d: Vec<f32>,
    /// `d * sum(q)` per block.
    pub(super) s: Vec<f32>,
}

impl QuantActs {
    /// Quantizes `x[rows, k]` (`k` a multiple of 32), splitting large batches (prefill) over rayon's pool.
    pub fn new(x: &[f32], rows: usize, k: usize) -> Self {
        debug_assert!(k.is_multiple_of(BLOCK));
        let blocks = rows * k / BLOCK;
        let mut q = vec![0i8; rows * k];
        let mut d = vec![0f32; blocks];
        let mut s = vec![0f32; blocks];
        let (x, per_task) = (&x[..rows * k], BLOCKS_PER_TASK * BLOCK);
        if blocks > BLOCKS_PER_TASK {
            x.par_chunks(per_task)
                .zip(q.par_chunks_mut(per_task))
                .zip(d.par_chunks_mut(BLOCKS_PER_TASK).zip(s.par_chunks_mut(BLOCKS_PER_TASK)))
                .for_each(|((x, q), (d, s))| quantize(x, q, d, s));
        } else {
            quantize(x, &mut q, &mut d, &mut s);
        }
        QuantActs { k, q, d, s }
    }

    /// `x[rows, k]` in two terms: rows `0 .. rows` are `QuantActs::new`'s, rows `rows .. 2 rows` the residual
    /// `x - d q` of each value, quantized per block in the same way. `x . w` is then the sum of the two rows' dots
    /// within about `max|x| / 64516` a value (half the residual's step), where one term leaves `max|x| / 254`.
    pub fn two_term(x: &[f32], rows: usize, k: usize) -> Self {
        let x = &x[..rows * k];
        let first = Self::new(x, rows, k);
        let residual = (0..rows).flat_map(|r| first.dequantize_row(r)).zip(x).map(|(q, &v)| v - q);
        // Quantizing is per block, so the first rows come out as `first` again.
        Self::new(&x.iter().copied().chain(residual).collect::<Vec<f32>>(), 2 * rows, k)
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.q.len().checked_div(self.k).unwrap_or(0)
    }

    /// The scale of block `b` of row `r`.
    pub fn scale(&self, r: usize, b: usize) -> f32 {
        self.d[r * (self.k / BLOCK) + b]
    }

    /// Row `r` as f32 (`d * q`): the residual of `two_term`, and error bounds in tests.
    pub fn dequantize_row(&self, r: usize) -> Vec<f32> {
        let nb = self.k / BLOCK;
        (0..self.k).map(|i| self.d[r * nb + i / BLOCK] * self.q[r * self.k + i] as f32).collect()
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::{QuantActs, BLOCK};

    #[test]
    fn two_terms_hold_each_value_within_half_the_residual_step() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let (m, k) = (3, 4 * BLOCK);
        let mut x: Vec<f32> = (0..m * k).map(|_| rng.gen_range(-4.0f32..4.0) * rng.gen_range(0.0f32..1.0)).collect();
        x[..BLOCK].iter_mut().for_each(|v| *v = 0.0);
        let (one, two) = (QuantActs::new(&x, m, k), QuantActs::two_term(&x, m, k));
        assert_eq!((one.rows(), two.rows()), (m, 2 * m));
        let (mut worst_one, mut worst_two) = (0f32, 0f32);
        for i in 0..m {
            let (a, r, single) = (two.dequantize_row(i), two.dequantize_row(m + i), one.dequantize_row(i));
            assert_eq!(a, single, "the first term is the one-term quantization");
            for (c, &v) in x[i * k..(i + 1) * k].iter().enumerate() {
                let amax = x[i * k + c / BLOCK * BLOCK..][..BLOCK].iter().fold(0f32, |a, v| a.max(v.abs()));
                // Half the residual's step (its block maximum is at most half the first step), plus f32 rounding.
                let bound = amax / 127.0 / 2.0 / 127.0 / 2.0 + 4.0 * f32::EPSILON * v.abs();
                let err = (v - (a[c] + r[c])).abs();
                assert!(err <= bound, "row {i} value {c}: {v} held as {} + {} (bound {bound})", a[c], r[c]);
                worst_one = worst_one.max((v - single[c]).abs() / amax.max(f32::MIN_POSITIVE));
                worst_two = worst_two.max(err / amax.max(f32::MIN_POSITIVE));
            }
        }
        assert!(worst_two * 100.0 < worst_one, "two terms {worst_two} against one {worst_one}, relative to max|x|");
    }

    #[test]
    fn rounding_equals_f32_round_on_ties_and_neighbours() {
        let mut xs: Vec<f32> = (-255..=255).map(|h| h as f32 * 0.5).collect();
        for &x in &xs.clone() {
            xs.extend([x.next_up(), x.next_down()]);
        }
        xs.extend((0..100_000).map(|i| (i as f32 * 0.00127 - 63.5) * 2.0));
        for x in xs {
            assert_eq!(super::round(x), x.round() as i32, "{x}");
        }
    }
}
