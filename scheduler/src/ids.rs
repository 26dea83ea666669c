//! Newtype ids that travel between the scheduler, the engine and the model runner: `RequestId`, `BlockId`,
//! `TokenId` and the prefix-cache key `BlockHash`.
//!
//! Token ids, token counts, positions, slots and block ids are all small integers; as bare `u32`/`usize` they mix
//! silently. Where one of them crosses a crate boundary (scheduler -> engine -> server) it is a newtype, so the
//! compiler tells them apart. Inside a crate, kernels, device uploads and math may use the bare number (`.0`).

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

/// One token of the model's vocabulary (an index `0..vocab_size`), as prompts, sampled tokens, stop tokens and
/// logit biases carry it between the scheduler, the engine and the server. A newtype so that ids cannot be mixed up
/// with token counts, positions, slots or block ids; `.0` is the raw id for kernels, embeddings and wire formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(transparent)]
pub struct TokenId(pub u32);

impl TokenId {
    /// A token the scheduler has scheduled to be computed before its id is known: the id the step before samples,
    /// which the runner feeds from that step's device output (async scheduling). Never a vocabulary id.
    pub const PLACEHOLDER: TokenId = TokenId(u32::MAX);
}

impl From<u32> for TokenId {
    #[inline]
    fn from(id: u32) -> Self {
        TokenId(id)
    }
}

impl From<TokenId> for u32 {
    #[inline]
    fn from(id: TokenId) -> Self {
        id.0
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

/// The bare number, as the HTTP API and logs show token ids.
impl fmt::Display for TokenId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}
