//! Dot products of one packed weight row of a 32-value format (`Q8_0`, `Q4_0`, `Q4_1`, `Q5_0`, `Q5_1`; the k-quants
//! are `kdot`'s)
//! with up to `MAX_ROWS` quantized activation rows. Each weight block is
//! loaded and unpacked once and used for every activation row (the reuse that makes batched rows cheap).
//!
//! Four kernels give the same integer block sums: a portable scalar one (always compiled and tested), AVX2
//! (`maddubs` on |w| and sign-adjusted x, then `madd` to i32), AVX-512 VNNI (`vpdpbusd` on the same operands), and
//! on aarch64 `SDOT` (`neon.rs`).
//! They differ only in the order the scaled block sums are added in f32. The products never saturate the i16
//! lanes of `maddubs`: |w| <= 128 and |x| <= 127, so a pair is at most 32,512.

use super::{f16_at, Format, QuantActs, BLOCK};

/// Most activation rows one call handles.
pub const MAX_ROWS: usize = 4;

/// An implementation of the block dot product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    Scalar,
    Avx2,
    Avx512Vnni,
    /// 512-bit VNNI on sixteen weight rows at a time (`rows16`) for every format but `Q6_K`, which takes
    /// `Avx512Vnni`'s kernel.
    Avx512Rows16,
    /// aarch64 with the dot-product extension (`neon.rs`) for the 32-value formats; the k-quants take the portable
    /// kernel.
    #[cfg(target_arch = "aarch64")]
    NeonDot,
}

impl Kernel {
    /// The fastest kernel this CPU runs (checked at run time).
    pub fn detect() -> Self {
        static BEST: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| Self::available().into_iter().last().unwrap_or(Kernel::Scalar))
    }

    /// Every kernel this CPU runs, slowest first.
    pub fn available() -> Vec<Kernel> {
        let mut v = vec![Kernel::Scalar];
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx2") && has!("fma") && has!("f16c") {
                v.push(Kernel::Avx2);
                if has!("avx512vnni") && has!("avx512vl") {
                    v.push(Kernel::Avx512Vnni);
                    if has!("avx512f") && has!("avx512bw") {
                        v.push(Kernel::Avx512Rows16);
                    }
                }
            }
        }
        #[cfg(target_arch = "aarch64")]
        if std::arch::is_aarch64_feature_detected!("dotprod") {
            v.push(Kernel::NeonDot);
        }
        v
    }
}

