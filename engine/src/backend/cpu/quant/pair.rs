//! The 32-value formats (`Q8_0`, `Q4_0`, `Q4_1`) rearranged for 512-bit VNNI: two consecutive blocks of a row
//! fill one 64-byte register, so one `vpdpbusd` sums 64 products and one convert and one FMA scale both blocks.
//!
//! In the GGUF layout each 32-value block carries its f16 scale beside its values, and one block is half a register:
//! the kernel in `dot` spends about twenty instructions a block on unpacking, scalar scale conversion and its own
//! convert and FMA, so at batch 1 it is bound by instructions, not by memory. Here each value is stored unsigned
//! (`u`, 0..15 or 0..255) with an f32 scale and offset per block, `x = d * u + m`:
//! - `Q4_1`: `u = q`, `m` its minimum; `Q4_0`: `u = q`, `m = -8 d`; `Q8_0`: `u = q + 128`, `m = -128 d`, since
//!   `vpdpbusd` multiplies unsigned by signed bytes;
//! - the 4-bit values of blocks `2p` and `2p + 1` share 32 bytes, byte `i` holding value `i` of block `2p` in its low
//!   nibble and value `i` of block `2p + 1` in its high one, so a mask and a shift give both blocks in order;
//! - so `w . x = sum_b d_b dx_b sum_i u_i x_i + sum_b m_b (dx_b sum_i x_i)`, the last factor being the activation
//!   block sums `QuantActs` keeps.
//!
//! The rearranged copy is made from a part's GGUF bytes the first time the kernel meets the part (`Part::pairs`);
//! the GGUF bytes stay for dequantization (prefill tiles, embeddings) and the other kernels.

use super::{f16_at, Format, QuantActs, BLOCK};

/// The shift `z` that makes `format`'s values unsigned for `vpdpbusd` (`u = q + z`, folded into the block's offset
/// as `-z d`): 128 for `Q8_0`, 8 for `Q4_0`, none for `Q4_1`'s already unsigned nibbles.
pub(super) const fn shift(format: Format) -> i16 {
    match format {
        Format::Q8_0 => 128,
        Format::Q4_0 => 8,
        _ => 0,
    }
}

/// A part's rows in the paired layout. Rows have an even number of blocks (`Paired::new` is None otherwise).
#[derive(Debug, Clone)]
pub(super) struct Paired {
    /// Bytes of values per block: 16 (4-bit, two blocks sharing 32 bytes) or 32.
    value_bytes: usize,
    blocks_per_row: usize,
    u: Vec<u8>,
    d: Vec<f32>,
    m: Vec<f32>,
}

impl Paired {
    /// The paired copy of `rows` rows of `format` blocks (`data` in the GGUF layout), or None for a format or
    /// width it does not cover.
    pub(super) fn new(format: Format, rows: usize, cols: usize, data: &[u8]) -> Option<Self> {
        let nb = cols / BLOCK;
        if format.is_k_quant() || !cols.is_multiple_of(2 * BLOCK) || data.len() != rows * nb * format.block_bytes() {
            return None;
        }
        let value_bytes = if format == Format::Q8_0 { 32 } else { 16 };
        let mut p = Paired {
            value_bytes,
            blocks_per_row: nb,
            u: vec![0; rows * nb * value_bytes],
            d: vec![0.0; rows * nb],
            m: vec![0.0; rows * nb],
        };
        let bb = format.block_bytes();
        for (b, blk) in data.chunks_exact(bb).enumerate() {
            let d = f16_at(blk, 0);
            p.d[b] = d;
            let z = shift(format);
            p.m[b] = if format == Format::Q4_1 { f16_at(blk, 2) } else { -(z as f32) * d };
            let mut vals = [0u8; BLOCK];
            match format {
                Format::Q8_0 => {
                    for (v, &q) in vals.iter_mut().zip(&blk[2..34]) {
                        *v = (q as i8 as i16 + z) as u8;
                    }
                }
                _ => {
                    let qs = if format == Format::Q4_0 { &blk[2..18] } else { &blk[4..20] };
                    for (j, &q) in qs.iter().enumerate() {
                        vals[j] = q & 0x0f;
                        vals[j + 16] = q >> 4;
                    }
                }
            }
            if value_bytes == 32 {
                p.u[b * 32..(b + 1) * 32].copy_from_slice(&vals);
            } else {
                // Blocks b (even: low nibbles) and b + 1 (odd: high nibbles) of the same row share 32 bytes.
                let (pair, shift) = (b / 2, (b % 2) * 4);
                for (o, v) in p.u[pair * 32..(pair + 1) * 32].iter_mut().zip(vals) {
                    *o |= v << shift;
                }
            }
        }
        Some(p)
    }

    /// `out[i] = row r of the part . x[r0 + i]`, `i < out.len() <= 4`, with the portable arithmetic the SIMD kernel
    /// reorders (for tests and CPUs without it).
    #[cfg(test)]
    pub(super) fn dot_rows_portable(&self, r: usize, acts: &QuantActs, r0: usize, out: &mut [f32]) {
        let nb = self.blocks_per_row;
        for (i, o) in out.iter_mut().enumerate() {
            let row = r0 + i;
            let mut acc = 0f32;
            for b in 0..nb {
                let g = r * nb + b;
                let x = &acts.q[row * acts.k + b * BLOCK..][..BLOCK];
                let isum: i32 = (0..BLOCK).map(|j| self.value(g, j) as i32 * x[j] as i32).sum();
                acc += self.d[g] * acts.d[row * nb + b] * isum as f32 + self.m[g] * acts.s[row * nb + b];
            }
            *o = acc;
        }
    }

