//! `BlockPool`: owns the fixed set of physical KV blocks, their reference counts, the free queue and the prefix cache
//! (`BlockHash -> BlockId`).
//!
//! Invariants (checked by [`BlockPool::check_invariants`]):
//! - a block is in the free queue exactly when its reference count is 0, so `free + used == total`;
//! - every prefix-cache entry points at a block that carries that hash; a block carries at most one hash;
//! - reference counts are never decremented below 0 (checked arithmetic; a double free is a bug caught in debug
//!   builds and ignored in release builds).
//!
//! Eviction: a freed block keeps its hash and stays in the prefix cache while it waits in the free queue. Freed blocks
//! without a hash go to the head of the queue (reused first, nothing is lost); freed cached blocks go to the tail, so
//! cached blocks are evicted least-recently-used, only when a new block is needed. A cache hit on a free block takes
//! it out of the queue.

use crate::free_queue::FreeQueue;
use crate::id_map::IdMap;
use crate::ids::{BlockHash, BlockId};

/// The physical KV blocks and their bookkeeping.
#[derive(Debug, Clone)]
pub struct BlockPool {
    ref_cnt: Vec<u32>,
    hash: Vec<Option<BlockHash>>,
    free: FreeQueue,
    cached: IdMap<BlockHash, BlockId>,
    enable_caching: bool,
}

impl BlockPool {
    /// A pool of `num_blocks` free blocks (`num_blocks < u32::MAX`).
    pub fn new(num_blocks: usize, enable_caching: bool) -> Self {
        Self {
            ref_cnt: vec![0; num_blocks],
            hash: vec![None; num_blocks],
            free: FreeQueue::new_full(num_blocks),
            cached: IdMap::default(),
            enable_caching,
        }
    }

    /// Total number of blocks.
    pub fn num_blocks(&self) -> usize {
        self.ref_cnt.len()
    }

    /// Blocks nobody references, including cached blocks that wait for reuse.
    pub fn num_free_blocks(&self) -> usize {
        self.free.len()
    }

    /// Blocks referenced by at least one request.
    pub fn num_used_blocks(&self) -> usize {
        self.num_blocks() - self.free.len()
    }

    /// Blocks currently registered in the prefix cache (in use or free).
    pub fn num_cached_blocks(&self) -> usize {
        self.cached.len()
    }

    /// Whether prefix caching is on.
    pub fn caching_enabled(&self) -> bool {
        self.enable_caching
    }

    /// Number of requests referencing `block` (0 for an unknown block).
    pub fn ref_count(&self, block: BlockId) -> u32 {
        self.ref_cnt.get(block.index()).copied().unwrap_or(0)
    }

    /// The prefix-cache key `block` carries, if it is cached.
    pub fn block_hash(&self, block: BlockId) -> Option<BlockHash> {
        self.hash.get(block.index()).copied().flatten()
    }

    /// The cached block holding the full block with key `hash`.
    pub fn get_cached(&self, hash: BlockHash) -> Option<BlockId> {
        if !self.enable_caching {
            return None;
        }
        self.cached.get(&hash).copied()
    }

    /// Free blocks in the order they would be handed out (least recently used first).
    pub fn free_blocks(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.free.iter().map(BlockId)
    }

    /// Takes `n` blocks from the head of the free queue, evicting their cached hashes; each gets reference count 1.
    /// Returns `None` (and changes nothing) when fewer than `n` blocks are free.
    pub fn allocate(&mut self, n: usize) -> Option<Vec<BlockId>> {
        let mut out = Vec::with_capacity(n);
        self.allocate_into(n, &mut out).then_some(out)
    }

    /// Like [`BlockPool::allocate`], appending to `out`; returns false (and changes nothing) when too few are free.
    pub fn allocate_into(&mut self, n: usize, out: &mut Vec<BlockId>) -> bool {
        if n > self.free.len() {
            return false;
        }
        out.reserve(n);
        for _ in 0..n {
            let Some(b) = self.free.pop_front() else {
                debug_assert!(false, "free queue shorter than its length");
                return false;
            };
            let block = BlockId(b);
            let i = block.index();
            if let Some(h) = self.hash[i].take() {
                if self.cached.get(&h) == Some(&block) {
                    self.cached.remove(&h);
                }
            }
            debug_assert_eq!(self.ref_cnt[i], 0, "free block {block} has references");
            self.ref_cnt[i] = 1;
            out.push(block);
        }
        true
    }

