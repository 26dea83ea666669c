//! The k-quant super-blocks as GGUF stores them (256 values each), unpacked to one shape for decoding and for the
//! portable dot product: value `i` is `d * scale[i / 16] * (q[i] - offset) - dmin * min[i / 16]` with `q` unsigned.
//!
//! - `Q4_K` (144 bytes): f16 `d`, f16 `dmin`, 12 bytes of 6-bit scales and minimums for 8 sub-blocks of 32, then 128
//!   bytes of nibbles: 64 values per 32 bytes, low nibbles first (sub-block `2j`), then high (`2j + 1`).
//! - `Q5_K` (176 bytes): as `Q4_K`, with 32 bytes of fifth bits after the scales (byte `l`, bit `s`: value `l` of
//!   sub-block `s`) before the nibbles.
//! - `Q6_K` (210 bytes): 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16 int8 scales (sub-blocks of 16),
//!   f16 `d` last; values are `q - 32`. Each 128-value half takes 64 low bytes, 32 high bytes and 8 scales: low
//!   nibbles of bytes 0..32 and 32..64 are values 0..32 and 32..64, high nibbles values 64..96 and 96..128, and
//!   bits `2t, 2t + 1` of high byte `l` top value `32 t + l`.

use super::{f16_at, Format, SUPER_BLOCK};

/// Sub-blocks of 16 values in a super-block (the granularity every k-quant's scales fit).
pub(super) const SUBS: usize = SUPER_BLOCK / 16;

/// A super-block unpacked: unsigned values, per-16 scales and minimums, and the float factors.
pub(super) struct Unpacked {
    pub q: [u8; SUPER_BLOCK],
    pub scale: [i32; SUBS],
    pub min: [i32; SUBS],
    /// Subtracted from every `q` (32 for `Q6_K`, else 0).
    pub offset: i32,
    pub d: f32,
    pub dmin: f32,
}

/// The 6-bit scale and minimum of sub-block `j` (of 8) from a `Q4_K` / `Q5_K` block's 12 scale bytes: sub-blocks
/// 0-3 keep theirs in the low 6 bits of bytes `j` and `j + 4`; 4-7 take a nibble of byte `j + 4` and the top two
/// bits of bytes `j - 4` (scale) and `j` (minimum).
#[inline]
pub(super) fn scale_min(sc: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (sc[j] & 63, sc[j + 4] & 63)
    } else {
        ((sc[j + 4] & 0x0f) | ((sc[j - 4] >> 6) << 4), (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4))
    }
}

/// Unpacks one super-block of `format` (a k-quant).
pub(super) fn unpack(format: Format, blk: &[u8]) -> Unpacked {
    let mut u = Unpacked { q: [0; SUPER_BLOCK], scale: [0; SUBS], min: [0; SUBS], offset: 0, d: 0.0, dmin: 0.0 };
    match format {
        Format::Q4_K | Format::Q5_K => {
            u.d = f16_at(blk, 0);
            u.dmin = f16_at(blk, 2);
            let sc = &blk[4..16];
            for s in 0..8 {
                let (a, m) = scale_min(sc, s);
                u.scale[2 * s..2 * s + 2].fill(a as i32);
                u.min[2 * s..2 * s + 2].fill(m as i32);
            }
            let (qh, qs) =
                if format == Format::Q5_K { (Some(&blk[16..48]), &blk[48..176]) } else { (None, &blk[16..144]) };
            for j in 0..4 {
                for l in 0..32 {
                    let b = qs[32 * j + l];
                    let (hi_lo, hi_hi) = match qh {
                        Some(h) => (((h[l] >> (2 * j)) & 1) << 4, ((h[l] >> (2 * j + 1)) & 1) << 4),
                        None => (0, 0),
                    };
                    u.q[64 * j + l] = (b & 0x0f) | hi_lo;
                    u.q[64 * j + 32 + l] = (b >> 4) | hi_hi;
                }
            }
        }
        Format::Q6_K => {
            u.d = f16_at(blk, 208);
            u.offset = 32;
            for (s, &c) in blk[192..208].iter().enumerate() {
                u.scale[s] = c as i8 as i32;
            }
            for h in 0..2 {
                let (ql, qh) = (&blk[64 * h..64 * h + 64], &blk[128 + 32 * h..128 + 32 * h + 32]);
                let q = &mut u.q[128 * h..128 * h + 128];
                for l in 0..32 {
                    let hb = qh[l];
                    q[l] = (ql[l] & 0x0f) | ((hb & 3) << 4);
                    q[32 + l] = (ql[32 + l] & 0x0f) | (((hb >> 2) & 3) << 4);
                    q[64 + l] = (ql[l] >> 4) | (((hb >> 4) & 3) << 4);
                    q[96 + l] = (ql[32 + l] >> 4) | (((hb >> 6) & 3) << 4);
                }
            }
        }
        _ => unreachable!("kblock::unpack takes the k-quants only"),
    }
    u
}

/// One super-block's 256 values as f32, in the operation order of candle's (llama.cpp's) dequantization, so the
/// values are bit for bit the loader's.
pub(super) fn decode(format: Format, blk: &[u8], out: &mut [f32]) {
    let u = unpack(format, blk);
    for (s, o) in out[..SUPER_BLOCK].chunks_exact_mut(16).enumerate() {
        let d1 = u.d * u.scale[s] as f32;
        let m1 = u.dmin * u.min[s] as f32;
        for (o, &q) in o.iter_mut().zip(&u.q[16 * s..]) {
            *o = if u.offset == 0 { d1 * q as f32 - m1 } else { d1 * (q as i32 - u.offset) as f32 };
        }
    }
}

/// The exact integer sums of one super-block against 256 int8 activations `x` with per-16 sums `bsums`:
/// `(sum scale[s] (q - offset) . x_s, sum min[s] bsums[s])`, so the block's dot product is
/// `d dx isum - dmin dx msum`.
#[inline]
pub(super) fn isums(u: &Unpacked, x: &[i8], bsums: &[i16]) -> (i32, i32) {
    let (mut isum, mut msum) = (0i32, 0i32);
    for s in 0..SUBS {
        let dot: i32 =
            u.q[16 * s..16 * s + 16].iter().zip(&x[16 * s..16 * s + 16]).map(|(&q, &x)| q as i32 * x as i32).sum();
        isum += u.scale[s] * (dot - u.offset * bsums[s] as i32);
        msum += u.min[s] * bsums[s] as i32;
    }
    (isum, msum)
}
