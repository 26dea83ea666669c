//! The sampler every backend implements (`Op::SampleRows`; this file is the CPU's, `sampling.cl` the devices'):
//! temperature, top-k, top-p and min-p without sorting the vocabulary.
//!
//! The draw is rejection sampling over shrinking candidate sets (the design of FlashInfer's sampling kernels):
//! weights `w = exp((l - max) / T)`; min-p removes tokens with `w < min_p` up front; each round draws a token `s` in
//! proportion to `w` among the candidates (index order, one uniform number of the row's Philox stream), and accepts
//! it when fewer than `top_k` tokens are more likely than `s` and their mass is below `top_p` of the whole
//! distribution; otherwise `s` and every token no more likely than it leave the candidates. Proposals are always in
//! proportion to `w` over a superset of the kept tokens, so the accepted token follows the target distribution
//! exactly; the most likely token is always accepted, so rounds end.
//!
//! top-k and top-p apply jointly to the model's distribution (vLLM's FlashInfer path; its PyTorch path applies top-p
//! after renormalising over the top-k set, which differs only when both are set); tokens tied with the last kept one
//! are kept. Each pass is a straight loop over the row that the compiler vectorises.

use rserve_kernels::launch::SAMPLE_MAX_ROUNDS;

use super::params::RowParams;
use super::philox;

/// Lanes of the passes below: independent accumulators, so a float sum (which may not be reordered) still runs
/// as vector adds.
const LANES: usize = 16;

/// `sum(f(x))` over `xs` in `LANES` interleaved partial sums.
#[inline(always)]
fn lane_sum(xs: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0.0f32; LANES];
    let chunks = xs.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a += f(x);
        }
    }
    acc.iter().sum::<f32>() + rest.iter().map(|&x| f(x)).sum::<f32>()
}

/// The greedy token: the lowest index among equal maxima (`argmax_rows` and `sample_rows` follow the same rule);
/// NaN never wins; a row without a number above -inf gives 0.
#[inline(always)]
pub fn argmax(l: &[f32]) -> u32 {
    // Lane j sees indices j, j + LANES, ... in ascending order, so strict `>` keeps each lane's lowest index of its
    // maximum; the lanes are then merged by (value, lowest index).
    let mut top = [f32::NEG_INFINITY; LANES];
    let mut at = [u32::MAX; LANES];
    let chunks = l.chunks_exact(LANES);
    let rest = chunks.remainder();
    for (c, chunk) in chunks.enumerate() {
        for j in 0..LANES {
            let v = chunk[j];
            let better = v > top[j];
            top[j] = if better { v } else { top[j] };
            at[j] = if better { (c * LANES + j) as u32 } else { at[j] };
        }
    }
    let (mut best, mut best_v) = (u32::MAX, f32::NEG_INFINITY);
    for j in 0..LANES {
        if top[j] > best_v || (top[j] == best_v && at[j] < best) {
            (best, best_v) = (at[j], top[j]);
        }
    }
    let base = l.len() - rest.len();
    for (i, &v) in rest.iter().enumerate() {
        if v > best_v {
            (best, best_v) = ((base + i) as u32, v);
        }
    }
    if best == u32::MAX {
        0
    } else {
        best
    }
}

/// `exp(x)` for `x <= 0` without a branch (so loops over it vectorise), relative error about 2e-7; below -87 (and
/// for NaN) it is 0, so masked (-inf) tokens weigh nothing.
#[inline(always)]
pub fn exp_nonpositive(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23: adding and subtracting it rounds to an integer
    let keep = x >= -87.0;
    let xc = if keep { x } else { 0.0 };
    let t = xc * LOG2E + ROUND;
    // t's low mantissa bits hold round(xc * log2(e)) as an integer: no float-to-int conversion in the loop.
    let ni = t.to_bits().wrapping_sub(ROUND.to_bits()) as i32;
    let n = t - ROUND;
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    let p = 1.0 / 720.0;
    let p = p * r + 1.0 / 120.0;
    let p = p * r + 1.0 / 24.0;
    let p = p * r + 1.0 / 6.0;
    let p = p * r + 0.5;
    let p = p * r + 1.0;
    let p = p * r + 1.0;
    let scale = f32::from_bits((ni.wrapping_add(127) as u32) << 23);
    if keep {
        p * scale
    } else {
        0.0
    }
}

