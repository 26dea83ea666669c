//! Log-probabilities of the model's raw distribution (before penalties and temperature, as vLLM reports them):
//! the chosen token's and the top-k alternatives.

/// `log_softmax(logits)[i]` for all i.
pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    let lse = max as f64 + sum.ln();
    logits.iter().map(|&l| (l as f64 - lse) as f32).collect()
}

/// `log(sum(exp(logits)))`, accumulated in f64 (-inf when every logit is -inf).
pub fn log_sum_exp(logits: &[f32]) -> f32 {
    let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return max;
    }
    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    (max as f64 + sum.ln()) as f32
}

/// The `n` highest (id, value) pairs of `x` in one pass, highest first, ties broken by lower id; NaN never counts.
pub fn top(x: &[f32], n: usize) -> Vec<(u32, f32)> {
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
    if n == 0 {
        return best;
    }
    for (i, &v) in x.iter().enumerate() {
        // NaN never counts; a full list takes only values above its last.
        if v.is_nan() || (best.len() == n && v <= best[n - 1].1) {
            continue;
        }
        // Later ids lose ties: insert after every value >= v.
        let at = best.partition_point(|&(_, b)| b >= v);
        best.insert(at, (i as u32, v));
        best.truncate(n);
    }
    best
}

/// The `k` highest (id, logprob) pairs, highest first; ties broken by lower id.
pub fn top_k(logprobs: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut idx: Vec<u32> = (0..logprobs.len() as u32).collect();
    let k = k.min(idx.len());
    if k == 0 {
        return Vec::new();
    }
    let cmp = |a: &u32, b: &u32| logprobs[*b as usize].total_cmp(&logprobs[*a as usize]).then(a.cmp(b));
    idx.select_nth_unstable_by(k - 1, cmp);
    idx.truncate(k);
    idx.sort_by(cmp);
    idx.into_iter().map(|i| (i, logprobs[i as usize])).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_normalises() {
        let lp = log_softmax(&[1.0, 2.0, 3.0]);
        let total: f32 = lp.iter().map(|v| v.exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
        assert!(lp[2] > lp[1] && lp[1] > lp[0]);
    }

    #[test]
    fn one_pass_top_equals_the_selection() {
        let x: Vec<f32> = (0..3000).map(|i| ((i * 7919 % 1000) as f32 * 0.013).sin()).collect();
        for n in [0, 1, 5, 20] {
            let want = top_k(&x, n);
            assert_eq!(top(&x, n), want);
        }
        let lse = log_sum_exp(&x);
        let lp = log_softmax(&x);
        assert!((x[17] - lse - lp[17]).abs() < 1e-5);
    }

    #[test]
    fn top_k_orders_highest_first() {
        assert_eq!(top_k(&[0.1, 0.9, 0.5, 0.9], 3), vec![(1, 0.9), (3, 0.9), (2, 0.5)]);
    }
}
