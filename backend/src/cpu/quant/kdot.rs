//! Dot products of one k-quant weight row (`Q4_K`, `Q5_K`, `Q6_K`) with up to `MAX_ROWS` rows of `KQuantActs`.
//! Each super-block is unpacked once (values, sub-block scales) and used for every activation row.
//!
//! Per super-block and row, everything up to the two float factors is integer: `maddubs` of the unsigned values
//! (0..=15, 0..=31, 0..=63) with the int8 activations gives pair sums of at most 2 * 63 * 127 = 16,002 (no i16
//! saturation), `madd` with the sub-block's scale (6-bit, or `Q6_K`'s int8) widens to i32, and the per-16 activation
//! sums times the minimums (or `Q6_K`'s offset of 32 times its scales) go through one more `madd`. AVX-512 VNNI fuses
//! the scale `madd` and its add (`vpdpwssd`). The portable kernel (`kblock::isums`) gives the same integers; the
//! kernels differ only in the order the scaled sums are added in f32.

use super::dot::{Kernel, MAX_ROWS};
use super::kblock::{isums, unpack};
use super::{Format, KQuantActs, SUPER_BLOCK};

/// `out[i] = w_row . x[r0 + i]` for `i < out.len()` (at most `MAX_ROWS`).
pub(super) fn dot_rows(kernel: Kernel, format: Format, w: &[u8], acts: &KQuantActs, r0: usize, out: &mut [f32]) {
    debug_assert!(format.is_k_quant() && out.len() <= MAX_ROWS && r0 + out.len() <= acts.rows());
    debug_assert_eq!(w.len(), acts.k / SUPER_BLOCK * format.block_bytes());
    match kernel {
        Kernel::Scalar => scalar(format, w, acts, r0, out),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Kernel::available` only offers these after detecting the features; the row length was checked
        // against `acts.k` by the caller (`matmul`), and the kernels read within it and within `acts`' rows.
        Kernel::Avx2 | Kernel::Avx512Vnni | Kernel::Avx512Rows16 => unsafe {
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
                (Kernel::Avx2, Format::Q4_K) => rows!(avx2, x86::Q4_K),
                (Kernel::Avx2, Format::Q5_K) => rows!(avx2, x86::Q5_K),
                (Kernel::Avx2, _) => rows!(avx2, x86::Q6_K),
                (_, Format::Q4_K) => rows!(vnni, x86::Q4_K),
                (_, Format::Q5_K) => rows!(vnni, x86::Q5_K),
                (_, _) => rows!(vnni, x86::Q6_K),
            }
        },
        #[cfg(not(target_arch = "x86_64"))]
        _ => scalar(format, w, acts, r0, out),
    }
}

fn scalar(format: Format, w: &[u8], acts: &KQuantActs, r0: usize, out: &mut [f32]) {
    let k = acts.k;
    let nb = k / SUPER_BLOCK;
    out.fill(0.0);
    for (b, blk) in w.chunks_exact(format.block_bytes()).enumerate() {
        let u = unpack(format, blk);
        for (i, o) in out.iter_mut().enumerate() {
            let r = r0 + i;
            let x = &acts.q[r * k + b * SUPER_BLOCK..];
            let (isum, msum) = isums(&u, x, &acts.bsums[(r * nb + b) * 16..]);
            let dx = acts.d[r * nb + b];
            *o += u.d * dx * isum as f32 - u.dmin * dx * msum as f32;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::super::{KQuantActs, SUPER_BLOCK};

    /// The format as a const parameter of the kernels.
    pub(super) const Q4_K: u8 = 0;
    pub(super) const Q5_K: u8 = 1;
    pub(super) const Q6_K: u8 = 2;

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn f16_at(p: *const u8) -> f32 {
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(p.cast::<u16>().read_unaligned() as i32)))
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
    }

    /// `acc + madd(p, scale)`: pairs of i16 products times the sub-block scale, summed into i32 lanes.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn scale_add_avx2(acc: __m256i, p: __m256i, scale: __m256i) -> __m256i {
        _mm256_add_epi32(acc, _mm256_madd_epi16(p, scale))
    }

    #[inline]
    #[target_feature(enable = "avx2,avx512vnni,avx512vl")]
    unsafe fn scale_add_vnni(acc: __m256i, p: __m256i, scale: __m256i) -> __m256i {
        _mm256_dpwssd_epi32(acc, p, scale)
    }

    /// One super-block's weight side: 8 vectors of 32 unsigned values, the i16 scale of each vector's values (per
    /// lane of `maddubs`' output), the per-16 factor for the activation sums (minimums, or `Q6_K`'s scales), and
    /// `d`, `dmin`.
    struct Block {
        q: [__m256i; 8],
        scale: [__m256i; 8],
        sums: __m256i,
        d: f32,
        dmin: f32,
    }

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn load_block<const F: u8>(p: *const u8) -> Block {
        let low = _mm256_set1_epi8(0x0f);
        let mut q = [_mm256_setzero_si256(); 8];
        let mut scale = [_mm256_setzero_si256(); 8];
        if F == Q6_K {
            let sc = std::slice::from_raw_parts(p.add(192).cast::<i8>(), 16);
            let three = _mm256_set1_epi8(3);
            for h in 0..2 {
                let a = _mm256_loadu_si256(p.add(64 * h).cast());
                let b = _mm256_loadu_si256(p.add(64 * h + 32).cast());
                let hb = _mm256_loadu_si256(p.add(128 + 32 * h).cast());
                // Bits 2t, 2t + 1 of each high byte, moved to bits 4 and 5 (16-bit shifts: the mask drops what
                // crosses from the neighbouring byte).
                let top = |t: i32| {
                    let v = match t {
                        0 => hb,
                        1 => _mm256_srli_epi16(hb, 2),
                        2 => _mm256_srli_epi16(hb, 4),
                        _ => _mm256_srli_epi16(hb, 6),
                    };
                    _mm256_slli_epi16(_mm256_and_si256(v, three), 4)
                };
                q[4 * h] = _mm256_or_si256(_mm256_and_si256(a, low), top(0));
                q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(b, low), top(1));
                q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), low), top(2));
                q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b, 4), low), top(3));
            }
            for (v, s) in scale.iter_mut().zip(sc.chunks_exact(2)) {
                *v = _mm256_set_m128i(_mm_set1_epi16(s[1] as i16), _mm_set1_epi16(s[0] as i16));
            }
            // The offset of 32 as `32 * scale[s]` against the per-16 sums.
            let sums = _mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(192).cast())), 5);
            return Block { q, scale, sums, d: f16_at(p.add(208)), dmin: 0.0 };
        }
        let (scales, mins) = scales_mins(p.add(4));
        for (s, v) in scale.iter_mut().enumerate() {
            *v = _mm256_set1_epi16(((scales >> (8 * s)) & 0xff) as i16);
        }
        let qs = p.add(if F == Q5_K { 48 } else { 16 });
        let mut qh = if F == Q5_K { _mm256_loadu_si256(p.add(16).cast()) } else { _mm256_setzero_si256() };
        let (one, two) = (_mm256_set1_epi8(1), _mm256_set1_epi8(2));
        for j in 0..4 {
            let raw = _mm256_loadu_si256(qs.add(32 * j).cast());
            q[2 * j] = _mm256_and_si256(raw, low);
            q[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
            if F == Q5_K {
                // Bits 2j and 2j + 1 of each high byte (moved to bits 0 and 1 by the shifts so far) to bit 4. Bits the
                // 16-bit shifts carry in from the neighbouring byte enter at bit 6 and reach bit 2 at most after three
                // shifts, so the masks never see them.
                q[2 * j] = _mm256_or_si256(q[2 * j], _mm256_slli_epi16(_mm256_and_si256(qh, one), 4));
                q[2 * j + 1] = _mm256_or_si256(q[2 * j + 1], _mm256_slli_epi16(_mm256_and_si256(qh, two), 3));
                qh = _mm256_srli_epi16(qh, 2);
            }
        }
        // Each minimum twice, one per 16-value activation sum of its sub-block.
        let m = _mm_cvtsi64_si128(mins as i64);
        let sums = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m, m));
        Block { q, scale, sums, d: f16_at(p), dmin: f16_at(p.add(2)) }
    }

    /// The 8 scales and 8 minimums of a `Q4_K` / `Q5_K` block's 12 scale bytes at `sc` (`kblock::scale_min`'s
    /// layout), one per byte, with four 32-bit operations per half instead of a branch per sub-block.
    #[inline(always)]
    unsafe fn scales_mins(sc: *const u8) -> (u64, u64) {
        let word = |i: usize| sc.add(4 * i).cast::<u32>().read_unaligned();
        let (a, b, c) = (word(0), word(1), word(2));
        let (low6, nib, top2) = (0x3f3f_3f3fu32, 0x0f0f_0f0fu32, 0x0303_0303u32);
        let scales_hi = (c & nib) | (((a >> 6) & top2) << 4);
        let mins_hi = ((c >> 4) & nib) | (((b >> 6) & top2) << 4);
        (((scales_hi as u64) << 32) | (a & low6) as u64, ((mins_hi as u64) << 32) | (b & low6) as u64)
    }

    macro_rules! kernel {
        ($name:ident, $features:literal, $scale_add:ident) => {
            #[target_feature(enable = $features)]
            pub(super) unsafe fn $name<const R: usize, const F: u8>(
                w: &[u8],
                acts: &KQuantActs,
                r0: usize,
                out: &mut [f32],
            ) {
                let k = acts.k;
                let nb = k / SUPER_BLOCK;
                let bb = [144, 176, 210][F as usize];
                let (wp, xq, xd, xs) = (w.as_ptr(), acts.q.as_ptr(), acts.d.as_ptr(), acts.bsums.as_ptr());
                let mut acc = [_mm256_setzero_ps(); R];
                let mut acc_min = [_mm256_setzero_ps(); R];
                for b in 0..nb {
                    let blk = load_block::<F>(wp.add(b * bb));
                    for r in 0..R {
                        let row = r0 + r;
                        let x = xq.add(row * k + b * SUPER_BLOCK);
                        let mut sumi = _mm256_setzero_si256();
                        for s in 0..8 {
                            let xv = _mm256_loadu_si256(x.add(32 * s).cast());
                            sumi = $scale_add(sumi, _mm256_maddubs_epi16(blk.q[s], xv), blk.scale[s]);
                        }
                        let bs = _mm256_loadu_si256(xs.add((row * nb + b) * 16).cast());
                        let sums = _mm256_madd_epi16(bs, blk.sums);
                        let dx = *xd.add(row * nb + b);
                        if F == Q6_K {
                            let sumi = _mm256_sub_epi32(sumi, sums);
                            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(blk.d * dx), acc[r]);
                        } else {
                            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(blk.d * dx), acc[r]);
                            let m = _mm256_set1_ps(blk.dmin * dx);
                            acc_min[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), m, acc_min[r]);
                        }
                    }
                }
                for r in 0..R {
                    out[r] = hsum(acc[r]) - hsum(acc_min[r]);
                }
            }
        };
    }

    kernel!(avx2, "avx2,fma,f16c", scale_add_avx2);
    kernel!(vnni, "avx2,fma,f16c,avx512vnni,avx512vl", scale_add_vnni);
}
