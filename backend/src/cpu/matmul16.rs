//! Matrix multiply with 16-bit weights, `out[m, n] = x[m, k] . w[n, k]^T`, for every `m` (decode and prefill).
//!
//! Weights stay bf16 or f16 in memory and are widened to f32 in registers as they load (bf16: a 16-bit shift; f16:
//! `vcvtph2ps`); activations and sums stay f32, so the result is the exact product of the 16-bit weights with the f32
//! activations up to f32 summation order (vLLM's CPU bf16 path rounds the activations too; here they are not).
//! A register tile of up to 4 activation rows x 4 weight rows shares each converted weight vector across the rows,
//! so at batch 1 the weights are read once per step and batched rows reuse each weight vector from registers.
//! Weight rows are split over rayon's threads; activation rows go in chunks that stay in the core's L2 cache.
//! AVX-512F is used where the CPU has it, AVX2 + FMA + F16C otherwise (both checked at run time), with a portable
//! fallback.

use rayon::prelude::*;

/// A 16-bit weight matrix, row-major `[n, k]`, as raw bits.
#[derive(Clone, Copy)]
pub(super) enum Weights16<'a> {
    Bf16(&'a [u16]),
    F16(&'a [u16]),
}

/// Weight rows per rayon task.
const ROWS_PER_TASK: usize = 16;
/// Activation rows per pass over the weights: 32 rows of k = 4096 f32 are 512 KiB, inside one core's L2.
const X_CHUNK_BYTES: usize = 512 * 1024;
/// Register tile: activation rows x weight rows.
const MR: usize = 4;
const NR: usize = 4;
/// Weight rows of the one-activation-row tile (batch 1): eight independent sums keep more loads in flight (~70% of
/// the measured read bandwidth against ~55% with four, BENCHMARKS.md).
const WIDE: usize = 8;

/// Where the results go: row `i`, column `j` of the product lands at `out[i * ldo + col0 + j]`.
pub(super) struct OutCols<'a> {
    pub out: &'a mut [f32],
    pub ldo: usize,
    pub col0: usize,
}

/// A raw pointer shared by the tasks; each writes only its own weight rows' columns.
#[derive(Clone, Copy)]
struct SharedOut(*mut f32);
// SAFETY: tasks write disjoint elements (their own columns), and the pointer outlives the parallel loop.
unsafe impl Send for SharedOut {}
unsafe impl Sync for SharedOut {}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Isa {
    Avx512,
    // Detected on x86-64 only.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Avx2,
    Portable,
}

/// The best instruction set this CPU runs.
pub(super) fn detect() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx512f") {
            return Isa::Avx512;
        }
        if has!("avx2") && has!("fma") && has!("f16c") {
            return Isa::Avx2;
        }
    }
    Isa::Portable
}

/// One task through one ISA's tile kernels (bf16 or f16 weights).
macro_rules! run_with {
    ($task:ident, $isa:ident, $f16:literal) => {
        $task.run(
            $isa::tile::<$f16, 1, 1>,
            $isa::tile::<$f16, 1, WIDE>,
            [
                $isa::tile::<$f16, 1, NR>,
                $isa::tile::<$f16, 2, NR>,
                $isa::tile::<$f16, 3, NR>,
                $isa::tile::<$f16, 4, NR>,
            ],
        )
    };
}

/// `out = x . w^T` with `w` `[n, k]` in 16 bits (checked lengths: the caller's).
pub(super) fn matmul16(x: &[f32], w: Weights16<'_>, dst: OutCols<'_>, m: usize, k: usize, n: usize) {
    matmul16_with(detect(), x, w, dst, m, k, n)
}

