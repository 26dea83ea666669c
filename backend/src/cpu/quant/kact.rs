//! Activations for the k-quants, quantized per 256-value super-block to int8 (llama.cpp's `Q8_K`):
//! `d = max|x| / 127`, `q = round(x / d)`, with the sum of `q` over every 16 values. The sums carry the weights'
//! minimums (`Q4_K`, `Q5_K`: `- dmin m_s d_x sum_s(q)`) and `Q6_K`'s offset of 32 without touching the values again.

use super::SUPER_BLOCK;

/// `rows` activation rows of `k` values each, quantized per super-block.
#[derive(Debug, Clone)]
pub struct KQuantActs {
    pub(super) k: usize,
    pub(super) q: Vec<i8>,
    /// One scale per super-block, `rows * k / 256`.
    pub(super) d: Vec<f32>,
    /// `sum(q)` per 16 values, `rows * k / 16` (at most 16 * 127 in magnitude).
    pub(super) bsums: Vec<i16>,
}

impl KQuantActs {
    /// Quantizes `x[rows, k]` (`k` a multiple of 256).
    pub fn new(x: &[f32], rows: usize, k: usize) -> Self {
        debug_assert!(k.is_multiple_of(SUPER_BLOCK));
        let mut q = vec![0i8; rows * k];
        let mut d = vec![0f32; rows * k / SUPER_BLOCK];
        let mut bsums = vec![0i16; rows * k / 16];
        let blocks = x[..rows * k].chunks_exact(SUPER_BLOCK).zip(q.chunks_exact_mut(SUPER_BLOCK));
        for (b, (xb, qb)) in blocks.enumerate() {
            let scale = super::act::block_scale(xb);
            let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
            for (q, &v) in qb.iter_mut().zip(xb) {
                // |v * inv| <= 127 up to rounding of inv; the clamp keeps it there (and `maddubs` from saturating).
                *q = (v * inv).round().clamp(-127.0, 127.0) as i8;
            }
            d[b] = scale;
            for (s, qs) in qb.chunks_exact(16).enumerate() {
                bsums[b * 16 + s] = qs.iter().map(|&v| v as i16).sum();
            }
        }
        KQuantActs { k, q, d, bsums }
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.q.len().checked_div(self.k).unwrap_or(0)
    }

    /// The scale of super-block `b` of row `r`.
    pub fn scale(&self, r: usize, b: usize) -> f32 {
        self.d[r * (self.k / SUPER_BLOCK) + b]
    }

    /// Row `r` as f32 (`d * q`), for error bounds in tests.
    pub fn dequantize_row(&self, r: usize) -> Vec<f32> {
        let nb = self.k / SUPER_BLOCK;
        (0..self.k).map(|i| self.d[r * nb + i / SUPER_BLOCK] * self.q[r * self.k + i] as f32).collect()
    }
}
