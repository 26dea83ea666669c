//! A constrained step's grammar masks: one row per sequence of the step, computed in parallel (rayon) while the
//! device runs the step's forward pass, then applied by the runner (on the device where it has one). Each request's
//! grammar also takes its previous token there (`GrammarState`), so no grammar work is left on the engine thread
//! between steps. A grammar that waits for the end of the reasoning allows every token until the marker is out.

use rayon::prelude::*;

use crate::runner::StepMasks;
use crate::structured::{Constraint, GrammarError, TokenMask};
use crate::TokenId;

/// A request's grammar in the engine: its constraint and the token sampled last, which the next mask computation
/// accepts first; while the grammar waits for the reasoning's end marker, the ids sampled since the marker could
/// have begun.
pub(crate) struct GrammarState {
    constraint: Constraint,
    pending: Option<TokenId>,
    /// The end marker the grammar waits for and the output's last ids (at most the marker's length).
    waiting: Option<(Vec<TokenId>, Vec<TokenId>)>,
}

impl GrammarState {
    /// `after`: the ids the output must hold before the grammar starts (none or empty: from the first token).
    pub(crate) fn new(constraint: Constraint, after: Option<&[TokenId]>) -> Self {
        let waiting = after.filter(|m| !m.is_empty()).map(|m| (m.to_vec(), Vec::with_capacity(m.len())));
        Self { constraint, pending: None, waiting }
    }

    /// The token just sampled for this request (under the mask this state gave).
    pub(crate) fn sampled(&mut self, token: TokenId) {
        match &mut self.waiting {
            Some((marker, tail)) => {
                if tail.len() == marker.len() {
                    tail.remove(0);
                }
                tail.push(token);
                if tail == marker {
                    self.waiting = None;
                }
            }
            None => self.pending = Some(token),
        }
    }

    /// The next mask; `None` while the grammar waits (every token allowed).
    fn next_mask(&mut self) -> Result<Option<TokenMask>, GrammarError> {
        if self.waiting.is_some() {
            return Ok(None);
        }
        if let Some(t) = self.pending.take() {
            self.constraint.accept(t)?;
        }
        self.constraint.next_mask().map(Some)
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
            Some(Ok(Some(mask))) => {
                mask.write_words(out);
                None
            }
            Some(Err(e)) => Some(e.to_string()),
            Some(Ok(None)) | None => None,
        })
        .collect();
    (masks, errors)
}
