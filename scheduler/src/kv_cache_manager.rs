//! `KvCacheManager`: maps each request to its block table over the [`BlockPool`], finds the cached prefix of a new
//! request, allocates blocks for the tokens a step computes, registers blocks in the prefix cache once they are full
//! and computed, and frees a request's blocks.
//!
//! Invariant: the reference count of every block equals the number of block tables holding it (checked by
//! [`KvCacheManager::check_invariants`]). Boundary: this type knows tokens only through [`Request`]; it never decides
//! who runs (that is the scheduler's job).

use std::collections::hash_map::Entry;

use crate::block_hash::BlockHasher;
use crate::block_pool::BlockPool;
use crate::id_map::IdMap;
use crate::ids::{BlockId, RequestId};
use crate::request::Request;

/// A request's blocks.
#[derive(Debug, Clone, Default)]
struct RequestBlocks {
    blocks: Vec<BlockId>,
    /// The first `num_cached_blocks` blocks are registered in (or came from) the prefix cache.
    num_cached_blocks: usize,
}

/// Block tables of all requests that hold blocks, over one block pool.
#[derive(Debug, Clone)]
pub struct KvCacheManager {
    pool: BlockPool,
    block_size: usize,
    hasher: BlockHasher,
    tables: IdMap<RequestId, RequestBlocks>,
}

