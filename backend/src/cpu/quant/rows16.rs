//! Packed weights with sixteen rows interleaved, for 512-bit VNNI: the 32-value formats (`Q8_0`, `Q4_0`, `Q4_1`,
//! `Q5_0`, `Q5_1`) and the k-quants `Q4_K` / `Q5_K` (as 32-value blocks with a scale and minimum each). One register
//! holds four consecutive values of each of sixteen rows, so one `vpdpbusd` against four activation bytes broadcast
//! to every lane adds 64 products into sixteen different outputs.
//!
//! Against a layout that keeps a row's values together (a register holding 64 values of one row), this needs no
//! horizontal sums, and the per-block work that does not scale with the values (converting the block's integer sum,
//! applying both scales, the offset term) is done once for sixteen rows instead of once per row: about 13 vector
//! operations per block and activation row for 512 products, where a layout of two blocks of one row per register
//! spent about 9 per 64 (and the GGUF layout about 20 per 32). The weights' registers are reused for every
//! activation row of a tile, so batched rows (decode of many sequences, prefill) run at the integer units' rate
//! rather than at the rate the weights are unpacked.
//!
//! Layout, per group of sixteen rows `g` and block `b` (row-major over groups, then blocks):
//! - values unsigned (`u`) with `x = d * u + m`: `Q4_1` / `Q5_1`: `u = q`, `m` the block's minimum; `Q4_K` /
//!   `Q5_K`: `u = q`, `d` and `m` the sub-block's `d * scale` and `-dmin * min`; the signed formats `u = q + z`,
//!   `m = -z d` (`Format::shift`: 8 for `Q4_0`, 16 for `Q5_0`, 128 for `Q8_0`), since `vpdpbusd` multiplies unsigned
//!   by signed bytes;
//! - a byte a value (`Q8_0`, `Q5_0`, `Q5_1`, `Q5_K`): eight 64-byte registers; register `t`, lane `j` (bytes
//!   `4j .. 4j + 4`) holds values `4t .. 4t + 4` of row `16g + j`;
//! - 4-bit (`Q4_0`, `Q4_1`, `Q4_K`): four 64-byte registers; register `t`, lane `j` holds values `4t .. 4t + 4` of
//!   row `16g + j` in the low nibbles and values `16 + 4t .. 16 + 4t + 4` in the high ones;
//! - an f32 scale per row and block (sixteen consecutive floats), and the minimum likewise for the formats with one;
//!   the signed formats' offsets are `-z d`, applied once at the end (`sum_b m_b s_b = -z sum_b d_b s_b`, with `s_b`
//!   the activation block sums `QuantActs` keeps).
//!
//! Activations are quantized per 32 values for every format here (the k-quants' GGUF-layout kernels use 256).
//! Rows past the last of a part (its row count not a multiple of sixteen) are zero, and their outputs are dropped.
//! The copy is made from a part's GGUF bytes the first time the kernel meets the part (`Part::rows16`); the GGUF
//! bytes stay for dequantization (embeddings, `Q6_K`'s prefill tiles) and the other kernels.

use super::{f16_at, kblock, Format, QuantActs, BLOCK, SUPER_BLOCK};

/// Weight rows interleaved in one group (the lanes of a 512-bit register of i32).
pub(super) const LANES: usize = 16;

/// A part's rows, sixteen to a group.
#[derive(Debug, Clone)]
pub(super) struct Rows16 {
    format: Format,
    /// Bytes of values per group and block: 512 (a byte a value) or 256 (4-bit).
    value_bytes: usize,
    blocks_per_row: usize,
    groups: usize,
    u: Vec<u8>,
    d: Vec<f32>,
    /// The minima (empty for the signed formats).
    m: Vec<f32>,
}

impl Rows16 {
    /// The interleaved copy of `rows` rows of `format` blocks (`data` in the GGUF layout), or None for a format
    /// it does not take (`takes`).
    pub(super) fn new(format: Format, rows: usize, cols: usize, data: &[u8]) -> Option<Self> {
        let nb = cols / BLOCK;
        if !Self::takes(format)
            || !cols.is_multiple_of(format.block_len())
            || data.len() != rows * format.row_bytes(cols)
        {
            return None;
        }
        let groups = rows.div_ceil(LANES);
        let nibbles = matches!(format, Format::Q4_0 | Format::Q4_1 | Format::Q4_K);
        let with_min = format.has_min() || format.is_k_quant();
        let value_bytes = if nibbles { 256 } else { 512 };
        let mut t = Rows16 {
            format,
            value_bytes,
            blocks_per_row: nb,
            groups,
            u: vec![0; groups * nb * value_bytes],
            d: vec![0.0; groups * nb * LANES],
            m: if with_min { vec![0.0; groups * nb * LANES] } else { Vec::new() },
        };
        for (r, row) in data.chunks_exact(format.row_bytes(cols)).enumerate() {
            let (g, j) = (r / LANES, r % LANES);
            blocks(format, row, |b, u, d, m| {
                let gb = g * nb + b;
                t.d[gb * LANES + j] = d;
                if with_min {
                    t.m[gb * LANES + j] = m;
                }
                let at = |i: usize| gb * value_bytes + (i / 4) * 64 + j * 4 + i % 4;
                if nibbles {
                    // Value i (low nibble) and value i + 16 (high) share a byte, as in the GGUF block.
                    for i in 0..16 {
                        t.u[at(i)] = u[i] | (u[i + 16] << 4);
                    }
                } else {
                    for (i, &v) in u.iter().enumerate() {
                        t.u[at(i)] = v;
                    }
                }
            });
        }
        Some(t)
    }

