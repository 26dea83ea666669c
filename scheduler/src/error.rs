//! `SchedulerError`: every way a scheduler configuration or a new request can be rejected. One variant per rule; each
//! message names the field and the limit it broke.

use crate::ids::RequestId;

/// Errors of the `rserve-scheduler` crate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchedulerError {
    /// A step's block-table delta does not fit the tables a runner kept (`BlockTables::apply`).
    #[error("block tables of request {id}: {reason}")]
    BlockTableDelta { id: crate::RequestId, reason: String },

    /// A configuration field that must be positive is zero.
    #[error("scheduler config: `{field}` must be at least 1, got 0")]
    ZeroConfigValue { field: &'static str },

    /// Each running sequence needs at least one token of the step budget.
    #[error(
        "scheduler config: `max_num_batched_tokens` ({max_num_batched_tokens}) must be at least `max_num_seqs` ({max_num_seqs})"
    )]
    BatchBudgetBelowMaxSeqs { max_num_batched_tokens: usize, max_num_seqs: usize },

    /// The KV cache cannot hold even one request of the maximum length, so such a request could never finish.
    #[error(
        "scheduler config: the KV cache holds {capacity_tokens} tokens (`num_blocks` {num_blocks} x `block_size` {block_size}), \
         fewer than `max_model_len` ({max_model_len}); lower max_model_len or give the cache more memory"
    )]
    CacheSmallerThanModelLen { num_blocks: usize, block_size: usize, capacity_tokens: usize, max_model_len: usize },

    /// A scheduler serves at least one KV cache group.
    #[error("scheduler config: `kv_groups` is empty; at least one KV cache group (`KvGroupSpec::FULL`) is required")]
    NoKvGroups,

    /// A sliding window must cover at least the query's own token.
    #[error("scheduler config: KV cache group {group} has a sliding window of 0 tokens; a window must be at least 1")]
    ZeroSlidingWindow { group: usize },

    /// The KV cache cannot hold the blocks one request of the maximum length needs in all groups at once (each full
    /// group: the whole context; each sliding group: its window plus a step's chunk; plus the reserved null block).
    #[error(
        "scheduler config: one request of `max_model_len` {max_model_len} needs {blocks_needed} blocks of {block_size} \
         tokens over {num_groups} KV cache groups (null block included), but `num_blocks` is {num_blocks}; lower \
         max_model_len or give the cache more memory"
    )]
    CacheSmallerThanKvGroups {
        num_blocks: usize,
        blocks_needed: usize,
        block_size: usize,
        max_model_len: usize,
        num_groups: usize,
    },

    /// Slot indices (`block_id * block_size + offset`) are `u32`; the cache has more slots than that.
    #[error(
        "scheduler config: `num_blocks` ({num_blocks}) x `block_size` ({block_size}) exceeds the {max_slots} slots a u32 slot mapping can address"
    )]
    TooManySlots { num_blocks: usize, block_size: usize, max_slots: u64 },

    /// vLLM's rule: the long prefills are some of the partial prefills.
    #[error(
        "scheduler config: `max_long_partial_prefills` ({max_long_partial_prefills}) must not exceed \
         `max_num_partial_prefills` ({max_num_partial_prefills})"
    )]
    LongPrefillsAbovePartialPrefills { max_long_partial_prefills: usize, max_num_partial_prefills: usize },

    /// vLLM's rule: a prompt longer than the context cannot exist, so such a threshold makes nothing long.
    #[error(
        "scheduler config: `long_prefill_token_threshold` ({long_prefill_token_threshold}) must not exceed \
         `max_model_len` ({max_model_len})"
    )]
    LongPrefillThresholdAboveModelLen { long_prefill_token_threshold: usize, max_model_len: usize },

    /// A request must carry at least one prompt token.
    #[error("request {id}: `prompt_token_ids` is empty; at least 1 token is required")]
    EmptyPrompt { id: RequestId },

    /// The prompt alone is longer than the model's context.
    #[error("request {id}: prompt has {prompt_len} tokens, more than `max_model_len` ({max_model_len})")]
    PromptTooLong { id: RequestId, prompt_len: usize, max_model_len: usize },

    /// `max_tokens` must allow at least one generated token.
    #[error("request {id}: `max_tokens` must be at least 1, got 0")]
    ZeroMaxTokens { id: RequestId },

    /// `min_tokens` cannot exceed `max_tokens`.
    #[error("request {id}: `min_tokens` ({min_tokens}) must not exceed `max_tokens` ({max_tokens})")]
    MinTokensAboveMaxTokens { id: RequestId, min_tokens: usize, max_tokens: usize },

    /// A request with this id is already waiting or running.
    #[error("request {id}: a request with this id is already in the scheduler")]
    DuplicateRequest { id: RequestId },
}
