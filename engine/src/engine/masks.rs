//! A constrained step's grammar masks: one row per sequence of the step, computed in parallel (rayon) while the
//! device runs the step's forward pass, then applied by the runner (on the device where it has one). Each request's
//! grammar also takes its previous token there (`GrammarState`), so no grammar work is left on the engine thread
//! between steps.

use rayon::prelude::*;

use crate::runner::StepMasks;
use crate::structured::{Constraint, GrammarError, TokenMask};
use crate::TokenId;

/// A request's grammar in the engine: its constraint and the token sampled last, which the next mask computation
/// accepts first.
pub(crate) struct GrammarState {
    constraint: Constraint,
    pending: Option<TokenId>,
}

impl GrammarState {
    pub(crate) fn new(constraint: Constraint) -> Self {
        Self { constraint, pending: None }
    }

    /// The token just sampled for this request (under the mask this state gave).
    pub(crate) fn sampled(&mut self, token: TokenId) {
        self.pending = Some(token);
    }

    fn next_mask(&mut self) -> Result<TokenMask, GrammarError> {
        if let Some(t) = self.pending.take() {
            self.constraint.accept(t)?;
        }
        self.constraint.next_mask()
    }
}

/// The masks of a step's rows (`None`: a row without a constraint, every token allowed) for a vocabulary of `vocab`
/// logits, and each row's grammar error, if its grammar failed (its row allows everything; the request is failed
/// instead of sampled).
pub(crate) fn compute(rows: Vec<Option<&mut GrammarState>>, vocab: usize) -> (StepMasks, Vec<Option<String>>) {
    let mut masks = StepMasks::allow_all(rows.len(), vocab);
    let words = masks.words_per_row;
    let errors = masks
        .bits
        .par_chunks_mut(words.max(1))
        .zip(rows.into_par_iter())
        .map(|(out, row)| match row.map(|c| c.next_mask()) {
            Some(Ok(mask)) => {
                mask.write_words(out);
                None
            }
            Some(Err(e)) => Some(e.to_string()),
            None => None,
        })
        .collect();
    (masks, errors)
}