    /// Bytes of the interleaved copy of `rows` x `cols` values of `format` (what `new` allocates).
    pub(super) fn bytes(format: Format, rows: usize, cols: usize) -> usize {
        let nibbles = matches!(format, Format::Q4_0 | Format::Q4_1 | Format::Q4_K);
        let scales = if format.has_min() || format.is_k_quant() { 2 } else { 1 };
        rows.div_ceil(LANES) * (cols / BLOCK) * (if nibbles { 256 } else { 512 } + scales * 4 * LANES)
    }

    /// Whether `format` has an interleaved form: the 32-value formats, and `Q4_K` / `Q5_K` (a scale and minimum
    /// per 32 values); not `Q6_K`, whose scales cover 16.
    pub(super) fn takes(format: Format) -> bool {
        format != Format::Q6_K
    }

    /// Bytes allocated (what `bytes` must predict).
    #[cfg(test)]
    pub(super) fn allocated(&self) -> usize {
        self.u.len() + 4 * (self.d.len() + self.m.len())
    }

    /// Value `i` of row `j` of group `g`, block `b`.
    #[cfg(test)]
    fn value(&self, g: usize, b: usize, j: usize, i: usize) -> u8 {
        let base = (g * self.blocks_per_row + b) * self.value_bytes + j * 4;
        if self.value_bytes == 512 {
            self.u[base + (i / 4) * 64 + i % 4]
        } else {
            let byte = self.u[base + ((i % 16) / 4) * 64 + i % 4];
            if i < 16 {
                byte & 0x0f
            } else {
                byte >> 4
            }
        }
    }

    /// `out[i][j] = row 16 g + j . x[r0 + i]` with the portable arithmetic the SIMD kernel reorders (tests).
    #[cfg(test)]
    pub(super) fn dot_tile_portable(&self, g: usize, acts: &QuantActs, r0: usize, out: &mut [[f32; LANES]]) {
        let nb = self.blocks_per_row;
        let z = self.format.shift() as f32;
        for (i, o) in out.iter_mut().enumerate() {
            let row = r0 + i;
            for (j, o) in o.iter_mut().enumerate() {
                let mut acc = 0f32;
                for b in 0..nb {
                    let gb = (g * nb + b) * LANES + j;
                    let x = &acts.q[row * acts.k + b * BLOCK..][..BLOCK];
                    let isum: i32 = (0..BLOCK).map(|t| self.value(g, b, j, t) as i32 * x[t] as i32).sum();
                    let m = if self.m.is_empty() { -z * self.d[gb] } else { self.m[gb] };
                    acc += self.d[gb] * acts.d[row * nb + b] * isum as f32 + m * acts.s[row * nb + b];
                }
                *o = acc;
            }
        }
    }

    /// `out[i][j] = row 16 g + j . x[r0 + i]` for `i < out.len()` (at most 4) with AVX-512 VNNI.
    ///
    /// # Safety
    /// The CPU has AVX-512 F, BW and VNNI (`Kernel::Avx512Rows16` is only offered then); `acts` has this part's
    /// width and at least `r0 + out.len()` rows; `g < self.groups()`.
    #[cfg(target_arch = "x86_64")]
    pub(super) unsafe fn dot_tile(&self, g: usize, acts: &QuantActs, r0: usize, out: &mut [[f32; LANES]]) {
        debug_assert_eq!(acts.k, self.blocks_per_row * BLOCK);
        debug_assert!(out.len() <= 4 && r0 + out.len() <= acts.rows() && g < self.groups);
        let z = self.format.shift() as f32;
        macro_rules! tile {
            ($nib:literal, $min:literal) => {
                match out.len() {
                    1 => x86::tile::<1, $nib, $min>(self, g, acts, r0, z, out),
                    2 => x86::tile::<2, $nib, $min>(self, g, acts, r0, z, out),
                    3 => x86::tile::<3, $nib, $min>(self, g, acts, r0, z, out),
                    _ => x86::tile::<4, $nib, $min>(self, g, acts, r0, z, out),
                }
            };
        }
        match (self.value_bytes == 256, !self.m.is_empty()) {
            (false, false) => tile!(false, false),
            (false, true) => tile!(false, true),
            (true, false) => tile!(true, false),
            (true, true) => tile!(true, true),
        }
    }
}

