//! `BlockTables`: the receiving side of the scheduler's block-table deltas. A step's `ScheduledSeq` brings a
//! request's whole tables on its first schedule since (re)admission and only the block ids appended since its
//! previous step after that (vLLM v1's new and cached request data). A runner keeps one `BlockTables`: `apply` takes
//! each step's sequences, `of` gives a sequence's whole tables, `forget` drops the requests that ended.

use crate::error::SchedulerError;
use crate::id_map::IdMap;
use crate::ids::{BlockId, RequestId};
use crate::output::ScheduledSeq;

/// Each running request's block tables (one per KV cache group) as the scheduler has sent them.
#[derive(Debug, Default)]
pub struct BlockTables {
    by_request: IdMap<RequestId, Vec<Vec<BlockId>>>,
}

impl BlockTables {
    /// Takes one step's sequences: whole tables are kept, appended ids added to the tables kept. A sequence whose
    /// first schedule was not seen, or whose tables do not add up to the length the scheduler gives, is refused.
    pub fn apply(&mut self, seqs: &[ScheduledSeq]) -> Result<(), SchedulerError> {
        for s in seqs {
            let bad = |reason: String| SchedulerError::BlockTableDelta { id: s.request_id, reason };
            if s.is_first_schedule {
                let kept = self.by_request.entry(s.request_id).or_default();
                kept.resize_with(s.block_tables.len(), Vec::new);
                for (k, t) in kept.iter_mut().zip(&s.block_tables) {
                    k.clear();
                    k.extend_from_slice(t);
                }
                continue;
            }
            let kept = self
                .by_request
                .get_mut(&s.request_id)
                .ok_or_else(|| bad("no block table kept: its first schedule was not seen".into()))?;
            if kept.len() != s.block_tables.len() {
                return Err(bad(format!("{} groups kept, {} sent", kept.len(), s.block_tables.len())));
            }
            for (k, new) in kept.iter_mut().zip(&s.block_tables) {
                k.extend_from_slice(new);
                if k.len() != s.num_blocks {
                    return Err(bad(format!("{} entries kept, the scheduler has {}", k.len(), s.num_blocks)));
                }
            }
        }
        Ok(())
    }

    /// The whole tables of `s` (after `apply` of its step): its own on a first schedule, else the ones kept.
    pub fn of<'a>(&'a self, s: &'a ScheduledSeq) -> &'a [Vec<BlockId>] {
        if s.is_first_schedule {
            return &s.block_tables;
        }
        self.by_request.get(&s.request_id).map_or(&[], Vec::as_slice)
    }

    /// Drops the tables of requests that ended (finished, aborted, preempted).
    pub fn forget(&mut self, ids: impl IntoIterator<Item = RequestId>) {
        for id in ids {
            self.by_request.remove(&id);
        }
    }

    /// Requests whose tables are kept.
    pub fn len(&self) -> usize {
        self.by_request.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_request.is_empty()
    }
}