/// The token row `l` draws under `p`. `w` is scratch (resized to the row). The passes are compiled for AVX-512 and
/// AVX2 too and chosen at run time (the portable build targets baseline x86-64).
pub fn sample_row(l: &[f32], p: &RowParams, w: &mut Vec<f32>) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx512f") {
            // SAFETY: the CPU has the features the function is compiled for (checked above).
            return unsafe { sample_row_avx512(l, p, w) };
        }
        if has!("avx2") && has!("fma") {
            // SAFETY: as above.
            return unsafe { sample_row_avx2(l, p, w) };
        }
    }
    sample_row_portable(l, p, w)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn sample_row_avx512(l: &[f32], p: &RowParams, w: &mut Vec<f32>) -> u32 {
    sample_row_portable(l, p, w)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn sample_row_avx2(l: &[f32], p: &RowParams, w: &mut Vec<f32>) -> u32 {
    sample_row_portable(l, p, w)
}

#[inline(always)]
fn sample_row_portable(l: &[f32], p: &RowParams, w: &mut Vec<f32>) -> u32 {
    if p.is_greedy() || l.is_empty() {
        return argmax(l);
    }
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = l.chunks_exact(LANES);
    for v in chunks.remainder() {
        lanes[0] = if v.is_finite() { lanes[0].max(*v) } else { lanes[0] };
    }
    for c in chunks {
        for (m, &v) in lanes.iter_mut().zip(c) {
            *m = if v.is_finite() && v > *m { v } else { *m };
        }
    }
    let max = lanes.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return argmax(l);
    }
    let inv_t = 1.0 / p.temperature;
    w.resize(l.len(), 0.0);
    for (o, &v) in w.iter_mut().zip(l) {
        // Non-finite logits weigh 0 (exp_nonpositive of -inf or NaN is 0; +inf is excluded here).
        let z = if v.is_finite() { (v - max) * inv_t } else { f32::NEG_INFINITY };
        *o = exp_nonpositive(z);
    }
    // top-p is measured against the whole distribution, before min-p takes tokens out.
    let total = lane_sum(w, |v| v);
    if p.min_p > 0.0 {
        // The most likely token weighs 1.
        let floor = p.min_p;
        w.iter_mut().for_each(|v| *v = if *v >= floor { *v } else { 0.0 });
    }
    let top_k = if p.top_k == 0 || p.top_k as usize >= l.len() { usize::MAX } else { p.top_k as usize };
    let mass_limit = if p.top_p < 1.0 { p.top_p * total } else { f32::INFINITY };
    let mut pivot = 0.0f32;
    for round in 0..SAMPLE_MAX_ROUNDS as u32 {
        let u = philox::uniform(p.seed, p.position, round);
        let Some(s) = draw_above(w, pivot, u) else { break };
        let ws = w[s];
        if top_k == usize::MAX && mass_limit == f32::INFINITY {
            return s as u32;
        }
        let (count, mass) = above(w, ws);
        if count < top_k && mass < mass_limit {
            return s as u32;
        }
        pivot = ws;
    }
    argmax(l)
}

