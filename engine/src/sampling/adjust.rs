//! Penalties and logit bias as sparse edits of a row's logits (vLLM's semantics): the repetition penalty divides a
//! positive logit (multiplies a negative one) of every token seen in the prompt or the output, presence and
//! frequency penalties subtract per output token, logit bias adds. One edit per (row, token), so a device applies
//! them in one launch (`Op::AdjustLogits`) instead of passes over the vocabulary.

use std::collections::HashMap;

use crate::api::SamplingParams;
use crate::TokenId;
pub use rserve_backend::sampling::Edit;

/// Whether `p` edits logits at all.
pub fn edits_any(p: &SamplingParams) -> bool {
    p.repetition_penalty != 1.0 || p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 || !p.logit_bias.is_empty()
}

/// Appends row `row`'s edits (sorted by token, ids outside `vocab` dropped) to `out`.
pub fn push_row(
    out: &mut Vec<Edit>,
    row: u32,
    p: &SamplingParams,
    prompt: &[TokenId],
    output: &[TokenId],
    vocab: usize,
) {
    if !edits_any(p) {
        return;
    }
    let mut by_token: HashMap<u32, (f32, f32)> = HashMap::new();
    if p.repetition_penalty != 1.0 {
        for &TokenId(t) in prompt.iter().chain(output) {
            by_token.entry(t).or_insert((1.0, 0.0)).0 = p.repetition_penalty;
        }
    }
    if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for &TokenId(t) in output {
            *counts.entry(t).or_default() += 1;
        }
        for (t, c) in counts {
            by_token.entry(t).or_insert((1.0, 0.0)).1 -= p.frequency_penalty * c as f32 + p.presence_penalty;
        }
    }
    for &(TokenId(t), b) in &p.logit_bias {
        by_token.entry(t).or_insert((1.0, 0.0)).1 += b;
    }
    let start = out.len();
    out.extend(by_token.into_iter().filter(|(t, _)| (*t as usize) < vocab).map(|(token, (mul, add))| Edit {
        row,
        token,
        mul,
        add,
    }));
    out[start..].sort_unstable_by_key(|e| e.token);
}

/// Applies one row's edits.
pub fn apply(row: &mut [f32], edits: &[Edit]) {
    for e in edits {
        if let Some(x) = row.get_mut(e.token as usize) {
            *x = e.apply(*x);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::penalties;

    #[test]
    fn edits_equal_the_host_penalties() {
        let p = SamplingParams {
            repetition_penalty: 1.3,
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            logit_bias: vec![(TokenId(3), 2.0), (TokenId(1), -1.0), (TokenId(99), 1.0)],
            ..Default::default()
        };
        let (prompt, output) = ([TokenId(0), TokenId(4)], [TokenId(1), TokenId(1), TokenId(4), TokenId(2)]);
        let logits: Vec<f32> = vec![1.5, -0.5, 2.0, 0.25, -3.0, 0.7];
        let mut want = logits.clone();
        penalties::apply(&mut want, &p, &prompt, &output);
        let mut edits = Vec::new();
        push_row(&mut edits, 0, &p, &prompt, &output, logits.len());
        let mut got = logits.clone();
        apply(&mut got, &edits);
        for (a, b) in got.iter().zip(&want) {
            assert!((a - b).abs() < 1e-6, "{got:?} vs {want:?}");
        }
        assert!(edits.windows(2).all(|w| w[0].token < w[1].token));
    }
}