pub(super) fn matmul16_with(isa: Isa, x: &[f32], w: Weights16<'_>, dst: OutCols<'_>, m: usize, k: usize, n: usize) {
    let (bits, f16) = match w {
        Weights16::Bf16(b) => (b, false),
        Weights16::F16(b) => (b, true),
    };
    assert!(bits.len() >= n * k && x.len() >= m * k, "matmul16: operands smaller than [{m}, {k}] x [{n}, {k}]");
    assert!(m == 0 || dst.out.len() >= (m - 1) * dst.ldo + dst.col0 + n, "matmul16: output too small");
    let (ldo, col0) = (dst.ldo, dst.col0);
    let out = SharedOut(dst.out.as_mut_ptr());
    let chunk = (X_CHUNK_BYTES / (4 * k.max(1))).clamp(MR, 256) / MR * MR;
    // The AVX-512 bf16 kernel widens 32 weights at once into their even and odd elements: it reads activations
    // split the same way (`even_odd`).
    let split = isa == Isa::Avx512 && !f16;
    for r0 in (0..m).step_by(chunk.max(1)) {
        let rows = chunk.min(m - r0);
        let xs = &x[r0 * k..(r0 + rows) * k];
        let owned = split.then(|| even_odd(xs, k));
        let xs = owned.as_deref().unwrap_or(xs);
        (0..n.div_ceil(ROWS_PER_TASK)).into_par_iter().for_each(|t| {
            let (j0, j1) = (t * ROWS_PER_TASK, ((t + 1) * ROWS_PER_TASK).min(n));
            let task = Task { x: xs, w: bits, k, rows, j0, j1, out, ldo, col0, row0: r0 };
            // SAFETY: `Task::run_*` touch x rows `< rows`, weight rows `j0..j1` and the output elements of those
            // rows and columns, all inside the lengths asserted above; the ISA was detected (or is portable).
            unsafe {
                match (isa, f16) {
                    #[cfg(target_arch = "x86_64")]
                    (Isa::Avx512, false) => run_with!(task, avx512, false),
                    #[cfg(target_arch = "x86_64")]
                    (Isa::Avx512, true) => run_with!(task, avx512, true),
                    #[cfg(target_arch = "x86_64")]
                    (Isa::Avx2, false) => run_with!(task, avx2, false),
                    #[cfg(target_arch = "x86_64")]
                    (Isa::Avx2, true) => run_with!(task, avx2, true),
                    (_, false) => run_with!(task, portable, false),
                    (_, true) => run_with!(task, portable, true),
                }
            }
        });
    }
}

/// Rows of `k` activations with each whole block of 32 reordered as its 16 even-indexed values, then its 16
/// odd-indexed ones (the order in which `avx512::tile` widens 32 bf16 weights); the last `k % 32` stay in order.
fn even_odd(x: &[f32], k: usize) -> Vec<f32> {
    let mut out = x.to_vec();
    for (o, row) in out.chunks_mut(k).zip(x.chunks(k)) {
        for (ob, xb) in o.chunks_exact_mut(32).zip(row.chunks_exact(32)) {
            for l in 0..16 {
                ob[l] = xb[2 * l];
                ob[16 + l] = xb[2 * l + 1];
            }
        }
    }
    out
}

/// A tile kernel: `out[i * ldo + j] = x row i . w row j` for its rows, over `k` values (`ldx = ldw = k`).
type TileFn = unsafe fn(x: *const f32, w: *const u16, k: usize, out: *mut f32, ldo: usize);

/// One task: weight rows `j0..j1` against `rows` activation rows.
struct Task<'a> {
    x: &'a [f32],
    w: &'a [u16],
    k: usize,
    rows: usize,
    j0: usize,
    j1: usize,
    out: SharedOut,
    ldo: usize,
    col0: usize,
    row0: usize,
}

impl Task<'_> {
    /// `tiles[r - 1]` multiplies r activation rows by NR weight rows; `wide` one activation row by WIDE weight rows;
    /// `one` one row by one row (the last n % NR weight rows).
    unsafe fn run(&self, one: TileFn, wide: TileFn, tiles: [TileFn; MR]) {
        let k = self.k;
        let mut j = self.j0;
        while j < self.j1 {
            if self.rows == 1 && self.j1 - j >= WIDE {
                let out = self.out.0.add(self.row0 * self.ldo + self.col0 + j);
                wide(self.x.as_ptr(), self.w.as_ptr().add(j * k), k, out, self.ldo);
                j += WIDE;
                continue;
            }
            let nr = (self.j1 - j).min(NR);
            let mut i = 0;
            while i < self.rows {
                let mr = (self.rows - i).min(MR);
                let x = self.x.as_ptr().add(i * k);
                let out = self.out.0.add((self.row0 + i) * self.ldo + self.col0 + j);
                if nr == NR {
                    tiles[mr - 1](x, self.w.as_ptr().add(j * k), k, out, self.ldo);
                } else {
                    for r in 0..mr {
                        for c in 0..nr {
                            one(x.add(r * k), self.w.as_ptr().add((j + c) * k), k, out.add(r * self.ldo + c), self.ldo);
                        }
                    }
                }
                i += mr;
            }
            j += nr;
        }
    }
}

/// Portable: widen each weight, multiply-add in f32 lanes of 8 the compiler vectorizes.
mod portable {
    #[inline(always)]
    pub(super) fn widen<const F16: bool>(b: u16) -> f32 {
        if F16 {
            half::f16::from_bits(b).to_f32()
        } else {
            f32::from_bits((b as u32) << 16)
        }
    }