    /// Value `j` of global block `g` (row-major over the part's blocks).
    #[cfg(test)]
    fn value(&self, g: usize, j: usize) -> u8 {
        if self.value_bytes == 32 {
            self.u[g * 32 + j]
        } else {
            (self.u[(g / 2) * 32 + j] >> ((g % 2) * 4)) & 0x0f
        }
    }

    /// `out[i] = row r . x[r0 + i]` for `i < out.len()` (at most 4) with AVX-512 VNNI.
    ///
    /// # Safety
    /// The CPU has AVX-512 F and VNNI (`Kernel::Avx512Pairs` is only offered then); `acts` has this part's width.
    #[cfg(target_arch = "x86_64")]
    pub(super) unsafe fn dot_rows(&self, r: usize, acts: &QuantActs, r0: usize, out: &mut [f32]) {
        debug_assert_eq!(acts.k, self.blocks_per_row * BLOCK);
        debug_assert!(out.len() <= 4 && r0 + out.len() <= acts.rows());
        match (self.value_bytes, out.len()) {
            (16, 1) => x86::rows::<1, true>(self, r, acts, r0, out),
            (16, 2) => x86::rows::<2, true>(self, r, acts, r0, out),
            (16, 3) => x86::rows::<3, true>(self, r, acts, r0, out),
            (16, _) => x86::rows::<4, true>(self, r, acts, r0, out),
            (_, 1) => x86::rows::<1, false>(self, r, acts, r0, out),
            (_, 2) => x86::rows::<2, false>(self, r, acts, r0, out),
            (_, 3) => x86::rows::<3, false>(self, r, acts, r0, out),
            (_, _) => x86::rows::<4, false>(self, r, acts, r0, out),
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::super::{QuantActs, BLOCK};
    use super::Paired;

    /// Lanes 0-7 take element 0 (block 2p's scale), lanes 8-15 element 1 (block 2p + 1's).
    #[inline(always)]
    unsafe fn pair_scales(p: *const f32) -> __m512 {
        let two = _mm_castpd_ps(_mm_load_sd(p.cast()));
        _mm512_permutexvar_ps(
            _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
            _mm512_castps128_ps512(two),
        )
    }

    /// `a . b` sixteen lanes at a time (the offsets' sum: a row's blocks, 18 to a few hundred).
    #[inline(always)]
    unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let mut acc = _mm512_setzero_ps();
        let mut i = 0;
        while i + 16 <= n {
            acc = _mm512_fmadd_ps(_mm512_loadu_ps(a.as_ptr().add(i)), _mm512_loadu_ps(b.as_ptr().add(i)), acc);
            i += 16;
        }
        let tail: f32 = a[i..n].iter().zip(&b[i..n]).map(|(x, y)| x * y).sum();
        _mm512_reduce_add_ps(acc) + tail
    }

    #[target_feature(enable = "avx2,fma,avx512f,avx512vnni")]
    pub(super) unsafe fn rows<const R: usize, const NIBBLES: bool>(
        w: &Paired,
        r: usize,
        acts: &QuantActs,
        r0: usize,
        out: &mut [f32],
    ) {
        let (k, nb) = (acts.k, w.blocks_per_row);
        let u = w.u.as_ptr().add(r * nb * w.value_bytes);
        let (wd, wm) = (&w.d[r * nb..(r + 1) * nb], &w.m[r * nb..(r + 1) * nb]);
        let (xq, xd) = (acts.q.as_ptr(), acts.d.as_ptr());
        let mask = _mm256_set1_epi8(0x0f);
        // Two accumulators per row (even and odd pairs) so that, at one row, consecutive FMAs do not wait on each
        // other.
        let mut acc = [[_mm512_setzero_ps(); 2]; R];
        for p in 0..nb / 2 {
            let wv = if NIBBLES {
                let raw = _mm256_loadu_si256(u.add(p * 32).cast());
                let lo = _mm256_and_si256(raw, mask);
                let hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
                _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
            } else {
                _mm512_loadu_si512(u.add(p * 64).cast())
            };
            let ws = pair_scales(wd.as_ptr().add(2 * p));
            for (i, a) in acc.iter_mut().enumerate() {
                let row = r0 + i;
                let x = _mm512_loadu_si512(xq.add(row * k + p * 2 * BLOCK).cast());
                let isum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv, x);
                let scale = _mm512_mul_ps(ws, pair_scales(xd.add(row * nb + 2 * p)));
                a[p & 1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, a[p & 1]);
            }
        }
        for (i, (o, a)) in out.iter_mut().zip(&acc).enumerate() {
            let xs = &acts.s[(r0 + i) * nb..(r0 + i + 1) * nb];
            *o = _mm512_reduce_add_ps(_mm512_add_ps(a[0], a[1])) + dot(wm, xs);
        }
    }
}