/// Calls `f(b, u, d, m)` for each 32-value block `b` of a row in `format`: unsigned values `u` with `x = d u + m`
/// (`m` unused for the signed formats, whose offset is `-shift d`). A `Q4_K` / `Q5_K` sub-block's factors are
/// `d * scale` and `-dmin * min`, products of an f16 and a 6-bit integer, so exact in f32: the values are the ones
/// the GGUF decoding gives.
fn blocks(format: Format, row: &[u8], mut f: impl FnMut(usize, &[u8; BLOCK], f32, f32)) {
    let bb = format.block_bytes();
    for (sb, blk) in row.chunks_exact(bb).enumerate() {
        if format.is_k_quant() {
            let u = kblock::unpack(format, blk);
            for s in 0..SUPER_BLOCK / BLOCK {
                let vals: &[u8; BLOCK] = u.q[s * BLOCK..(s + 1) * BLOCK].try_into().expect("32 values");
                // Scales and minimums are per 16 values in `Unpacked`, equal in pairs for these formats.
                let (d, m) = (u.d * u.scale[2 * s] as f32, -(u.dmin * u.min[2 * s] as f32));
                f(sb * (SUPER_BLOCK / BLOCK) + s, vals, d, m);
            }
        } else {
            let m = if format.has_min() { f16_at(blk, 2) } else { 0.0 };
            f(sb, &format.unsigned_values(blk), f16_at(blk, 0), m);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::super::{QuantActs, BLOCK};
    use super::{Rows16, LANES};

    /// `NIBBLES`: 4-bit values (else a byte each); `MIN`: the format keeps a minimum per block, else the offset is
    /// `-z d`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn tile<const R: usize, const NIBBLES: bool, const MIN: bool>(
        w: &Rows16,
        g: usize,
        acts: &QuantActs,
        r0: usize,
        z: f32,
        out: &mut [[f32; LANES]],
    ) {
        let (k, nb) = (acts.k, w.blocks_per_row);
        let u = w.u.as_ptr().add(g * nb * w.value_bytes);
        let d = w.d.as_ptr().add(g * nb * LANES);
        let m = if MIN { w.m.as_ptr().add(g * nb * LANES) } else { d };
        let xq = acts.q.as_ptr().add(r0 * k);
        let (xd, xs) = (acts.d.as_ptr().add(r0 * nb), acts.s.as_ptr().add(r0 * nb));
        let mask = _mm512_set1_epi8(0x0f);
        // Per activation row: the scaled block sums, and the offsets' term (`m . s`, or `d . s` times `-z`).
        let mut acc = [_mm512_setzero_ps(); R];
        let mut off = [_mm512_setzero_ps(); R];
        for b in 0..nb {
            let mut wv = [_mm512_setzero_si512(); 8];
            if NIBBLES {
                for t in 0..4 {
                    let raw = _mm512_loadu_si512(u.add(b * 256 + t * 64).cast());
                    wv[t] = _mm512_and_si512(raw, mask);
                    wv[t + 4] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), mask);
                }
            } else {
                for (t, v) in wv.iter_mut().enumerate() {
                    *v = _mm512_loadu_si512(u.add(b * 512 + t * 64).cast());
                }
            }
            let wd = _mm512_loadu_ps(d.add(b * LANES));
            let wm = _mm512_loadu_ps(m.add(b * LANES));
            for i in 0..R {
                let x = xq.add(i * k + b * BLOCK).cast::<i32>();
                // Two chains of four, so the adds do not all wait on each other.
                let (mut ia, mut ib) = (_mm512_setzero_si512(), _mm512_setzero_si512());
                for t in (0..8).step_by(2) {
                    ia = _mm512_dpbusd_epi32(ia, wv[t], _mm512_set1_epi32(x.add(t).read_unaligned()));
                    ib = _mm512_dpbusd_epi32(ib, wv[t + 1], _mm512_set1_epi32(x.add(t + 1).read_unaligned()));
                }
                let scale = _mm512_mul_ps(wd, _mm512_set1_ps(*xd.add(i * nb + b)));
                acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(ia, ib)), scale, acc[i]);
                off[i] = _mm512_fmadd_ps(wm, _mm512_set1_ps(*xs.add(i * nb + b)), off[i]);
            }
        }
        let z = if MIN { 1.0 } else { -z };
        for (o, (a, s)) in out.iter_mut().zip(acc.iter().zip(&off)) {
            _mm512_storeu_ps(o.as_mut_ptr(), _mm512_fmadd_ps(*s, _mm512_set1_ps(z), *a));
        }
    }
}
