//! Tokens a request rules out before sampling: vLLM's `allowed_token_ids` (only these) and `bad_words` (the token
//! that would complete a banned sequence). Applied with the grammar mask, before penalties, bias and log-probs, so
//! log-probs describe what could really be sampled. `apply_bits`: a grammar mask as bits (structured outputs).

use crate::api::SamplingParams;
use crate::TokenId;
pub use rserve_backend::sampling::apply_bits;

/// Sets the logits of ruled-out tokens to -inf.
pub fn apply(logits: &mut [f32], p: &SamplingParams, output: &[TokenId]) {
    if let Some(allowed) = &p.allowed_token_ids {
        let mut next = allowed.iter().map(|t| t.0 as usize).peekable();
        for (i, x) in logits.iter_mut().enumerate() {
            if next.peek() == Some(&i) {
                next.next();
            } else {
                *x = f32::NEG_INFINITY;
            }
        }
    }
    for word in &p.bad_words {
        let Some((&last, prefix)) = word.split_last() else { continue };
        if output.ends_with(prefix) {
            if let Some(x) = logits.get_mut(last.0 as usize) {
                *x = f32::NEG_INFINITY;
            }
        }
    }
}

/// Clears the bits of `row` (`ceil(vocab / 32)` words, bit `t % 32` of word `t / 32` for token `t`) that `apply`
/// would set to -inf: the tokens outside `allowed_token_ids` and the completions of `bad_words`.
pub fn ban_bits(row: &mut [u32], p: &SamplingParams, output: &[TokenId], vocab: usize) {
    if let Some(allowed) = &p.allowed_token_ids {
        let mut keep = vec![0u32; row.len()];
        for &TokenId(t) in allowed {
            if (t as usize) < vocab {
                keep[t as usize / 32] |= 1 << (t % 32);
            }
        }
        row.iter_mut().zip(keep).for_each(|(w, k)| *w &= k);
    }
    for word in &p.bad_words {
        let Some((&TokenId(last), prefix)) = word.split_last() else { continue };
        if output.ends_with(prefix) && (last as usize) < vocab {
            row[last as usize / 32] &= !(1 << (last % 32));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[u32]) -> Vec<TokenId> {
        v.iter().copied().map(TokenId).collect()
    }

    #[test]
    fn ban_bits_rule_out_what_apply_rules_out() {
        let p = SamplingParams {
            allowed_token_ids: Some(ids(&[1, 3, 4, 40])),
            bad_words: vec![ids(&[4]), ids(&[2, 3])],
            ..Default::default()
        };
        for output in [ids(&[1]), ids(&[1, 2])] {
            let mut row = vec![0.0; 37];
            apply(&mut row, &p, &output);
            let mut bits = vec![u32::MAX; 2];
            ban_bits(&mut bits, &p, &output, 37);
            let mut masked = vec![0.0; 37];
            apply_bits(&mut masked, &bits);
            assert_eq!(row, masked);
        }
    }

    #[test]
    fn only_allowed_ids_survive() {
        let p = SamplingParams { allowed_token_ids: Some(ids(&[1, 3])), ..Default::default() };
        let mut row = vec![0.0; 5];
        apply(&mut row, &p, &[]);
        assert_eq!(row.iter().map(|x| x.is_finite()).collect::<Vec<_>>(), [false, true, false, true, false]);
    }

    #[test]
    fn a_bad_word_is_banned_only_where_it_would_be_completed() {
        let p = SamplingParams { bad_words: vec![ids(&[4]), ids(&[2, 3])], ..Default::default() };
        let mut row = vec![0.0; 5];
        apply(&mut row, &p, &ids(&[1]));
        assert_eq!(row.iter().map(|x| x.is_finite()).collect::<Vec<_>>(), [true, true, true, true, false]);
        let mut row = vec![0.0; 5];
        apply(&mut row, &p, &ids(&[1, 2]));
        assert_eq!(row.iter().map(|x| x.is_finite()).collect::<Vec<_>>(), [true, true, true, false, false]);
    }
}