/// `out[i] = w_row . x[r0 + i]` for `i < out.len()` (at most `MAX_ROWS`).
pub(super) fn dot_rows(kernel: Kernel, format: Format, w: &[u8], acts: &QuantActs, r0: usize, out: &mut [f32]) {
    debug_assert!(!format.is_k_quant() && out.len() <= MAX_ROWS && r0 + out.len() <= acts.rows());
    debug_assert_eq!(w.len(), acts.k / BLOCK * format.block_bytes());
    match kernel {
        Kernel::Scalar => scalar(format, w, acts, r0, out),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Kernel::available` only offers these after detecting the features; the row lengths were checked
        // against `acts.k` by the caller (`matmul`), which the kernels read within.
        Kernel::Avx2 | Kernel::Avx512Vnni | Kernel::Avx512Rows16 => unsafe {
            // One instance per (kernel, format, rows): the format's branches fold away inside the block loop.
            macro_rules! rows {
                ($f:ident, $fmt:expr) => {
                    match out.len() {
                        1 => x86::$f::<1, { $fmt }>(w, acts, r0, out),
                        2 => x86::$f::<2, { $fmt }>(w, acts, r0, out),
                        3 => x86::$f::<3, { $fmt }>(w, acts, r0, out),
                        _ => x86::$f::<4, { $fmt }>(w, acts, r0, out),
                    }
                };
            }
            match (kernel, format) {
                (Kernel::Avx2, Format::Q8_0) => rows!(avx2, x86::Q8_0),
                (Kernel::Avx2, Format::Q4_0) => rows!(avx2, x86::Q4_0),
                (Kernel::Avx2, Format::Q5_0) => rows!(avx2, x86::Q5_0),
                (Kernel::Avx2, Format::Q5_1) => rows!(avx2, x86::Q5_1),
                (Kernel::Avx2, _) => rows!(avx2, x86::Q4_1),
                (_, Format::Q8_0) => rows!(vnni, x86::Q8_0),
                (_, Format::Q4_0) => rows!(vnni, x86::Q4_0),
                (_, Format::Q5_0) => rows!(vnni, x86::Q5_0),
                (_, Format::Q5_1) => rows!(vnni, x86::Q5_1),
                (_, _) => rows!(vnni, x86::Q4_1),
            }
        },
        // SAFETY: offered only where `dotprod` was detected; the caller checked the row against `acts.k`.
        #[cfg(target_arch = "aarch64")]
        Kernel::NeonDot => unsafe { super::neon::dot_rows(format, w, acts, r0, out) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => scalar(format, w, acts, r0, out),
    }
}

/// The integer sum of block `blk`'s values times 32 activation values, and the block's scale and minimum (the
/// 32-value formats; the k-quants' sums are `kblock::isums`).
#[inline]
pub(super) fn block_isum(format: Format, blk: &[u8], x: &[i8]) -> (i32, f32, f32) {
    let d = f16_at(blk, 0);
    match format {
        Format::Q8_0 => (blk[2..34].iter().zip(x).map(|(&w, &x)| w as i8 as i32 * x as i32).sum(), d, 0.0),
        Format::Q4_0 | Format::Q4_1 | Format::Q5_0 | Format::Q5_1 => {
            let (u, z) = (format.unsigned_values(blk), format.shift() as i32);
            let m = if format.has_min() { f16_at(blk, 2) } else { 0.0 };
            (u.iter().zip(x).map(|(&u, &x)| (u as i32 - z) * x as i32).sum(), d, m)
        }
        Format::Q4_K | Format::Q5_K | Format::Q6_K => unreachable!("block_isum takes the 32-value formats"),
    }
}

fn scalar(format: Format, w: &[u8], acts: &QuantActs, r0: usize, out: &mut [f32]) {
    let (k, bb) = (acts.k, format.block_bytes());
    let nb = k / BLOCK;
    for (i, o) in out.iter_mut().enumerate() {
        let r = r0 + i;
        let mut acc = 0f32;
        for (b, blk) in w.chunks_exact(bb).enumerate() {
            let (isum, d, m) = block_isum(format, blk, &acts.q[r * k + b * BLOCK..]);
            acc += d * acts.d[r * nb + b] * isum as f32;
            if format.has_min() {
                acc += m * acts.s[r * nb + b];
            }
        }
        *o = acc;
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::super::{Format, QuantActs, BLOCK};

    /// `Format` as a const parameter of the kernels.
    pub(super) const Q8_0: u8 = 0;
    pub(super) const Q4_0: u8 = 1;
    pub(super) const Q4_1: u8 = 2;
    pub(super) const Q5_0: u8 = 3;
    pub(super) const Q5_1: u8 = 4;

    const fn format_of(f: u8) -> Format {
        match f {
            Q8_0 => Format::Q8_0,
            Q4_0 => Format::Q4_0,
            Q5_0 => Format::Q5_0,
            Q5_1 => Format::Q5_1,
            _ => Format::Q4_1,
        }
    }

    /// The block's scale (and minimum) and its 32 values as (unsigned operand, how to sign x): for signed formats
    /// `|w|` and `w` (x takes w's sign), for `Q4_1` the nibbles themselves and None.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load_block(format: Format, p: *const u8) -> (f32, f32, __m256i, Option<__m256i>) {
        let d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(p.cast::<u16>().read_unaligned() as i32)));
        let nibbles = |q: *const u8| {
            let raw = _mm_loadu_si128(q.cast());
            let mask = _mm_set1_epi8(0x0f);
            let lo = _mm_and_si128(raw, mask);
            let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
            _mm256_set_m128i(hi, lo)
        };
        match format {
            Format::Q8_0 => {
                let w = _mm256_loadu_si256(p.add(2).cast());
                (d, 0.0, _mm256_sign_epi8(w, w), Some(w))
            }
            Format::Q4_0 => {
                let w = _mm256_sub_epi8(nibbles(p.add(2)), _mm256_set1_epi8(8));
                (d, 0.0, _mm256_sign_epi8(w, w), Some(w))
            }
            Format::Q5_0 => {
                let w = _mm256_or_si256(nibbles(p.add(6)), fifth_bits(p.add(2)));
                let w = _mm256_sub_epi8(w, _mm256_set1_epi8(16));
                (d, 0.0, _mm256_sign_epi8(w, w), Some(w))
            }
            Format::Q5_1 => {
                let m = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(p.add(2).cast::<u16>().read_unaligned() as i32)));
                (d, m, _mm256_or_si256(nibbles(p.add(8)), fifth_bits(p.add(4))), None)
            }
            _ => {
                let m = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(p.add(2).cast::<u16>().read_unaligned() as i32)));
                (d, m, nibbles(p.add(4)), None)
            }
        }
    }

    /// The fifth bits of a `Q5_0` / `Q5_1` block (a little-endian u32 at `p`) as 32 bytes of 16 or 0: byte `i` of
    /// the result is bit `i` moved to bit 4.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn fifth_bits(p: *const u8) -> __m256i {
        let bits = _mm256_set1_epi32(p.cast::<i32>().read_unaligned());
        // Byte i takes byte i / 8 of the word, then every bit but bit i % 8 is set, so the byte is all ones exactly
        // when bit i is.
        let spread = _mm256_shuffle_epi8(
            bits,
            _mm256_setr_epi8(
                0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
            ),
        );
        let others = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe_u64 as i64);
        let set = _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi8(-1));
        _mm256_and_si256(set, _mm256_set1_epi8(16))
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn isum_avx2(a: __m256i, b: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1))
    }

    #[inline]
    #[target_feature(enable = "avx2,avx512vnni,avx512vl")]
    unsafe fn isum_vnni(a: __m256i, b: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b)
    }

    macro_rules! kernel {
        ($name:ident, $features:literal, $isum:ident) => {
            #[target_feature(enable = $features)]
            pub(super) unsafe fn $name<const R: usize, const F: u8>(
                w: &[u8],
                acts: &QuantActs,
                r0: usize,
                out: &mut [f32],
            ) {
                let format = const { format_of(F) };
                let (k, bb) = (acts.k, format.block_bytes());
                let nb = k / BLOCK;
                let (wp, xq, xd, xs) = (w.as_ptr(), acts.q.as_ptr(), acts.d.as_ptr(), acts.s.as_ptr());
                // Two accumulators per row, even and odd blocks, so consecutive FMAs do not wait on each other.
                let mut acc = [[_mm256_setzero_ps(); 2]; R];
                let mut acc_min = [0f32; R];
                for b in 0..nb {
                    let (d, m, a, sign) = load_block(format, wp.add(b * bb));
                    for r in 0..R {
                        let row = r0 + r;
                        let x = _mm256_loadu_si256(xq.add(row * k + b * BLOCK).cast());
                        let x = match sign {
                            Some(s) => _mm256_sign_epi8(x, s),
                            None => x,
                        };
                        let scale = _mm256_set1_ps(d * *xd.add(row * nb + b));
                        acc[r][b & 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps($isum(a, x)), scale, acc[r][b & 1]);
                        if const { format_of(F).has_min() } {
                            acc_min[r] += m * *xs.add(row * nb + b);
                        }
                    }
                }
                for r in 0..R {
                    out[r] = hsum(_mm256_add_ps(acc[r][0], acc[r][1])) + acc_min[r];
                }
            }
        };
    }

    kernel!(avx2, "avx2,fma,f16c", isum_avx2);
    kernel!(vnni, "avx2,fma,f16c,avx512vnni,avx512vl", isum_vnni);
}
