//! What a scheduler step hands out and takes back: `SchedulerOutput` / `ScheduledSeq` (the flattened batch for the
//! model runner), `RequestOutput` / `FinishStatus` (per-request results of `update_from_output`) and
//! `SchedulerStats` (gauges and counters for metrics).

use crate::ids::{BlockId, RequestId, TokenId};

/// One request's part of a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduledSeq {
    pub request_id: RequestId,
    /// The tokens to compute this step: a prompt chunk, recomputed tokens after preemption, or the last sampled token.
    pub token_ids: Vec<TokenId>,
    /// Equals the request's `num_computed_tokens` before this step; the tokens sit at positions
    /// `start_position..start_position + token_ids.len()`.
    pub start_position: usize,
    /// Per KV cache group (`SchedulerConfig::kv_groups` order): on the request's first schedule since its
    /// (re)admission (`is_first_schedule`), its whole block table after allocation; after that, only the block ids
    /// appended to it since the request's previous step (often none), as vLLM v1 sends a cached request's new block
    /// ids. A runner keeps each request's tables (`rserve_engine`'s `BlockTables`). In a sliding-window group the
    /// entries before the window are [`crate::NULL_BLOCK`] in a whole table; an entry that leaves the window later
    /// is not sent again (no kernel reads it).
    pub block_tables: Vec<Vec<BlockId>>,
    /// Each group's table length after this step's allocation (all groups have the same).
    pub num_blocks: usize,
    /// Per group, per token, the cache slot its KV is written to: `block_id * block_size + offset`.
    pub slot_mappings: Vec<Vec<u32>>,
    /// True when this step computes all known tokens of the request, so the runner samples one token for it.
    pub sample: bool,
    /// Prompt tokens this request got from the prefix cache at its first admission (for usage and metrics).
    pub num_cached_tokens: usize,
    /// First time scheduled since (re)admission: `block_tables` are whole, and the runner (re)builds per-request
    /// state.
    pub is_first_schedule: bool,
}

impl ScheduledSeq {
    /// A step that computes `token_ids` at positions `start_position..` of a sequence whose blocks are
    /// `block_table` (one KV cache group, whole: a first schedule), with the slot mapping that table implies, and
    /// samples after them. The
    /// scheduler fills its own (recycled) entries; this is for runners driven without one (tests, benchmarks, other
    /// MPI ranks).
    pub fn new(token_ids: Vec<TokenId>, start_position: usize, block_table: Vec<BlockId>, block_size: usize) -> Self {
        Self::with_groups(token_ids, start_position, vec![block_table], block_size)
    }

    /// `new` with one block table per KV cache group.
    pub fn with_groups(
        token_ids: Vec<TokenId>,
        start_position: usize,
        block_tables: Vec<Vec<BlockId>>,
        block_size: usize,
    ) -> Self {
        let positions = start_position..start_position + token_ids.len();
        let slot_mappings = block_tables
            .iter()
            .map(|table| {
                let mut slots = Vec::with_capacity(token_ids.len());
                push_slots(&mut slots, table, positions.clone(), block_size);
                slots
            })
            .collect();
        Self {
            request_id: RequestId(0),
            token_ids,
            start_position,
            num_blocks: block_tables.first().map_or(0, Vec::len),
            block_tables,
            slot_mappings,
            sample: true,
            num_cached_tokens: 0,
            is_first_schedule: true,
        }
    }

    /// The block table of the first KV cache group (the only one of a model without sliding-window layers).
    pub fn block_table(&self) -> &[BlockId] {
        self.block_tables.first().map_or(&[], |t| t.as_slice())
    }

    /// Number of tokens computed for this request in the step.
    pub fn num_tokens(&self) -> usize {
        self.token_ids.len()
    }
}

/// Appends the cache slot of each position in `positions` (`block * block_size + offset`, the block from `table`),
/// walking block by block instead of dividing per token. `table` must cover the positions.
pub(crate) fn push_slots(
    slots: &mut Vec<u32>,
    table: &[BlockId],
    positions: std::ops::Range<usize>,
    block_size: usize,
) {
    slots.reserve(positions.len());
    let (mut block, mut offset) = (positions.start / block_size, positions.start % block_size);
    for _ in positions {
        slots.push(table[block].0 * block_size as u32 + offset as u32);
        offset += 1;
        if offset == block_size {
            offset = 0;
            block += 1;
        }
    }
}

/// The result of one [`crate::Scheduler::schedule`] call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SchedulerOutput {
    /// Running requests first (in admission order), then newly admitted ones.
    pub seqs: Vec<ScheduledSeq>,
    /// Sum of `seqs[i].token_ids.len()`; never above `max_num_batched_tokens`.
    pub num_batched_tokens: usize,
    /// Requests preempted in this step: their blocks are freed and they wait to be recomputed.
    pub preempted: Vec<RequestId>,
    /// Requests that finished or were aborted since the previous step; the runner can drop their state.
    pub finished_ids: Vec<RequestId>,
}

impl SchedulerOutput {
    /// True when there is nothing to compute.
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    /// How many `sampled` entries `update_from_output` expects: one per seq with `sample == true`.
    pub fn num_samples(&self) -> usize {
        self.seqs.iter().filter(|s| s.sample).count()
    }
}

/// Why a request finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinishStatus {
    /// A stop token (EOS or a user stop token id) was sampled after `min_tokens`; the token is included in the output.
    StopToken(TokenId),
    /// `max_tokens` generated or `max_model_len` reached.
    Length,
}

/// One request's result of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestOutput {
    pub request_id: RequestId,
    /// The token sampled this step (also when it is the stop token that finished the request).
    pub new_token: Option<TokenId>,
    /// Set when the request finished; its blocks are already freed.
    pub finished: Option<FinishStatus>,
}

/// Gauges and counters of the scheduler.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchedulerStats {
    pub num_running: usize,
    pub num_waiting: usize,
    /// Blocks referenced by some request (in any KV cache group; never the reserved null block).
    pub num_blocks_used: usize,
    /// Blocks referenced by none, including cached blocks waiting for reuse.
    pub num_blocks_free: usize,
    /// Usable blocks: `num_blocks`, less the reserved null block when a KV cache group slides; always
    /// `num_blocks_used + num_blocks_free`.
    pub num_blocks_total: usize,
    /// Blocks registered in the prefix cache (used or free).
    pub num_blocks_cached: usize,
    /// Preemptions since start.
    pub num_preemptions: u64,
    /// Tokens looked up in the prefix cache at admissions since start.
    pub prefix_cache_queries: u64,
    /// Of those, tokens found in the cache.
    pub prefix_cache_hits: u64,
}
