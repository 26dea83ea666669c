//! Activations quantized per 32-value block to int8 (llama.cpp's `Q8_0` for activations, with an f32 scale):
//! `d = max|x| / 127`, `q = round(x / d)`. The per-block `d * sum(q)` is kept too, for formats with a minimum
//! (`Q4_1`: `sum(w * x) = d_w d_x sum(q_w q_x) + m_w d_x sum(q_x)`).

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

/// Quantizes whole blocks of `x` into `q`, one scale `d` and one `d * sum(q)` per block.
fn quantize(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    for (b, (xb, qb)) in x.chunks_exact(BLOCK).zip(q.chunks_exact_mut(BLOCK)).enumerate() {
        let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
        let scale = amax / 127.0;
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

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.q.len().checked_div(self.k).unwrap_or(0)
    }

    /// The scale of block `b` of row `r`.
    pub fn scale(&self, r: usize, b: usize) -> f32 {
        self.d[r * (self.k / BLOCK) + b]
    }

    /// Row `r` as f32 (`d * q`), for error bounds in tests.
    pub fn dequantize_row(&self, r: usize) -> Vec<f32> {
        let nb = self.k / BLOCK;
        (0..self.k).map(|i| self.d[r * nb + i / BLOCK] * self.q[r * self.k + i] as f32).collect()
    }
}

#[cfg(test)]
mod tests {
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
