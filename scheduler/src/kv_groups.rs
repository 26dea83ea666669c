//! KV cache groups: layers whose attention keeps the same keys share one block table per request (vLLM v1's hybrid
//! KV cache manager). A model with only global attention has one full group; a model with sliding-window layers has
//! groups of those too, and a request holds in them only the blocks its window can still read: blocks that fall
//! entirely before the window are returned to the pool and their table entries point at the reserved null block.
//!
//! Every group has the same number of layers (the engine pads the last group of a kind), so a block is the same
//! size in every group and all groups allocate from one [`crate::BlockPool`]; the engine lays the cache out as one
//! tensor per layer slot of a group, shared by the groups (a block belongs to one group at a time).

use crate::ids::BlockId;

/// The reserved block that the entries of a sliding-window group before its window point at (never handed out,
/// never read: the attention kernels start at the window). Reserved only when the pool serves a sliding group.
pub const NULL_BLOCK: BlockId = BlockId(0);

/// What one KV cache group's attention keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KvGroupSpec {
    /// Sliding window in tokens (a query sees itself and the `window - 1` tokens before it); `None`: global.
    pub window: Option<usize>,
}

impl KvGroupSpec {
    /// A group of global-attention layers.
    pub const FULL: KvGroupSpec = KvGroupSpec { window: None };

    /// A group of sliding-window layers.
    pub fn sliding(window: usize) -> Self {
        KvGroupSpec { window: Some(window) }
    }

    /// The first block a query at `position` reads (0 for global attention).
    pub fn first_needed_block(&self, position: usize, block_size: usize) -> usize {
        match self.window {
            Some(w) => (position + 1).saturating_sub(w) / block_size,
            None => 0,
        }
    }

    /// The most blocks one request of up to `max_model_len` tokens holds in this group at any step, with prefill
    /// chunks of up to `max_num_batched_tokens`: every block for global attention; for a window, what a step's
    /// queries read (the window before its first query plus the chunk, and the block being filled), as vLLM's
    /// sliding-window spec counts it.
    pub fn max_blocks(&self, max_model_len: usize, block_size: usize, max_num_batched_tokens: usize) -> usize {
        let bs = block_size.max(1);
        let full = max_model_len.div_ceil(bs);
        match self.window {
            None => full,
            Some(w) => {
                let chunk = max_num_batched_tokens.min(max_model_len);
                let tokens = w.saturating_sub(1).saturating_add(chunk).min(max_model_len);
                (tokens.div_ceil(bs) + 1).min(full)
            }
        }
    }

    /// Blocks one request of `num_tokens` tokens holds in this group once its earlier blocks are freed: all of them
    /// for global attention; for a window, the blocks from the one its last query reads on, and never more than a
    /// window's worth plus the block being filled.
    pub fn blocks_held(&self, num_tokens: usize, block_size: usize) -> usize {
        let all = num_tokens.div_ceil(block_size);
        match num_tokens.checked_sub(1) {
            Some(last) => all - self.first_needed_block(last, block_size),
            None => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_holds_its_blocks_and_the_one_being_filled() {
        let w = KvGroupSpec::sliding(16);
        // 16-token blocks: the last query at 127 reads keys 112..=127, block 7 only.
        assert_eq!(w.first_needed_block(127, 16), 7);
        assert_eq!(w.blocks_held(128, 16), 1);
        // At 129 tokens the last query (128) reads 113..=128: blocks 7 and 8.
        assert_eq!(w.blocks_held(129, 16), 2);
        assert_eq!(w.blocks_held(10, 16), 1);
        assert_eq!(w.blocks_held(0, 16), 0);
        assert_eq!(KvGroupSpec::FULL.blocks_held(129, 16), 9);
        // A window of 4096 over blocks of 16 never holds more than 257 blocks.
        let big = KvGroupSpec::sliding(4096);
        assert!((4096..40_000).all(|n| big.blocks_held(n, 16) <= 257));
    }
}
