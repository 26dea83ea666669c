//! `BatchInput`: one forward step's flattened batch — prefill chunks and decode tokens of many sequences mixed, each
//! with its positions, block table and slot mapping — and its checks.

use crate::error::{EngineError, Result};

/// One sequence's part of a step.
#[derive(Debug, Clone, PartialEq)]
pub struct SeqInput {
    /// Tokens to compute this step (a prefill chunk, or one decode token).
    pub token_ids: Vec<u32>,
    /// Position of the first of them (= tokens already in the cache for this sequence).
    pub start_position: usize,
    /// The sequence's block table (block ids in the paged cache).
    pub block_table: Vec<u32>,
    /// Cache slot of each token (`block * block_size + offset`).
    pub slot_mapping: Vec<u32>,
}

/// A flattened batch: the model returns the logits of the last token of each sequence, in order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BatchInput {
    pub seqs: Vec<SeqInput>,
}

impl BatchInput {
    pub fn num_tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.token_ids.len()).sum()
    }

    /// Checks the shapes the kernels rely on: non-empty sequences, one slot per token, tables long enough.
    pub fn validate(&self, block_size: usize, num_blocks: usize) -> Result<()> {
        for (i, s) in self.seqs.iter().enumerate() {
            let bad = |m: String| Err(EngineError::InvalidArgument(format!("batch sequence {i}: {m}")));
            if s.token_ids.is_empty() {
                return bad("no tokens".into());
            }
            if s.slot_mapping.len() != s.token_ids.len() {
                return bad(format!("{} slots for {} tokens", s.slot_mapping.len(), s.token_ids.len()));
            }
            let ctx = s.start_position + s.token_ids.len();
            if s.block_table.len() * block_size < ctx {
                return bad(format!("block table of {} blocks cannot hold {ctx} tokens", s.block_table.len()));
            }
            if let Some(b) = s.block_table.iter().find(|&&b| b as usize >= num_blocks) {
                return bad(format!("block {b} is outside the cache of {num_blocks} blocks"));
            }
            for (t, &slot) in s.slot_mapping.iter().enumerate() {
                let pos = s.start_position + t;
                let want = s.block_table[pos / block_size] as usize * block_size + pos % block_size;
                if slot as usize != want {
                    return bad(format!("slot {slot} of position {pos} disagrees with the block table ({want})"));
                }
            }
        }
        Ok(())
    }
}
