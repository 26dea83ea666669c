//! `BlockHasher`: computes the prefix-cache key of each full block, a hash chained over the parent block's hash and
//! the block's token ids.
//!
//! The hash is keyed SipHash from the standard library with a key drawn once per hasher (per scheduler), so users
//! cannot craft prompts whose blocks collide with another request's blocks. Keys are 64 bits: the chance that any two
//! of `n` distinct cached blocks collide is about `n^2 / 2^65` (below 1e-7 for a million blocks).

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

use crate::ids::{BlockHash, TokenId};

/// Hashes full blocks of token ids into [`BlockHash`]es.
#[derive(Debug, Clone, Default)]
pub struct BlockHasher {
    state: RandomState,
}

impl BlockHasher {
    /// A hasher with a fresh random key.
    pub fn new() -> Self {
        Self { state: RandomState::new() }
    }

    /// The key of a block holding `tokens` whose preceding block has key `parent` (`None` for the first block).
    pub fn hash_block(&self, parent: Option<BlockHash>, tokens: &[TokenId]) -> BlockHash {
        let mut h = self.state.build_hasher();
        match parent {
            Some(p) => {
                h.write_u8(1);
                h.write_u64(p.0);
            }
            None => h.write_u8(0),
        }
        h.write_usize(tokens.len());
        // Two tokens per word halves the hasher calls; the length written above keeps the encoding unambiguous.
        let mut pairs = tokens.chunks_exact(2);
        for pair in &mut pairs {
            h.write_u64(u64::from(pair[0].0) | (u64::from(pair[1].0) << 32));
        }
        if let [last] = pairs.remainder() {
            h.write_u32(last.0);
        }
        BlockHash(h.finish())
    }

    /// The prefix-cache key of the block with key `hash` in KV cache group `group`: `hash` itself in group 0 (so a
    /// one-group model keeps its keys), a keyed rehash in the others, so that the same token block never shares a
    /// cache entry across groups (each group keeps its own KV for it, in its own block).
    pub fn group_key(&self, hash: BlockHash, group: usize) -> BlockHash {
        if group == 0 {
            return hash;
        }
        let mut h = self.state.build_hasher();
        // Tag 2: block keys start with tag 0 or 1, so a group key never equals a block key by construction.
        h.write_u8(2);
        h.write_u64(hash.0);
        h.write_usize(group);
        BlockHash(h.finish())
    }

    /// Extends `hashes` (the keys of the first `hashes.len()` blocks of `tokens`) so that it holds one key per full
    /// block of `tokens`. Only the blocks not hashed yet are hashed.
    pub fn extend_hashes(&self, hashes: &mut Vec<BlockHash>, tokens: &[TokenId], block_size: usize) {
        if block_size == 0 {
            return;
        }
        let num_full = tokens.len() / block_size;
        while hashes.len() < num_full {
            let i = hashes.len();
            let parent = hashes.last().copied();
            let h = self.hash_block(parent, &tokens[i * block_size..(i + 1) * block_size]);
            hashes.push(h);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ids: &[u32]) -> Vec<TokenId> {
        ids.iter().copied().map(TokenId).collect()
    }

    #[test]
    fn chained_hash_depends_on_parent_and_tokens() {
        let h = BlockHasher::new();
        let a = h.hash_block(None, &t(&[1, 2, 3, 4]));
        assert_eq!(a, h.hash_block(None, &t(&[1, 2, 3, 4])));
        assert_ne!(a, h.hash_block(None, &t(&[1, 2, 3, 5])));
        let b1 = h.hash_block(Some(a), &t(&[5, 6, 7, 8]));
        let other_parent = h.hash_block(None, &t(&[9, 9, 9, 9]));
        assert_ne!(b1, h.hash_block(Some(other_parent), &t(&[5, 6, 7, 8])));
        assert_ne!(b1, h.hash_block(None, &t(&[5, 6, 7, 8])));
    }

    #[test]
    fn group_keys_differ_per_group_and_keep_group_zero() {
        let h = BlockHasher::new();
        let k = h.hash_block(None, &t(&[1, 2, 3, 4]));
        assert_eq!(h.group_key(k, 0), k);
        assert_ne!(h.group_key(k, 1), k);
        assert_ne!(h.group_key(k, 1), h.group_key(k, 2));
        assert_eq!(h.group_key(k, 1), h.group_key(k, 1));
    }

    #[test]
    fn extend_hashes_covers_full_blocks_only_and_is_incremental() {
        let h = BlockHasher::new();
        let tokens: Vec<TokenId> = (0..10).map(TokenId).collect();
        let mut hashes = Vec::new();
        h.extend_hashes(&mut hashes, &tokens[..7], 4);
        assert_eq!(hashes.len(), 1);
        h.extend_hashes(&mut hashes, &tokens, 4);
        assert_eq!(hashes.len(), 2);
        let mut fresh = Vec::new();
        h.extend_hashes(&mut fresh, &tokens, 4);
        assert_eq!(hashes, fresh);
        assert_eq!(hashes[1], h.hash_block(Some(hashes[0]), &tokens[4..8]));
    }
}
