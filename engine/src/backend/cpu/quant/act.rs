//! Activations quantized per 32-value block to int8 (llama.cpp's `Q8_0` for activations, with an f32 scale):
//! `d = max|x| / 127`, `q = round(x / d)`. The per-block `d * sum(q)` is kept too, for formats with a minimum
//! (`Q4_1`: `sum(w * x) = d_w d_x sum(q_w q_x) + m_w d_x sum(q_x)`).

use super::BLOCK;

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
    /// Quantizes `x[rows, k]` (`k` a multiple of 32).
    pub fn new(x: &[f32], rows: usize, k: usize) -> Self {
        debug_assert!(k.is_multiple_of(BLOCK));
        let blocks = rows * k / BLOCK;
        let mut q = vec![0i8; rows * k];
        let mut d = vec![0f32; blocks];
        let mut s = vec![0f32; blocks];
        for (b, (xb, qb)) in x[..rows * k].chunks_exact(BLOCK).zip(q.chunks_exact_mut(BLOCK)).enumerate() {
            let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
            let scale = amax / 127.0;
            let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
            let mut sum = 0i32;
            for (q, &v) in qb.iter_mut().zip(xb) {
                // |v * inv| <= 127 up to rounding of inv; the clamp keeps it there.
                let r = (v * inv).round().clamp(-127.0, 127.0) as i8;
                *q = r;
                sum += r as i32;
            }
            d[b] = scale;
            s[b] = scale * sum as f32;
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
