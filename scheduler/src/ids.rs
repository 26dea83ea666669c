//! Newtype ids that travel between the scheduler, the engine and the model runner: `RequestId`, `BlockId` and the
//! prefix-cache key `BlockHash`.

use std::fmt;

/// Identifies one generation request for its whole life (waiting, running, preempted, finished).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

/// Index of one physical KV-cache block (`0..num_blocks`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(pub u32);

impl BlockId {
    /// `n` consecutive ids from `first` (a block table for runners driven without a scheduler).
    pub fn run(first: u32, n: usize) -> Vec<BlockId> {
        (first..first + n as u32).map(BlockId).collect()
    }

    /// The block's index into per-block arrays.
    #[inline]
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Prefix-cache key of one full block: a hash chained over the parent block's hash and the block's token ids, so
/// equal hashes mean (up to a 64-bit collision) equal token prefixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub u64);

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "req-{}", self.0)
    }
}

impl fmt::Display for BlockId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "block-{}", self.0)
    }
}

impl fmt::Display for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}