impl KvCacheManager {
    /// A manager over `num_blocks` blocks of `block_size` slots.
    pub fn new(num_blocks: usize, block_size: usize, enable_prefix_caching: bool) -> Self {
        Self {
            pool: BlockPool::new(num_blocks, enable_prefix_caching),
            block_size,
            hasher: BlockHasher::new(),
            tables: IdMap::default(),
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The underlying pool (read-only).
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    pub fn caching_enabled(&self) -> bool {
        self.pool.caching_enabled()
    }

    /// Brings `req`'s block hashes up to date with its tokens (only full blocks are hashed; nothing when caching is off).
    pub fn update_block_hashes(&self, req: &mut Request) {
        if self.caching_enabled() {
            self.hasher.extend_hashes(&mut req.block_hashes, &req.token_ids, self.block_size);
        }
    }

    /// The longest run of cached full blocks that prefixes `req`'s tokens, and the number of tokens they hold. At
    /// least one token is always left to compute (the runner needs it to sample), so a fully cached sequence hits one
    /// block less. The blocks are not referenced yet: pass them to [`KvCacheManager::allocate_slots`].
    pub fn get_computed_blocks(&self, req: &Request) -> (Vec<BlockId>, usize) {
        if !self.caching_enabled() || req.num_tokens() == 0 {
            return (Vec::new(), 0);
        }
        let max_blocks = ((req.num_tokens() - 1) / self.block_size).min(req.block_hashes.len());
        let mut blocks = Vec::new();
        for &h in &req.block_hashes[..max_blocks] {
            match self.pool.get_cached(h) {
                Some(b) => blocks.push(b),
                None => break,
            }
        }
        let num_tokens = blocks.len() * self.block_size;
        (blocks, num_tokens)
    }

    /// Makes room for `num_new_tokens` more tokens of `req` after its `num_computed_tokens` plus the tokens of
    /// `new_computed_blocks` (cache hits from [`KvCacheManager::get_computed_blocks`], only for a request that holds
    /// no blocks yet; hits for a request that holds blocks are refused with `None`). Returns the request's block
    /// table, or `None` when the pool has too few free blocks, in which case nothing changed.
    pub fn allocate_slots(
        &mut self,
        req: &Request,
        num_new_tokens: usize,
        new_computed_blocks: &[BlockId],
    ) -> Option<&[BlockId]> {
        let bs = self.block_size;
        let free_blocks = self.pool.num_free_blocks();
        let pool = &mut self.pool;
        match self.tables.entry(req.id) {
            Entry::Occupied(e) => {
                let entry = e.into_mut();
                debug_assert!(new_computed_blocks.is_empty(), "cache hits for a request holding blocks");
                if !new_computed_blocks.is_empty() {
                    return None;
                }
                let required = (req.num_computed_tokens + num_new_tokens).div_ceil(bs);
                let num_new_blocks = required.saturating_sub(entry.blocks.len());
                if num_new_blocks > free_blocks {
                    return None;
                }
                if num_new_blocks > 0 {
                    let ok = pool.allocate_into(num_new_blocks, &mut entry.blocks);
                    debug_assert!(ok, "allocation checked above");
                }
                Some(&entry.blocks)
            }
            Entry::Vacant(v) => {
                let num_hits = new_computed_blocks.len();
                let required = (req.num_computed_tokens + num_hits * bs + num_new_tokens).div_ceil(bs);
                let num_new_blocks = required.saturating_sub(num_hits);
                // Hits on free cached blocks take them out of the free queue, so they count against the free blocks.
                let evictable_hits = new_computed_blocks.iter().filter(|&&b| pool.ref_count(b) == 0).count();
                if num_new_blocks + evictable_hits > free_blocks {
                    return None;
                }
                // Touch the hits before allocating so that allocation cannot evict them.
                pool.touch(new_computed_blocks);
                let mut blocks = Vec::with_capacity(required);
                blocks.extend_from_slice(new_computed_blocks);
                let ok = pool.allocate_into(num_new_blocks, &mut blocks);
                debug_assert!(ok, "allocation checked above");
                let entry = v.insert(RequestBlocks { blocks, num_cached_blocks: num_hits });
                Some(&entry.blocks)
            }
        }
    }

    /// Registers `req`'s blocks that are full and computed (`num_computed_tokens`) in the prefix cache. Call it after
    /// the step that computed them ran, so that no request can hit a block before its KV is written.
    pub fn cache_computed_blocks(&mut self, req: &Request) {
        if !self.caching_enabled() {
            return;
        }
        let Some(entry) = self.tables.get_mut(&req.id) else {
            return;
        };
        let num_full = (req.num_computed_tokens / self.block_size).min(req.block_hashes.len()).min(entry.blocks.len());
        for i in entry.num_cached_blocks..num_full {
            self.pool.cache_block(entry.blocks[i], req.block_hashes[i]);
        }
        entry.num_cached_blocks = entry.num_cached_blocks.max(num_full);
    }

    /// Frees all blocks of `id`, last block first so that a sequence's tail is evicted before its shared prefix.
    /// Returns false when the request held no blocks.
    pub fn free(&mut self, id: RequestId) -> bool {
        match self.tables.remove(&id) {
            Some(entry) => {
                self.pool.free(entry.blocks.into_iter().rev());
                true
            }
            None => false,
        }
    }

    /// Drops the prefix-cache keys of the blocks no request holds ([`BlockPool::reset_prefix_cache`]); returns how many.
    pub fn reset_prefix_cache(&mut self) -> usize {
        self.pool.reset_prefix_cache()
    }

    /// The block table of `id`, if it holds blocks.
    pub fn block_table(&self, id: RequestId) -> Option<&[BlockId]> {
        self.tables.get(&id).map(|t| t.blocks.as_slice())
    }

    /// Number of requests holding a block table.
    pub fn num_tables(&self) -> usize {
        self.tables.len()
    }

    pub fn num_blocks(&self) -> usize {
        self.pool.num_blocks()
    }

    /// Free blocks, cached ones included.
    pub fn num_free_blocks(&self) -> usize {
        self.pool.num_free_blocks()
    }

    pub fn num_used_blocks(&self) -> usize {
        self.pool.num_used_blocks()
    }

    /// Checks the pool's invariants and that every reference count equals the number of tables holding the block.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.pool.check_invariants()?;
        let mut holders = vec![0u32; self.pool.num_blocks()];
        for (id, t) in &self.tables {
            for b in &t.blocks {
                let Some(h) = holders.get_mut(b.index()) else {
                    return Err(format!("{id} holds unknown block {b}"));
                };
                *h += 1;
            }
            if t.num_cached_blocks > t.blocks.len() {
                return Err(format!("{id}: {} cached blocks of {}", t.num_cached_blocks, t.blocks.len()));
            }
        }
        for (i, &n) in holders.iter().enumerate() {
            let b = BlockId(i as u32);
            if self.pool.ref_count(b) != n {
                return Err(format!("{b} has ref count {} but {n} tables hold it", self.pool.ref_count(b)));
            }
        }
        let used = holders.iter().filter(|&&n| n > 0).count();
        if used + self.pool.num_free_blocks() != self.pool.num_blocks() {
            return Err(format!(
                "{used} used + {} free != {} blocks",
                self.pool.num_free_blocks(),
                self.pool.num_blocks()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::TokenId;
    use crate::request::NewRequest;

    fn request(id: u64, tokens: Vec<u32>, mgr: &KvCacheManager) -> Request {
        let new = NewRequest {
            id: RequestId(id),
            prompt_token_ids: tokens.into_iter().map(TokenId).collect(),
            max_tokens: 8,
            min_tokens: 0,
            stop_token_ids: vec![],
        };
        let mut r = Request::new(new, 1 << 20).unwrap();
        mgr.update_block_hashes(&mut r);
        r
    }

    #[test]
    fn shared_prefix_hits_full_blocks_only() {
        let mut mgr = KvCacheManager::new(16, 4, true);
        let a = request(1, (0..10).collect(), &mgr);
        assert_eq!(mgr.get_computed_blocks(&a), (vec![], 0));
        let table = mgr.allocate_slots(&a, 10, &[]).unwrap().to_vec();
        assert_eq!(table.len(), 3);
        let mut a = a;
        a.num_computed_tokens = 10;
        mgr.cache_computed_blocks(&a);
        assert_eq!(mgr.pool().num_cached_blocks(), 2, "the partial third block is not cached");

        // Same first 9 tokens, then different: blocks 0 and 1 (tokens 0..8) hit.
        let mut tokens: Vec<u32> = (0..9).collect();
        tokens.extend([100, 101, 102]);
        let b = request(2, tokens, &mgr);
        let (hits, n) = mgr.get_computed_blocks(&b);
        assert_eq!((hits.as_slice(), n), (&table[..2], 8));
        let tb = mgr.allocate_slots(&b, 12 - 8, &hits).unwrap().to_vec();
        assert_eq!(&tb[..2], &table[..2]);
        assert_ne!(tb[2], table[2]);
        assert_eq!(mgr.pool().ref_count(table[0]), 2);
        mgr.check_invariants().unwrap();

        // A sequence that is exactly two cached blocks hits only one: one token must be left to compute.
        let c = request(3, (0..8).collect(), &mgr);
        assert_eq!(mgr.get_computed_blocks(&c).1, 4);

        mgr.free(RequestId(1));
        mgr.free(RequestId(2));
        assert_eq!(mgr.num_free_blocks(), 16);
        assert_eq!(mgr.pool().num_cached_blocks(), 2, "freed blocks stay cached");
        assert_eq!(mgr.get_computed_blocks(&b).1, 8, "hits survive the free");
        mgr.check_invariants().unwrap();
    }

    #[test]
    fn failed_allocation_changes_nothing_and_counts_free_hits() {
        let mut mgr = KvCacheManager::new(3, 4, true);
        let mut a = request(1, (0..8).collect(), &mgr);
        mgr.allocate_slots(&a, 8, &[]).unwrap();
        a.num_computed_tokens = 8;
        mgr.cache_computed_blocks(&a);
        mgr.free(a.id);
        // b hits block 0 (free, cached) and needs 2 more blocks for tokens 4..12: 1 hit + 2 new = 3 free blocks.
        let mut tokens: Vec<u32> = (0..4).collect();
        tokens.extend(50..58);
        let b = request(2, tokens, &mgr);
        let (hits, n) = mgr.get_computed_blocks(&b);
        assert_eq!(n, 4);
        // Asking for 9 more tokens would need 3 new blocks + the hit: too many.
        assert!(mgr.allocate_slots(&b, 9, &hits).is_none());
        assert_eq!(mgr.num_free_blocks(), 3);
        assert_eq!(mgr.block_table(b.id), None);
        mgr.check_invariants().unwrap();
        let t = mgr.allocate_slots(&b, 8, &hits).unwrap().to_vec();
        assert_eq!(t[0], hits[0]);
        assert_eq!(mgr.num_free_blocks(), 0);
        mgr.check_invariants().unwrap();
    }

    #[test]
    fn caching_disabled_never_hits() {
        let mut mgr = KvCacheManager::new(8, 4, false);
        let mut a = request(1, (0..8).collect(), &mgr);
        mgr.allocate_slots(&a, 8, &[]).unwrap();
        a.num_computed_tokens = 8;
        mgr.cache_computed_blocks(&a);
        let b = request(2, (0..9).collect(), &mgr);
        assert_eq!(mgr.get_computed_blocks(&b), (vec![], 0));
        mgr.free(a.id);
        assert_eq!(mgr.num_free_blocks(), 8);
        mgr.check_invariants().unwrap();
    }
}