    /// Adds one reference to each block (a prefix-cache hit); a free block leaves the free queue.
    pub fn touch(&mut self, blocks: &[BlockId]) {
        for &block in blocks {
            let i = block.index();
            if self.ref_cnt[i] == 0 {
                self.free.remove(block.0);
            }
            self.ref_cnt[i] = self.ref_cnt[i].saturating_add(1);
        }
    }

    /// Drops one reference from each block. Blocks whose count reaches 0 join the free queue: uncached ones at the head,
    /// cached ones at the tail in the given order, so pass blocks in the order they should be evicted.
    pub fn free(&mut self, blocks: impl IntoIterator<Item = BlockId>) {
        for block in blocks {
            let i = block.index();
            let Some(rc) = self.ref_cnt.get(i).copied() else {
                debug_assert!(false, "free of unknown block {block}");
                continue;
            };
            match rc.checked_sub(1) {
                Some(0) => {
                    self.ref_cnt[i] = 0;
                    if self.hash[i].is_some() {
                        self.free.push_back(block.0);
                    } else {
                        self.free.push_front(block.0);
                    }
                }
                Some(n) => self.ref_cnt[i] = n,
                None => debug_assert!(false, "double free of {block}"),
            }
        }
    }

    /// Registers the in-use, full `block` under `hash`. Does nothing (returns false) when caching is off, the block is
    /// already cached, or another block already holds `hash` (the duplicate stays private to its request).
    pub fn cache_block(&mut self, block: BlockId, hash: BlockHash) -> bool {
        if !self.enable_caching {
            return false;
        }
        let i = block.index();
        debug_assert!(self.ref_cnt.get(i).is_some_and(|&rc| rc > 0), "caching unreferenced block {block}");
        if self.hash[i].is_some() || self.cached.contains_key(&hash) {
            return false;
        }
        self.hash[i] = Some(hash);
        self.cached.insert(hash, block);
        true
    }

    /// Forgets the prefix-cache key of every block no request references (`POST /reset_prefix_cache`): those blocks
    /// stay free, now uncached at the head of the free queue, so no later request hits them. Blocks in use keep their
    /// keys. Returns how many cached blocks were dropped.
    pub fn reset_prefix_cache(&mut self) -> usize {
        let free: Vec<u32> = self.free.iter().collect();
        let mut dropped = 0;
        for b in free {
            let i = b as usize;
            if let Some(h) = self.hash[i].take() {
                if self.cached.get(&h) == Some(&BlockId(b)) {
                    self.cached.remove(&h);
                }
                self.free.remove(b);
                self.free.push_front(b);
                dropped += 1;
            }
        }
        dropped
    }

