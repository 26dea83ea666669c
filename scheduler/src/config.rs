//! `SchedulerConfig`: the scheduler's own small configuration (cache geometry and step limits) and its validation.

use crate::error::SchedulerError;
use crate::kv_groups::KvGroupSpec;
use crate::prefill_limits::PrefillLimits;

/// Default number of token slots per KV block.
pub const DEFAULT_BLOCK_SIZE: usize = 16;
/// Default cap on the number of running sequences.
pub const DEFAULT_MAX_NUM_SEQS: usize = 256;
/// Default cap on the number of tokens computed in one step.
pub const DEFAULT_MAX_NUM_BATCHED_TOKENS: usize = 2048;

/// Configuration of one [`crate::Scheduler`]. Build it with [`SchedulerConfig::new`] and adjust fields;
/// [`SchedulerConfig::validate`] (called by `Scheduler::new`) checks it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Token slots per KV block.
    pub block_size: usize,
    /// Number of KV blocks in the cache, shared by all KV cache groups (block 0 is reserved as the null block when a
    /// group slides; see [`SchedulerConfig::min_num_blocks`] for the fewest that [`SchedulerConfig::validate`] accepts).
    pub num_blocks: usize,
    /// Most sequences running at once.
    pub max_num_seqs: usize,
    /// Most tokens computed in one step (prefill chunks and decodes together).
    pub max_num_batched_tokens: usize,
    /// Longest sequence (prompt plus output) the model accepts.
    pub max_model_len: usize,
    /// Share full blocks between requests with equal prefixes.
    pub enable_prefix_caching: bool,
    /// The KV cache groups (one full group unless the model has sliding-window layers); every request holds one
    /// block table per group.
    pub kv_groups: Vec<KvGroupSpec>,
    /// How many requests may prefill in one step, how many of them long, and the longest prefill chunk.
    pub prefill_limits: PrefillLimits,
}

impl SchedulerConfig {
    /// A configuration with the given cache size and context length and default limits: block size 16, 256 sequences,
    /// 2048 batched tokens, prefix caching on, no partial-prefill limits.
    pub fn new(num_blocks: usize, max_model_len: usize) -> Self {
        Self {
            block_size: DEFAULT_BLOCK_SIZE,
            num_blocks,
            max_num_seqs: DEFAULT_MAX_NUM_SEQS,
            max_num_batched_tokens: DEFAULT_MAX_NUM_BATCHED_TOKENS,
            max_model_len,
            enable_prefix_caching: true,
            kv_groups: vec![KvGroupSpec::FULL],
            prefill_limits: PrefillLimits::NONE,
        }
    }

    /// Tokens the whole cache can hold.
    pub fn capacity_tokens(&self) -> usize {
        self.num_blocks.saturating_mul(self.block_size)
    }

    /// Fewest blocks that let one request of `max_model_len` tokens run alone, in every KV cache group at once: a
    /// full group holds the whole context (`ceil(max_model_len / block_size)`); a sliding group holds what a step's
    /// queries read, its window plus the step's chunk (`ceil(min(window - 1 + chunk, max_model_len) / block_size) + 1`,
    /// at most the full count, with `chunk = min(max_num_batched_tokens, max_model_len)`, as vLLM's sliding-window
    /// spec; `KvGroupSpec::blocks_held(max_model_len)` alone is not enough while a prefill chunk is computed); plus
    /// the reserved null block when any group slides. For one full group: `ceil(max_model_len / block_size)`.
    pub fn min_num_blocks(&self) -> usize {
        let groups: usize = self
            .kv_groups
            .iter()
            .map(|g| g.max_blocks(self.max_model_len, self.block_size, self.max_num_batched_tokens))
            .sum();
        groups + usize::from(self.kv_groups.iter().any(|g| g.window.is_some()))
    }

