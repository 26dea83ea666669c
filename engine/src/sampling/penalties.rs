//! Logit processors with vLLM's semantics: repetition penalty over prompt and output tokens, presence and frequency
//! penalties over output tokens, and additive logit bias.

use std::collections::HashMap;

use crate::api::SamplingParams;
use crate::TokenId;

/// Applies penalties and bias to `logits` in place.
pub fn apply(logits: &mut [f32], p: &SamplingParams, prompt: &[TokenId], output: &[TokenId]) {
    if p.repetition_penalty != 1.0 {
        let r = p.repetition_penalty;
        let mut seen = vec![false; logits.len()];
        for &TokenId(t) in prompt.iter().chain(output) {
            if let Some(s) = seen.get_mut(t as usize) {
                if !*s {
                    *s = true;
                    let l = &mut logits[t as usize];
                    *l = if *l > 0.0 { *l / r } else { *l * r };
                }
            }
        }
    }
    if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for &TokenId(t) in output {
            *counts.entry(t).or_default() += 1;
        }
        for (t, c) in counts {
            if let Some(l) = logits.get_mut(t as usize) {
                *l -= p.frequency_penalty * c as f32 + p.presence_penalty;
            }
        }
    }
    for &(TokenId(t), b) in &p.logit_bias {
        if let Some(l) = logits.get_mut(t as usize) {
            *l += b;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repetition_penalty_divides_positive_and_multiplies_negative_once() {
        let mut l = vec![2.0, -2.0, 1.0];
        let p = SamplingParams { repetition_penalty: 2.0, ..Default::default() };
        apply(&mut l, &p, &[TokenId(0), TokenId(1), TokenId(0)], &[TokenId(1)]);
        assert_eq!(l, vec![1.0, -4.0, 1.0]);
    }

    #[test]
    fn presence_and_frequency_count_output_only() {
        let mut l = vec![0.0; 3];
        let p = SamplingParams { presence_penalty: 0.5, frequency_penalty: 0.25, ..Default::default() };
        apply(&mut l, &p, &[TokenId(2)], &[TokenId(0), TokenId(0), TokenId(1)]);
        assert_eq!(l, vec![-1.0, -0.75, 0.0]);
    }

    #[test]
    fn logit_bias_adds_and_ignores_out_of_range_ids() {
        let mut l = vec![0.0; 2];
        let p = SamplingParams { logit_bias: vec![(TokenId(1), 5.0), (TokenId(9), 1.0)], ..Default::default() };
        apply(&mut l, &p, &[], &[]);
        assert_eq!(l, vec![0.0, 5.0]);
    }
}
