//! A constrained step's grammar masks: one row per sequence of the step, computed in parallel (rayon) while the
//! device runs the step's forward pass, then applied by the runner (on the device where it has one).

use rayon::prelude::*;

use crate::runner::StepMasks;
use crate::structured::Constraint;

/// The masks of a step's rows (`None`: a row without a constraint, every token allowed) for a vocabulary of `vocab`
/// logits, and each row's grammar error, if its grammar failed (its row allows everything; the request is failed
/// instead of sampled).
pub(crate) fn compute(rows: Vec<Option<&mut Constraint>>, vocab: usize) -> (StepMasks, Vec<Option<String>>) {
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
