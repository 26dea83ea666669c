//! CPU paged attention: causal attention of each query row over its sequence's cached keys (the cached prefix plus
//! the current chunk, which `Op::RopeWriteKv` stored), grouped-query aware, with an optional sliding window and
//! score soft-capping, and attention sinks (gpt-oss). The cache holds f32, bf16 or f16 values (`KvElem`); 16-bit
//! keys and values are widened to f32 as they load, and scores and sums stay f32.

use half::{bf16, f16};
use rayon::prelude::*;

use super::be;
use crate::error::Result;
use crate::AttnShape as Shape;

/// An element type of the KV cache: stored from f32 (rounded to nearest even), read back as f32.
pub(super) trait KvElem: Copy + Send + Sync + 'static {
    fn from_f32(v: f32) -> Self;
    fn to_f32(self) -> f32;
}

impl KvElem for f32 {
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

impl KvElem for bf16 {
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        // bf16 is the top half of an f32: a shift, which vectorises.
        f32::from_bits((self.to_bits() as u32) << 16)
    }
}

impl KvElem for f16 {
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16_bits_to_f32(self.to_bits())
    }
}

/// An f16's value, exactly, in integer and f32 operations that vectorise (`half`'s conversion is a call per value
/// that checks the CPU for F16C each time: a float16 KV cache took twice the decode step of an f32 one). The 15 bits
/// of exponent and mantissa shifted into an f32's place read as the value times 2^-112, normal or subnormal alike,
/// so one multiply by 2^112 re-biases it; infinities and NaNs (exponent 31) keep an all-ones exponent instead.
#[inline(always)]
fn f16_bits_to_f32(h: u16) -> f32 {
    let h = h as u32;
    let sign = (h & 0x8000) << 16;
    let rest = h & 0x7fff;
    let finite = f32::from_bits(rest << 13) * f32::from_bits(0x7780_0000);
    let bits = if rest >= 0x7c00 { 0x7f80_0000 | ((rest & 0x3ff) << 13) } else { finite.to_bits() };
    f32::from_bits(bits | sign)
}

/// Per-head sink logits (gpt-oss): each joins its head's softmax as a key with no value.
pub(super) type Sinks<'a> = Option<&'a [f32]>;

