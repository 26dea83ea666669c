//! The exact distribution a row's draw follows, computed the slow way (every candidate sorted): the reference the
//! samplers of every backend are tested against (chi-square over many draws), never on a serving path.

use super::params::RowParams;

/// The probability of each token of `logits` under `p`: temperature, then top-k and top-p jointly on the model's
/// distribution (ties with the last kept token kept), then min-p; greedy rows put everything on the argmax.
pub fn distribution(logits: &[f32], p: &RowParams) -> Vec<f64> {
    let mut out = vec![0.0; logits.len()];
    if logits.is_empty() {
        return out;
    }
    if p.is_greedy() {
        out[super::draw::argmax(logits) as usize] = 1.0;
        return out;
    }
    let t = f64::from(p.temperature);
    let mut cand: Vec<(usize, f64)> =
        logits.iter().enumerate().filter(|(_, l)| l.is_finite()).map(|(i, &l)| (i, f64::from(l) / t)).collect();
    if cand.is_empty() {
        out[super::draw::argmax(logits) as usize] = 1.0;
        return out;
    }
    cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let max = cand[0].1;
    let w: Vec<f64> = cand.iter().map(|&(_, z)| (z - max).exp()).collect();
    let total: f64 = w.iter().sum();
    let mut above_count = 0usize;
    let mut above_mass = 0.0f64;
    let mut kept = Vec::new();
    let mut i = 0;
    while i < cand.len() {
        // A run of equal values is kept or cut as one.
        let j = i + cand[i..].iter().take_while(|c| c.1 == cand[i].1).count();
        let in_k = p.top_k == 0 || above_count < p.top_k as usize;
        let in_p = p.top_p >= 1.0 || above_mass < f64::from(p.top_p) * total;
        let in_min = w[i] >= f64::from(p.min_p);
        if in_k && in_p && in_min {
            kept.extend(i..j);
        }
        above_count += j - i;
        above_mass += w[i..j].iter().sum::<f64>();
        i = j;
    }
    let sum: f64 = kept.iter().map(|&k| w[k]).sum();
    for k in kept {
        out[cand[k].0] = w[k] / sum;
    }
    out
}

/// Pearson's chi-square statistic of `counts` against `probs` over `draws` draws, with bins of fewer than 5
/// expected draws pooled, and its degrees of freedom. A draw in a bin of probability 0 gives infinity.
pub fn chi_square(counts: &[u64], probs: &[f64], draws: u64) -> (f64, usize) {
    let (mut stat, mut bins) = (0.0, 0usize);
    let (mut pool_obs, mut pool_exp) = (0.0, 0.0);
    for (&c, &p) in counts.iter().zip(probs) {
        let e = p * draws as f64;
        if p == 0.0 {
            if c > 0 {
                return (f64::INFINITY, 1);
            }
            continue;
        }
        if e < 5.0 {
            pool_obs += c as f64;
            pool_exp += e;
            continue;
        }
        stat += (c as f64 - e).powi(2) / e;
        bins += 1;
    }
    if pool_exp > 0.0 {
        stat += (pool_obs - pool_exp).powi(2) / pool_exp;
        bins += 1;
    }
    (stat, bins.saturating_sub(1))
}

/// The chi-square statistic above which a fit is rejected at p = 0.001, for `dof` degrees of freedom
/// (Wilson–Hilferty's approximation; within 1 % of the tables from 3 degrees of freedom up).
pub fn chi_square_limit(dof: usize) -> f64 {
    let k = dof.max(1) as f64;
    let z = 3.090_232; // the standard normal's 0.999 quantile
    let a = 2.0 / (9.0 * k);
    k * (1.0 - a + z * a.sqrt()).powi(3)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::draw::sample_row;

    fn draws(logits: &[f32], p: RowParams, n: u64) -> Vec<u64> {
        let mut counts = vec![0u64; logits.len()];
        let mut w = Vec::new();
        for position in 0..n {
            counts[sample_row(logits, &RowParams { position, ..p }, &mut w) as usize] += 1;
        }
        counts
    }

    /// The CPU sampler's frequencies over 100k draws fit the exact distribution after each filter.
    #[test]
    fn cpu_draws_follow_the_exact_distribution() {
        let logits: Vec<f32> = (0..300).map(|i| ((i * 37 % 101) as f32 * 0.05).sin() * 2.5).collect();
        let base = RowParams { temperature: 1.0, seed: 7, ..RowParams::GREEDY };
        for p in [
            base,
            RowParams { temperature: 0.7, ..base },
            RowParams { top_k: 20, ..base },
            RowParams { top_p: 0.9, temperature: 0.7, ..base },
            RowParams { min_p: 0.1, ..base },
            RowParams { top_k: 50, top_p: 0.8, min_p: 0.05, temperature: 1.3, ..base },
        ] {
            let n = 100_000;
            let probs = distribution(&logits, &p);
            let (stat, dof) = chi_square(&draws(&logits, p, n), &probs, n);
            assert!(stat < chi_square_limit(dof), "{p:?}: chi-square {stat:.1} with {dof} dof");
        }
    }

    #[test]
    fn the_limit_matches_the_tables() {
        // chi-square 0.999 quantiles: 10 dof 29.59, 100 dof 149.45.
        assert!((chi_square_limit(10) - 29.59).abs() < 0.3);
        assert!((chi_square_limit(100) - 149.45).abs() < 0.5);
    }

    #[test]
    fn filters_keep_the_head() {
        let p = RowParams { temperature: 1.0, top_k: 2, ..RowParams::GREEDY };
        let d = distribution(&[0.0, 3.0, 1.0, 2.0], &p);
        assert_eq!(d[0] + d[2], 0.0);
        assert!((d[1] + d[3] - 1.0).abs() < 1e-12);
    }
}