    /// Checks every rule; the first broken one is returned.
    pub fn validate(&self) -> Result<(), SchedulerError> {
        for (field, value) in [
            ("block_size", self.block_size),
            ("num_blocks", self.num_blocks),
            ("max_num_seqs", self.max_num_seqs),
            ("max_num_batched_tokens", self.max_num_batched_tokens),
            ("max_model_len", self.max_model_len),
        ] {
            if value == 0 {
                return Err(SchedulerError::ZeroConfigValue { field });
            }
        }
        if self.max_num_batched_tokens < self.max_num_seqs {
            return Err(SchedulerError::BatchBudgetBelowMaxSeqs {
                max_num_batched_tokens: self.max_num_batched_tokens,
                max_num_seqs: self.max_num_seqs,
            });
        }
        if self.kv_groups.is_empty() {
            return Err(SchedulerError::NoKvGroups);
        }
        if let Some(group) = self.kv_groups.iter().position(|g| g.window == Some(0)) {
            return Err(SchedulerError::ZeroSlidingWindow { group });
        }
        let max_slots = u64::from(u32::MAX);
        let slots = (self.num_blocks as u128) * (self.block_size as u128);
        if slots > u128::from(max_slots) {
            return Err(SchedulerError::TooManySlots {
                num_blocks: self.num_blocks,
                block_size: self.block_size,
                max_slots,
            });
        }
        // A full group holds the whole context (sliding-only models are checked by the group rule below).
        if self.kv_groups.iter().any(|g| g.window.is_none()) && self.capacity_tokens() < self.max_model_len {
            return Err(SchedulerError::CacheSmallerThanModelLen {
                num_blocks: self.num_blocks,
                block_size: self.block_size,
                capacity_tokens: self.capacity_tokens(),
                max_model_len: self.max_model_len,
            });
        }
        self.prefill_limits.validate(self.max_model_len)?;
        let blocks_needed = self.min_num_blocks();
        if self.num_blocks < blocks_needed {
            return Err(SchedulerError::CacheSmallerThanKvGroups {
                num_blocks: self.num_blocks,
                blocks_needed,
                block_size: self.block_size,
                max_model_len: self.max_model_len,
                num_groups: self.kv_groups.len(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_shape_is_valid() {
        let cfg = SchedulerConfig::new(64, 1024);
        assert_eq!(cfg.block_size, 16);
        assert!(cfg.enable_prefix_caching);
        assert_eq!(cfg.validate(), Ok(()));
    }

    #[test]
    fn each_rule_is_reported() {
        let mut cfg = SchedulerConfig::new(64, 1024);
        cfg.block_size = 0;
        assert_eq!(cfg.validate(), Err(SchedulerError::ZeroConfigValue { field: "block_size" }));

        let mut cfg = SchedulerConfig::new(64, 1024);
        cfg.max_num_seqs = 300;
        cfg.max_num_batched_tokens = 299;
        assert!(matches!(cfg.validate(), Err(SchedulerError::BatchBudgetBelowMaxSeqs { .. })));

        let cfg = SchedulerConfig::new(63, 1024 - 15);
        assert!(matches!(cfg.validate(), Err(SchedulerError::CacheSmallerThanModelLen { capacity_tokens: 1008, .. })));

        let mut cfg = SchedulerConfig::new(64, 1024);
        cfg.kv_groups.clear();
        assert_eq!(cfg.validate(), Err(SchedulerError::NoKvGroups));
        cfg.kv_groups = vec![KvGroupSpec::FULL, KvGroupSpec::sliding(0)];
        assert_eq!(cfg.validate(), Err(SchedulerError::ZeroSlidingWindow { group: 1 }));

        let mut cfg = SchedulerConfig::new(1 << 29, 1024);
        cfg.block_size = 8;
        assert!(matches!(cfg.validate(), Err(SchedulerError::TooManySlots { .. })));
        let msg = cfg.validate().unwrap_err().to_string();
        assert!(msg.contains("num_blocks") && msg.contains("block_size"), "{msg}");
    }

    #[test]
    fn sliding_groups_need_their_window_chunk_and_the_null_block() {
        // 1024 tokens in blocks of 16: a full group holds 64 blocks.
        let mut cfg = SchedulerConfig::new(64, 1024);
        assert_eq!(cfg.min_num_blocks(), 64);
        // Window 32 and chunks of 64: ceil((31 + 64) / 16) + 1 = 7 blocks, plus the null block.
        cfg.max_num_batched_tokens = 64;
        cfg.max_num_seqs = 64;
        cfg.kv_groups = vec![KvGroupSpec::FULL, KvGroupSpec::sliding(32)];
        assert_eq!(cfg.min_num_blocks(), 64 + 7 + 1);
        let err = cfg.validate().unwrap_err();
        assert_eq!(
            err,
            SchedulerError::CacheSmallerThanKvGroups {
                num_blocks: 64,
                blocks_needed: 72,
                block_size: 16,
                max_model_len: 1024,
                num_groups: 2
            }
        );
        assert!(err.to_string().contains("72 blocks"), "{err}");
        cfg.num_blocks = 72;
        assert_eq!(cfg.validate(), Ok(()));
        // A window as long as the context holds everything: never more than the full count.
        cfg.kv_groups = vec![KvGroupSpec::sliding(4096)];
        assert_eq!(cfg.min_num_blocks(), 64 + 1);
    }
}
