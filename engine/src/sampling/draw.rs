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

/// The greedy token: the lowest index among equal maxima (`argmax_rows` and `sample_rows` follow the same rule);
/// NaN never wins; a row without a number above -inf gives 0.
pub fn argmax(l: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in l.iter().enumerate() {
        if *v > l[best] {
            best = i;
        }
    }
    best as u32
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
    let n = (xc * LOG2E + ROUND) - ROUND;
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    let p = 1.0 / 720.0;
    let p = p * r + 1.0 / 120.0;
    let p = p * r + 1.0 / 24.0;
    let p = p * r + 1.0 / 6.0;
    let p = p * r + 0.5;
    let p = p * r + 1.0;
    let p = p * r + 1.0;
    let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
    if keep {
        p * scale
    } else {
        0.0
    }
}

/// The token row `l` draws under `p`. `w` is scratch (resized to the row).
pub fn sample_row(l: &[f32], p: &RowParams, w: &mut Vec<f32>) -> u32 {
    if p.is_greedy() || l.is_empty() {
        return argmax(l);
    }
    let max = l.iter().copied().filter(|v| v.is_finite()).fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return argmax(l);
    }
    let inv_t = 1.0 / p.temperature;
    w.clear();
    w.extend(l.iter().map(|&v| if v.is_finite() { exp_nonpositive((v - max) * inv_t) } else { 0.0 }));
    // top-p is measured against the whole distribution, before min-p takes tokens out.
    let total: f32 = w.iter().sum();
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
fn draw_above(w: &[f32], pivot: f32, u: f32) -> Option<usize> {
    const BLOCK: usize = 1024;
    let masked = |v: f32| if v > pivot { v } else { 0.0 };
    let sums: Vec<f32> = w.chunks(BLOCK).map(|c| c.iter().map(|&v| masked(v)).sum()).collect();
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
        if acc + s > target {
            let start = b * BLOCK;
            for (i, &v) in w[start..(start + BLOCK).min(w.len())].iter().enumerate() {
                let v = masked(v);
                if v > 0.0 {
                    acc += v;
                    last = Some(start + i);
                    if acc > target {
                        return last;
                    }
                }
            }
            // Rounding: the block's elements summed one by one fell short of its sum; its last candidate it is.
            return last;
        }
        acc += s;
        last = Some(b * BLOCK + w[b * BLOCK..(b * BLOCK + BLOCK).min(w.len())].iter().rposition(|&v| v > pivot)?);
    }
    last
}

/// How many weights are above `ws`, and their sum.
fn above(w: &[f32], ws: f32) -> (usize, f32) {
    let mut count = 0usize;
    let mut mass = 0.0f32;
    for &v in w {
        let a = v > ws;
        count += a as usize;
        mass += if a { v } else { 0.0 };
    }
    (count, mass)
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
                .map(|position| {
                    sample_row(&l, &RowParams { seed, position, top_p: 0.9, ..params(0.8) }, w)
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(run(42, &mut w), run(42, &mut w));
        assert_ne!(run(42, &mut w), run(43, &mut w));
    }
}