#[allow(clippy::too_many_arguments)]
pub(super) fn paged_attention<T: KvElem>(
    q: &[f32],
    k_cache: &[T],
    v_cache: &[T],
    out: &mut [f32],
    s: &Shape,
    sinks: Sinks<'_>,
    query_start: &[u32],
    context_lens: &[u32],
    block_tables: &[u32],
    max_blocks: usize,
) -> Result<()> {
    let num_seqs = context_lens.len();
    if s.num_kv_heads == 0 || !s.num_heads.is_multiple_of(s.num_kv_heads) {
        return Err(be("paged_attention: heads must be a multiple of kv heads"));
    }
    let group = s.num_heads / s.num_kv_heads;
    let hd = s.head_dim;
    let num_rows = query_start[num_seqs] as usize;
    if q.len() < num_rows * s.num_heads * hd || out.len() < num_rows * s.num_heads * hd {
        return Err(be("paged_attention: q/out too small"));
    }
    if sinks.is_some_and(|v| v.len() < s.num_heads) {
        return Err(be(format!("paged_attention: fewer sinks than the {} heads", s.num_heads)));
    }
    // Per query row: (sequence, position). `AttentionMeta::new` checked that queries fit their contexts and contexts
    // their tables, and the caller that the tables stay inside the cache.
    let mut row_info = Vec::with_capacity(num_rows);
    for seq in 0..num_seqs {
        let (qs, qe) = (query_start[seq] as usize, query_start[seq + 1] as usize);
        let ctx = context_lens[seq] as usize;
        row_info.extend((0..qe - qs).map(|t| (seq, ctx - (qe - qs) + t)));
    }
    let table = |seq: usize| &block_tables[seq * max_blocks..(seq + 1) * max_blocks];
    let simd = Simd::detect();
    out[..num_rows * s.num_heads * hd].par_chunks_mut(hd).enumerate().for_each(|(i, o)| {
        let (row, h) = (i / s.num_heads, i % s.num_heads);
        let (seq, pos) = row_info[row];
        let lo = s.window.map_or(0, |w| (pos + 1).saturating_sub(w));
        let head = Head {
            q: &q[i * hd..(i + 1) * hd],
            table: table(seq),
            kv_at: (h / group) * hd,
            positions: lo..pos + 1,
            sink: sinks.map_or(f32::NEG_INFINITY, |v| v[h]),
        };
        match simd {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Simd::detect` found the features.
            Simd::Avx512 => unsafe { head_avx512(s, &head, k_cache, v_cache, o) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            Simd::Avx2 => unsafe { head_avx2(s, &head, k_cache, v_cache, o) },
            Simd::Portable => head_attention(s, &head, k_cache, v_cache, o),
        }
    });
    Ok(())
}

/// The instruction sets the per-head loop is compiled for: the crate's baseline is x86-64's SSE2, whose 4-wide
/// loads and multiplies left the score dots and the value sums at a quarter of what a 16-wide register does.
#[derive(Clone, Copy)]
enum Simd {
    #[cfg(target_arch = "x86_64")]
    Avx512,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    Portable,
}

impl Simd {
    fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx512f") && has!("avx512bw") && has!("fma") {
                return Simd::Avx512;
            }
            if has!("avx2") && has!("fma") {
                return Simd::Avx2;
            }
        }
        Simd::Portable
    }
}

/// One (query row, head): its query, its sequence's block table, where its kv head starts in a cached row, the
/// cached positions it sees and its sink.
struct Head<'a> {
    q: &'a [f32],
    table: &'a [u32],
    kv_at: usize,
    positions: std::ops::Range<usize>,
    sink: f32,
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
unsafe fn head_avx512<T: KvElem>(s: &Shape, h: &Head<'_>, k_cache: &[T], v_cache: &[T], o: &mut [f32]) {
    head_attention(s, h, k_cache, v_cache, o)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn head_avx2<T: KvElem>(s: &Shape, h: &Head<'_>, k_cache: &[T], v_cache: &[T], o: &mut [f32]) {
    head_attention(s, h, k_cache, v_cache, o)
}

/// `o` = softmax(q . k / scale) . v over the head's positions (inlined into each instruction set's entry point).
#[inline(always)]
fn head_attention<T: KvElem>(s: &Shape, h: &Head<'_>, k_cache: &[T], v_cache: &[T], o: &mut [f32]) {
    let hd = s.head_dim;
    let kv_row = s.num_kv_heads * hd;
    let lo = h.positions.start;
    // Where each position's key and value start, walked block by block: a division per position (the block size
    // is only known at run time) cost more than the dot product beside it.
    let (mut blk, mut off) = (lo / s.block_size, lo % s.block_size);
    let slots: Vec<usize> = h
        .positions
        .clone()
        .map(|_| {
            let at = (h.table[blk] as usize * s.block_size + off) * kv_row + h.kv_at;
            off += 1;
            if off == s.block_size {
                (blk, off) = (blk + 1, 0);
            }
            at
        })
        .collect();
    let mut scores: Vec<f32> = slots
        .iter()
        .map(|&at| {
            let sc = dot(h.q, &k_cache[at..at + hd]) * s.scale;
            s.softcap.map_or(sc, |c| c * (sc / c).tanh())
        })
        .collect();
    let max = scores.iter().cloned().fold(h.sink, f32::max);
    let mut sum = (h.sink - max).exp();
    for v in scores.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    o.iter_mut().for_each(|v| *v = 0.0);
    for (&at, p) in slots.iter().zip(&scores) {
        let v = &v_cache[at..at + hd];
        let p = p / sum;
        o.iter_mut().zip(v).for_each(|(o, v)| *o += p * v.to_f32());
    }
}

/// `q . k` with the key widened to f32, in eight independent partial sums: a single running sum is a chain of
/// dependent adds the compiler may not reorder (f32 addition is not associative), so it neither vectorises nor
/// overlaps; eight lanes become one SIMD register's worth of sums.
#[inline(always)]
fn dot<T: KvElem>(q: &[f32], k: &[T]) -> f32 {
    const LANES: usize = 8;
    let mut acc = [0f32; LANES];
    let (qc, kc) = (q.chunks_exact(LANES), k.chunks_exact(LANES));
    let (qr, kr) = (qc.remainder(), kc.remainder());
    for (qs, ks) in qc.zip(kc) {
        for l in 0..LANES {
            acc[l] += qs[l] * ks[l].to_f32();
        }
    }
    let tail: f32 = qr.iter().zip(kr).map(|(a, b)| a * b.to_f32()).sum();
    acc.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_widening_equals_half_for_every_value() {
        for bits in 0..=u16::MAX {
            let (got, want) = (f16::from_bits(bits).to_f32_const(), f16_bits_to_f32(bits));
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{bits:#06x}: {want} vs half's {got}"
            );
        }
    }
}