/// The first index whose running sum of the weights above `pivot` (in index order) passes `u` times their total;
/// None when no weight is above `pivot`.
#[inline(always)]
fn draw_above(w: &[f32], pivot: f32, u: f32) -> Option<usize> {
    const BLOCK: usize = 1024;
    let masked = |v: f32| if v > pivot { v } else { 0.0 };
    let mut sums = [0.0f32; 256];
    let blocks = w.len().div_ceil(BLOCK);
    let mut sums_vec;
    let sums: &mut [f32] = if blocks <= sums.len() {
        &mut sums[..blocks]
    } else {
        sums_vec = vec![0.0f32; blocks];
        &mut sums_vec
    };
    for (s, c) in sums.iter_mut().zip(w.chunks(BLOCK)) {
        *s = lane_sum(c, masked);
    }
    let total: f32 = sums.iter().sum();
    if total <= 0.0 {
        return None;
    }
    let target = u * total;
    let mut acc = 0.0f32;
    let mut last = None;
    for (b, &s) in sums.iter().enumerate() {
        if s <= 0.0 {
            continue;
        }
        let block = &w[b * BLOCK..((b + 1) * BLOCK).min(w.len())];
        if acc + s > target {
            for (i, &v) in block.iter().enumerate() {
                let v = masked(v);
                if v > 0.0 {
                    acc += v;
                    last = Some(b * BLOCK + i);
                    if acc > target {
                        return last;
                    }
                }
            }
            // Rounding: the block's elements summed one by one fell short of its sum; its last candidate it is.
            return last;
        }
        acc += s;
        last = block.iter().rposition(|&v| v > pivot).map(|i| b * BLOCK + i).or(last);
    }
    last
}

/// How many weights are above `ws`, and their sum.
#[inline(always)]
fn above(w: &[f32], ws: f32) -> (usize, f32) {
    let count = lane_sum(w, |v| if v > ws { 1.0 } else { 0.0 });
    let mass = lane_sum(w, |v| if v > ws { v } else { 0.0 });
    (count as usize, mass)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_exp_matches_std() {
        for i in 0..19_700 {
            let x = -(i as f32) * 0.0044;
            let (a, b) = (exp_nonpositive(x), x.exp());
            assert!((a - b).abs() <= 3e-7 * b + 1e-38, "{x}: {a} vs {b}");
        }
        assert_eq!(exp_nonpositive(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_nonpositive(f32::NAN), 0.0);
        assert_eq!(exp_nonpositive(0.0), 1.0);
    }

    fn params(t: f32) -> RowParams {
        RowParams { temperature: t, ..RowParams::GREEDY }
    }

    #[test]
    fn greedy_and_top_k_one_take_the_lowest_index_of_the_maximum() {
        let mut w = Vec::new();
        let l = [1.0, 3.0, 3.0, -1.0];
        assert_eq!(sample_row(&l, &params(0.0), &mut w), 1);
        assert_eq!(argmax(&[f32::NAN, 1.0, f32::NAN, 2.0]), 3);
        assert_eq!(argmax(&[f32::NEG_INFINITY; 3]), 0);
        for seed in 0..50 {
            let p = RowParams { top_k: 1, seed, ..params(5.0) };
            assert_eq!(sample_row(&l, &p, &mut w), 1);
        }
    }

    #[test]
    fn masked_tokens_are_never_drawn() {
        let mut w = Vec::new();
        let l = [f32::NEG_INFINITY, 0.0, f32::NAN, 0.5, f32::NEG_INFINITY];
        for position in 0..500 {
            let t = sample_row(&l, &RowParams { position, ..params(1.0) }, &mut w);
            assert!(t == 1 || t == 3, "{t}");
        }
    }

    #[test]
    fn filters_cut_the_tail() {
        let mut w = Vec::new();
        let l = [5.0, 4.9, -10.0, -10.0, 4.8];
        for position in 0..300 {
            let p = RowParams { position, seed: 3, ..params(1.0) };
            assert!(sample_row(&l, &RowParams { top_p: 0.5, ..p }, &mut w) < 2);
            assert!(sample_row(&l, &RowParams { min_p: 0.5, ..p }, &mut w) != 2);
            assert!(sample_row(&l, &RowParams { top_k: 2, ..p }, &mut w) < 2);
        }
    }

    #[test]
    fn a_seed_and_position_give_the_same_token() {
        let mut w = Vec::new();
        let l: Vec<f32> = (0..5000).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let run = |seed, w: &mut Vec<f32>| {
            (0..20)
                .map(|position| sample_row(&l, &RowParams { seed, position, top_p: 0.9, ..params(0.8) }, w))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(42, &mut w), run(42, &mut w));
        assert_ne!(run(42, &mut w), run(43, &mut w));
    }
}
