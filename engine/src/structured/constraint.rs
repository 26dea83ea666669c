//! One request's place in its grammar: which tokens may come next (`next_mask`), applied to a row of logits
//! (`apply_mask`), and advanced by each sampled token (`accept`).

use llguidance::Matcher;
use toktrie::SimpleVob;

use super::compiler::{Grammar, GrammarError};
use crate::TokenId;

/// The set of tokens allowed next, one bit per vocabulary id.
pub struct TokenMask(SimpleVob);

impl TokenMask {
    /// Whether `token` is allowed.
    pub fn allows(&self, token: TokenId) -> bool {
        (token.0 as usize) < self.0.len() && self.0.is_allowed(token.0)
    }

    /// How many tokens are allowed.
    pub fn count(&self) -> usize {
        self.0.num_set()
    }

    /// Writes the mask into one row of a step's masks (`out.len()` words, bit `t % 32` of word `t / 32` for token
    /// `t`): ids the mask does not cover are disallowed.
    pub fn write_words(&self, out: &mut [u32]) {
        let words = self.0.as_slice();
        let n = words.len().min(out.len());
        out[..n].copy_from_slice(&words[..n]);
        out[n..].fill(0);
        // Bits past the mask's own length within its last word are not ids of the vocabulary.
        let len = self.0.len();
        if len < n * 32 {
            if let Some(w) = out.get_mut(len / 32) {
                *w &= (1u32 << (len % 32)) - 1;
            }
        }
    }
}

/// A request's grammar state.
pub struct Constraint {
    matcher: Matcher,
}

impl Constraint {
    pub fn new(grammar: &Grammar) -> Self {
        Self { matcher: Matcher::new(Ok(grammar.fresh_parser())) }
    }

    /// The tokens allowed next. A finished grammar allows only the end-of-sequence ids.
    pub fn next_mask(&mut self) -> Result<TokenMask, GrammarError> {
        let mask = self.matcher.compute_mask_or_eos().map_err(|e| GrammarError(e.to_string()))?;
        if let Some(e) = self.matcher.get_error() {
            return Err(GrammarError(e));
        }
        Ok(TokenMask(mask))
    }

    /// Advances past a sampled token. A token after the grammar has ended (the end-of-sequence id that a finished
    /// grammar allows) changes nothing.
    pub fn accept(&mut self, token: TokenId) -> Result<(), GrammarError> {
        if let Some(e) = self.matcher.get_error() {
            return Err(GrammarError(e));
        }
        if self.matcher.is_stopped() {
            return Ok(());
        }
        self.matcher.consume_token(token.0).map_err(|e| GrammarError(e.to_string()))
    }

    /// Whether the output so far is a complete sentence of the grammar.
    pub fn is_complete(&mut self) -> bool {
        self.matcher.is_stopped() || self.matcher.is_accepting().unwrap_or(false)
    }
}

/// Sets every logit the mask does not allow to -inf (ids beyond the mask too).
pub fn apply_mask(logits: &mut [f32], mask: &TokenMask) {
    crate::sampling::masks::apply_bits(logits, mask.0.as_slice());
}