    pub(super) unsafe fn tile<const F16: bool, const R: usize, const C: usize>(
        x: *const f32,
        w: *const u16,
        k: usize,
        out: *mut f32,
        ldo: usize,
    ) {
        let mut acc = [[[0f32; 8]; C]; R];
        let whole = k / 8 * 8;
        let mut wv = [[0f32; 8]; C];
        for kk in (0..whole).step_by(8) {
            for (c, wv) in wv.iter_mut().enumerate() {
                for (l, v) in wv.iter_mut().enumerate() {
                    *v = widen::<F16>(*w.add(c * k + kk + l));
                }
            }
            for (r, acc) in acc.iter_mut().enumerate() {
                for (c, acc) in acc.iter_mut().enumerate() {
                    for l in 0..8 {
                        acc[l] += *x.add(r * k + kk + l) * wv[c][l];
                    }
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            for (c, acc) in acc.iter().enumerate() {
                let mut s: f32 = acc.iter().sum();
                for kk in whole..k {
                    s += *x.add(r * k + kk) * widen::<F16>(*w.add(c * k + kk));
                }
                *out.add(r * ldo + c) = s;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    #[inline(always)]
    unsafe fn widen<const F16: bool>(v: __m256i) -> __m512 {
        if F16 {
            _mm512_cvtph_ps(v)
        } else {
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(v)))
        }
    }

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn tile<const F16: bool, const R: usize, const C: usize>(
        x: *const f32,
        w: *const u16,
        k: usize,
        out: *mut f32,
        ldo: usize,
    ) {
        let mut acc = [[_mm512_setzero_ps(); C]; R];
        let mut wv = [_mm512_setzero_ps(); C];
        let mut kk = 0;
        if !F16 {
            // 32 bf16 weights per load as 16 dwords: the even elements are the low halves (shifted up), the odd ones
            // the high halves (masked): two instructions for 32 values. The activations come split to match.
            let high = _mm512_set1_epi32(0xffff_0000_u32 as i32);
            let mut odd = [_mm512_setzero_ps(); C];
            while kk + 32 <= k {
                for c in 0..C {
                    let d = _mm512_loadu_si512(w.add(c * k + kk) as *const _);
                    wv[c] = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(d));
                    odd[c] = _mm512_castsi512_ps(_mm512_and_si512(d, high));
                }
                for (r, acc) in acc.iter_mut().enumerate() {
                    let xe = _mm512_loadu_ps(x.add(r * k + kk));
                    let xo = _mm512_loadu_ps(x.add(r * k + kk + 16));
                    for c in 0..C {
                        acc[c] = _mm512_fmadd_ps(xo, odd[c], _mm512_fmadd_ps(xe, wv[c], acc[c]));
                    }
                }
                kk += 32;
            }
        }
        while kk + 16 <= k {
            for (c, wv) in wv.iter_mut().enumerate() {
                *wv = widen::<F16>(_mm256_loadu_si256(w.add(c * k + kk) as *const __m256i));
            }
            for (r, acc) in acc.iter_mut().enumerate() {
                let xv = _mm512_loadu_ps(x.add(r * k + kk));
                for (acc, wv) in acc.iter_mut().zip(&wv) {
                    *acc = _mm512_fmadd_ps(xv, *wv, *acc);
                }
            }
            kk += 16;
        }
        if kk < k {
            // The last k % 16 values under a mask (masked-off lanes read nothing and load as zero).
            let mask: __mmask16 = (1u32 << (k - kk)) as u16 - 1;
            for (c, wv) in wv.iter_mut().enumerate() {
                // AVX-512F has no 16-bit masked load (that is AVX-512BW): the tail goes through a zeroed array.
                let mut lane = [0u16; 16];
                for (l, v) in lane.iter_mut().enumerate().take(k - kk) {
                    *v = *w.add(c * k + kk + l);
                }
                *wv = widen::<F16>(_mm256_loadu_si256(lane.as_ptr() as *const __m256i));
            }
            for (r, acc) in acc.iter_mut().enumerate() {
                let xv = _mm512_maskz_loadu_ps(mask, x.add(r * k + kk));
                for (acc, wv) in acc.iter_mut().zip(&wv) {
                    *acc = _mm512_fmadd_ps(xv, *wv, *acc);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            for (c, acc) in acc.iter().enumerate() {
                *out.add(r * ldo + c) = _mm512_reduce_add_ps(*acc);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    #[inline(always)]
    unsafe fn widen<const F16: bool>(v: __m128i) -> __m256 {
        if F16 {
            _mm256_cvtph_ps(v)
        } else {
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(v)))
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn tile<const F16: bool, const R: usize, const C: usize>(
        x: *const f32,
        w: *const u16,
        k: usize,
        out: *mut f32,
        ldo: usize,
    ) {
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        let mut wv = [_mm256_setzero_ps(); C];
        let mut kk = 0;
        while kk + 8 <= k {
            for (c, wv) in wv.iter_mut().enumerate() {
                *wv = widen::<F16>(_mm_loadu_si128(w.add(c * k + kk) as *const __m128i));
            }
            for (r, acc) in acc.iter_mut().enumerate() {
                let xv = _mm256_loadu_ps(x.add(r * k + kk));
                for (acc, wv) in acc.iter_mut().zip(&wv) {
                    *acc = _mm256_fmadd_ps(xv, *wv, *acc);
                }
            }
            kk += 8;
        }
        for (r, acc) in acc.iter().enumerate() {
            for (c, acc) in acc.iter().enumerate() {
                let mut lanes = [0f32; 8];
                _mm256_storeu_ps(lanes.as_mut_ptr(), *acc);
                let mut s: f32 = lanes.iter().sum();
                for t in kk..k {
                    s += *x.add(r * k + t) * super::portable::widen::<F16>(*w.add(c * k + t));
                }
                *out.add(r * ldo + c) = s;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values in about [-1, 1].
    fn values(len: usize, seed: u32) -> Vec<f32> {
        (0..len).map(|i| (((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 2001) as f32 / 1000.0 - 1.0).collect()
    }

    fn isas() -> Vec<Isa> {
        #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
        let mut v = vec![Isa::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx2") && has!("fma") && has!("f16c") {
                v.push(Isa::Avx2);
            }
            if has!("avx512f") {
                v.push(Isa::Avx512);
            }
        }
        v
    }

    /// Every ISA at m = 1, 7, 64 (register-tile remainders, several row chunks at k = 4100), k with and without a
    /// tail, n not a multiple of the tile: equal to the f64 product of the widened 16-bit weights (the kernel adds
    /// no rounding beyond f32 sums), and within bf16 / f16 rounding of the f32 weights' product.
    #[test]
    fn equals_the_product_of_the_widened_weights_and_the_f32_product_within_16_bit_rounding() {
        for (m, k, n) in [(1, 77, 50), (7, 256, 37), (64, 4100, 21), (3, 16, 4)] {
            let x = values(m * k, 7);
            let w = values(n * k, 11);
            for f16 in [false, true] {
                let bits: Vec<u16> = w
                    .iter()
                    .map(|&v| if f16 { half::f16::from_f32(v).to_bits() } else { half::bf16::from_f32(v).to_bits() })
                    .collect();
                let widened: Vec<f32> = bits.iter().map(|&b| portable::widen::<false>(b)).collect();
                let widened: Vec<f32> =
                    if f16 { bits.iter().map(|&b| half::f16::from_bits(b).to_f32()).collect() } else { widened };
                let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>();
                let weights = if f16 { Weights16::F16(&bits) } else { Weights16::Bf16(&bits) };
                // Weights rounded to 16 bits move each product by up to 2^-8 (bf16) of its size: a sum of k of
                // them by ~sqrt(k) of that for random signs; 4 sqrt(k) 2^-9 bounds it with room.
                let rounding = if f16 { 2f64.powi(-11) } else { 2f64.powi(-8) } * 4.0 * (k as f64).sqrt();
                for isa in isas() {
                    // Into the middle columns of a wider output, as a fused projection's part.
                    let (ldo, col0) = (n + 5, 3);
                    let mut out = vec![f32::NAN; m * ldo];
                    matmul16_with(isa, &x, weights, OutCols { out: &mut out, ldo, col0 }, m, k, n);
                    for i in 0..m {
                        assert!(out[i * ldo..i * ldo + col0].iter().all(|v| v.is_nan()), "{isa:?} wrote outside");
                        for j in 0..n {
                            let (xr, got) = (&x[i * k..(i + 1) * k], out[i * ldo + col0 + j] as f64);
                            let exact = dot(xr, &widened[j * k..(j + 1) * k]);
                            assert!(
                                (got - exact).abs() <= 1e-5 * (k as f64),
                                "{isa:?} f16={f16} m={m} k={k}: {got} vs {exact}"
                            );
                            let f32_product = dot(xr, &w[j * k..(j + 1) * k]);
                            assert!((got - f32_product).abs() <= rounding, "{isa:?} f16={f16}: {got} vs {f32_product}");
                        }
                    }
                }
            }
        }
    }
}