    /// Checks the pool's invariants; the error says which one broke.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut queued = vec![false; self.num_blocks()];
        for b in self.free.iter() {
            let i = b as usize;
            if queued[i] {
                return Err(format!("block {b} twice in the free queue"));
            }
            queued[i] = true;
            if self.ref_cnt[i] != 0 {
                return Err(format!("block {b} is free but has {} references", self.ref_cnt[i]));
            }
        }
        let zero = self.ref_cnt.iter().filter(|&&rc| rc == 0).count();
        if zero != self.free.len() {
            return Err(format!("{zero} blocks have no references but {} are queued as free", self.free.len()));
        }
        for (h, b) in &self.cached {
            if self.hash[b.index()] != Some(*h) {
                return Err(format!("cache entry {h} -> {b} but the block carries {:?}", self.hash[b.index()]));
            }
        }
        let carrying = self.hash.iter().filter(|h| h.is_some()).count();
        if carrying != self.cached.len() {
            return Err(format!("{carrying} blocks carry a hash but the cache has {} entries", self.cached.len()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[u32]) -> Vec<BlockId> {
        v.iter().map(|&b| BlockId(b)).collect()
    }

    #[test]
    fn allocate_fails_without_side_effects() {
        let mut pool = BlockPool::new(4, true);
        let a = pool.allocate(3).expect("3 of 4 free");
        assert_eq!(pool.allocate(2), None);
        assert_eq!(pool.num_free_blocks(), 1);
        pool.free(a);
        assert_eq!(pool.num_free_blocks(), 4);
        pool.check_invariants().unwrap();
    }

    #[test]
    fn shared_block_is_freed_after_last_reference() {
        let mut pool = BlockPool::new(2, true);
        let a = pool.allocate(1).unwrap();
        pool.touch(&a);
        assert_eq!(pool.ref_count(a[0]), 2);
        pool.free(a.clone());
        assert_eq!(pool.num_free_blocks(), 1);
        pool.free(a.clone());
        assert_eq!(pool.num_free_blocks(), 2);
        assert_eq!(pool.ref_count(a[0]), 0);
        pool.check_invariants().unwrap();
    }

    #[test]
    fn cached_free_blocks_are_evicted_least_recently_used() {
        let mut pool = BlockPool::new(4, true);
        let blocks = pool.allocate(4).unwrap();
        for (k, &b) in blocks.iter().enumerate() {
            assert!(pool.cache_block(b, BlockHash(100 + k as u64)));
        }
        // Free in the order 2, 0, 3, 1: that is the order they become least recently used.
        for b in [2, 0, 3, 1] {
            pool.free([BlockId(b)]);
        }
        assert_eq!(pool.num_free_blocks(), 4);
        assert_eq!(pool.num_cached_blocks(), 4, "freed blocks stay cached");
        // A hit on block 0 takes it out of the queue; freeing it again makes it the most recently used.
        assert_eq!(pool.get_cached(BlockHash(100)), Some(BlockId(0)));
        pool.touch(&[BlockId(0)]);
        pool.free([BlockId(0)]);
        assert_eq!(pool.free_blocks().collect::<Vec<_>>(), ids(&[2, 3, 1, 0]));

        let got = pool.allocate(2).unwrap();
        assert_eq!(got, ids(&[2, 3]));
        assert_eq!(pool.get_cached(BlockHash(102)), None, "evicted");
        assert_eq!(pool.get_cached(BlockHash(103)), None, "evicted");
        assert_eq!(pool.get_cached(BlockHash(101)), Some(BlockId(1)), "still cached");
        assert_eq!(pool.get_cached(BlockHash(100)), Some(BlockId(0)), "still cached");
        assert_eq!(pool.block_hash(BlockId(2)), None);
        pool.check_invariants().unwrap();
    }

    #[test]
    fn uncached_blocks_are_reused_before_cached_ones() {
        let mut pool = BlockPool::new(3, true);
        let blocks = pool.allocate(3).unwrap();
        assert!(pool.cache_block(blocks[0], BlockHash(7)));
        pool.free(blocks.clone());
        assert_eq!(pool.allocate(2).unwrap(), ids(&[2, 1]));
        assert_eq!(pool.get_cached(BlockHash(7)), Some(BlockId(0)));
        pool.check_invariants().unwrap();
    }

    #[test]
    fn reset_prefix_cache_drops_exactly_the_unreferenced_cached_blocks() {
        let mut pool = BlockPool::new(6, true);
        let held = pool.allocate(2).unwrap();
        let freed = pool.allocate(3).unwrap();
        for (k, &b) in held.iter().chain(&freed).enumerate() {
            assert!(pool.cache_block(b, BlockHash(100 + k as u64)));
        }
        // One freed block never got a hash: it is free before and after, and not counted.
        let plain = pool.allocate(1).unwrap();
        pool.free(freed.iter().copied().chain(plain.iter().copied()));
        assert_eq!(pool.num_cached_blocks(), 5);

        assert_eq!(pool.reset_prefix_cache(), 3);
        pool.check_invariants().unwrap();
        assert_eq!(pool.num_cached_blocks(), 2, "blocks in use keep their keys");
        for (k, &b) in held.iter().enumerate() {
            assert_eq!(pool.get_cached(BlockHash(100 + k as u64)), Some(b));
            assert_eq!(pool.ref_count(b), 1);
        }
        for (k, &b) in freed.iter().enumerate() {
            assert_eq!(pool.get_cached(BlockHash(102 + k as u64)), None);
            assert_eq!(pool.block_hash(b), None);
        }
        assert_eq!(pool.num_free_blocks(), 4);
        assert_eq!(pool.reset_prefix_cache(), 0, "nothing left to drop");
    }

    #[test]
    fn duplicate_hash_and_disabled_cache_are_not_registered() {
        let mut pool = BlockPool::new(3, true);
        let b = pool.allocate(2).unwrap();
        assert!(pool.cache_block(b[0], BlockHash(1)));
        assert!(!pool.cache_block(b[1], BlockHash(1)));
        assert!(!pool.cache_block(b[0], BlockHash(2)));
        assert_eq!(pool.get_cached(BlockHash(1)), Some(b[0]));

        let mut off = BlockPool::new(2, false);
        let b = off.allocate(1).unwrap();
        assert!(!off.cache_block(b[0], BlockHash(1)));
        assert_eq!(off.get_cached(BlockHash(1)), None);
        pool.check_invariants().unwrap();
        off.check_invariants().unwrap();
    }
}
