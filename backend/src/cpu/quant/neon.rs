//! The block dot product of the 32-value formats (`Q8_0`, `Q4_0`, `Q4_1`, `Q5_0`, `Q5_1`) on aarch64 with the
//! dot-product extension (Armv8.2 `dotprod`, `SDOT`), `Kernel::NeonDot`: a block's 32 values as two vectors of
//! signed bytes, two `SDOT`s against the activation block's bytes, one horizontal add, then the scales in f32 as the
//! scalar kernel applies them. `SDOT` multiplies signed by signed bytes, so the signed formats need no shift (x86's
//! `vpdpbusd` needs one operand unsigned). The k-quants take the portable kernel on aarch64.
//!
//! `SDOT` goes through `asm!`: its intrinsic (`vdotq_s32`) is not stable Rust (rust-lang/rust#117224).
//! Tested under emulation: `scripts/test-aarch64.sh` cross-compiles the quant tests and runs them in `qemu-aarch64`.

use std::arch::aarch64::*;
use std::arch::asm;

use super::{f16_at, Format, QuantActs, BLOCK};

/// `acc + (four-way dot products of a and b, per 32-bit lane)`.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn sdot(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    asm!(
        "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
        acc = inout(vreg) acc,
        a = in(vreg) a,
        b = in(vreg) b,
        options(pure, nomem, nostack)
    );
    acc
}

/// Block `blk`'s scale, minimum (0 for the signed formats) and values `0 .. 16` and `16 .. 32` as signed bytes:
/// `w = d q + m`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn load_block(format: Format, blk: &[u8]) -> (f32, f32, int8x16_t, int8x16_t) {
    let d = f16_at(blk, 0);
    // A GGUF 4-bit block keeps value i in the low nibble of byte i and value i + 16 in its high nibble.
    let nibbles = |q: &[u8]| {
        let raw = vld1q_u8(q.as_ptr());
        (vreinterpretq_s8_u8(vandq_u8(raw, vdupq_n_u8(0x0f))), vreinterpretq_s8_u8(vshrq_n_u8::<4>(raw)))
    };
    match format {
        Format::Q8_0 => (d, 0.0, vld1q_s8(blk[2..].as_ptr().cast()), vld1q_s8(blk[18..].as_ptr().cast())),
        Format::Q4_0 => {
            let (lo, hi) = nibbles(&blk[2..18]);
            (d, 0.0, vsubq_s8(lo, vdupq_n_s8(8)), vsubq_s8(hi, vdupq_n_s8(8)))
        }
        Format::Q4_1 => {
            let (lo, hi) = nibbles(&blk[4..20]);
            (d, f16_at(blk, 2), lo, hi)
        }
        // Q5_0 / Q5_1: the fifth bits are spread by the portable unpacking (values below 32: signed bytes).
        _ => {
            let u = format.unsigned_values(blk);
            let z = vdupq_n_s8(format.shift() as i8);
            let m = if format.has_min() { f16_at(blk, 2) } else { 0.0 };
            let (w0, w1) = (vld1q_s8(u.as_ptr().cast()), vld1q_s8(u[16..].as_ptr().cast()));
            (d, m, vsubq_s8(w0, z), vsubq_s8(w1, z))
        }
    }
}

/// `out[i] = w_row . x[r0 + i]` for `i < out.len()`, each weight block unpacked once for every row.
///
/// # Safety
/// The CPU has NEON and `dotprod` (`Kernel::NeonDot` is only offered then); `w` is whole blocks of `format` covering
/// `acts.k` values and `acts` has at least `r0 + out.len()` rows.
#[target_feature(enable = "neon,dotprod")]
pub(super) unsafe fn dot_rows(format: Format, w: &[u8], acts: &QuantActs, r0: usize, out: &mut [f32]) {
    let (k, bb) = (acts.k, format.block_bytes());
    let nb = k / BLOCK;
    out.iter_mut().for_each(|o| *o = 0.0);
    for (b, blk) in w.chunks_exact(bb).enumerate() {
        let (d, m, w0, w1) = load_block(format, blk);
        for (i, o) in out.iter_mut().enumerate() {
            let r = r0 + i;
            let x = &acts.q[r * k + b * BLOCK..][..BLOCK];
            let acc = sdot(vdupq_n_s32(0), w0, vld1q_s8(x.as_ptr()));
            let acc = sdot(acc, w1, vld1q_s8(x[16..].as_ptr()));
            *o += d * acts.d[r * nb + b] * vaddvq_s32(acc) as f32;
            if format.has_min() {
                *o += m * acts.s[r * nb + b];
            }
        }
    }
}
