//! Picking the next token: greedy when temperature is 0, else temperature, top-k, top-p and min-p filtering and a draw
//! from the request's own RNG (seeded per request when `seed` is set, so results repeat).

use rand::rngs::StdRng;
use rand::Rng;

use super::{logprobs, penalties};
use crate::api::SamplingParams;
use crate::TokenId;

/// The sampled token and, when asked for, its log-prob and the top alternatives (raw distribution).
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    pub token: TokenId,
    pub logprob: Option<(f32, Vec<(TokenId, f32)>)>,
}

/// Samples one token from `logits` (one sequence, full vocabulary). `logits` is used as scratch.
pub fn sample(
    logits: &mut [f32],
    p: &SamplingParams,
    prompt: &[TokenId],
    output: &[TokenId],
    rng: &mut StdRng,
) -> Sampled {
    let raw = p.logprobs.map(|k| (logprobs::log_softmax(logits), k));
    penalties::apply(logits, p, prompt, output);
    let token = if p.temperature < 1e-5 { argmax(logits) } else { draw(logits, p, rng) };
    let logprob = raw.map(|(lp, k)| {
        let top = logprobs::top_k(&lp, k).into_iter().map(|(id, l)| (TokenId(id), l)).collect();
        (lp[token as usize], top)
    });
    Sampled { token: TokenId(token), logprob }
}

/// The greedy token: the lowest index among equal maxima (`argmax_rows` on the GPU follows the same rule).
pub fn argmax(l: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in l.iter().enumerate() {
        if *v > l[best] {
            best = i;
        }
    }
    best as u32
}

fn draw(logits: &[f32], p: &SamplingParams, rng: &mut StdRng) -> u32 {
    // Candidates sorted by logit, highest first.
    let mut cand: Vec<(u32, f32)> =
        logits.iter().enumerate().filter(|(_, l)| l.is_finite()).map(|(i, &l)| (i as u32, l / p.temperature)).collect();
    if cand.is_empty() {
        return argmax(logits);
    }
    cand.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    if p.top_k > 0 {
        cand.truncate(p.top_k);
    }
    let max = cand[0].1;
    let mut probs: Vec<f32> = cand.iter().map(|(_, l)| (l - max).exp()).collect();
    let sum: f32 = probs.iter().sum();
    probs.iter_mut().for_each(|v| *v /= sum);
    let mut keep = probs.len();
    if p.top_p < 1.0 {
        let mut acc = 0.0;
        for (i, pr) in probs.iter().enumerate() {
            acc += pr;
            if acc >= p.top_p {
                keep = i + 1;
                break;
            }
        }
    }
    if p.min_p > 0.0 {
        let floor = probs[0] * p.min_p;
        keep = keep.min(probs.iter().take_while(|&&pr| pr >= floor).count().max(1));
    }
    let total: f32 = probs[..keep].iter().sum();
    let mut r = rng.gen::<f32>() * total;
    for (i, pr) in probs[..keep].iter().enumerate() {
        if r < *pr {
            return cand[i].0;
        }
        r -= pr;
    }
    cand[keep - 1].0
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn params(t: f32) -> SamplingParams {
        SamplingParams { temperature: t, ..Default::default() }
    }

    #[test]
    fn greedy_takes_argmax_after_bias() {
        let mut rng = StdRng::seed_from_u64(0);
        let p = SamplingParams { logit_bias: vec![(TokenId(0), 10.0)], ..params(0.0) };
        assert_eq!(sample(&mut [1.0, 3.0, 2.0], &params(0.0), &[], &[], &mut rng).token, TokenId(1));
        assert_eq!(sample(&mut [1.0, 3.0, 2.0], &p, &[], &[], &mut rng).token, TokenId(0));
    }

    #[test]
    fn top_k_one_is_greedy_at_any_temperature() {
        let mut rng = StdRng::seed_from_u64(7);
        let p = SamplingParams { top_k: 1, ..params(5.0) };
        for _ in 0..50 {
            assert_eq!(sample(&mut [0.0, 0.1, 0.2, 0.05], &p, &[], &[], &mut rng).token, TokenId(2));
        }
    }

    #[test]
    fn top_p_and_min_p_cut_the_tail() {
        let mut rng = StdRng::seed_from_u64(3);
        let logits = [5.0, 4.9, -10.0, -10.0];
        let p = SamplingParams { top_p: 0.9, ..params(1.0) };
        let q = SamplingParams { min_p: 0.5, ..params(1.0) };
        for _ in 0..200 {
            assert!(sample(&mut logits.clone(), &p, &[], &[], &mut rng).token < TokenId(2));
            assert!(sample(&mut logits.clone(), &q, &[], &[], &mut rng).token < TokenId(2));
        }
    }

    #[test]
    fn same_seed_same_draws() {
        let logits: Vec<f32> = (0..100).map(|i| (i as f32 * 0.37).sin()).collect();
        let run = |seed| {
            let mut rng = StdRng::seed_from_u64(seed);
            (0..20).map(|_| sample(&mut logits.clone(), &params(1.0), &[], &[], &mut rng).token).collect::<Vec<_>>()
        };
        assert_eq!(run(42), run(42));
        assert_ne!(run(42), run(43));
    }

    #[test]
    fn logprobs_come_from_the_raw_distribution() {
        let mut rng = StdRng::seed_from_u64(0);
        let p = SamplingParams { logprobs: Some(2), repetition_penalty: 2.0, ..params(0.0) };
        let s = sample(&mut [1.0, 2.0, 3.0], &p, &[TokenId(2)], &[], &mut rng);
        let lp = logprobs::log_softmax(&[1.0, 2.0, 3.0]);
        let (chosen, top) = s.logprob.unwrap();
        assert_eq!(chosen, lp[s.token.0 as usize]);
        assert_eq!(top[0], (TokenId(2), lp[2]));
    }
}
