//! `KvCacheManager`: maps each request to its block tables over the [`BlockPool`], one table per KV cache group
//! ([`KvGroupSpec`]), finds the cached prefix of a new request, allocates blocks for the tokens a step computes, frees
//! the blocks a sliding-window group can no longer read, registers blocks in the prefix cache once they are full and
//! computed, and frees a request's blocks.
//!
//! Groups: all groups allocate from the one pool, and a request's tables have the same length in every group (the
//! number of logical blocks covering its tokens). In a sliding-window group the entries before the window point at
//! [`NULL_BLOCK`]: before each allocation the blocks that lie entirely before the first block the step's first query
//! reads are returned to the pool (vLLM's `remove_skipped_blocks`); they keep their prefix-cache key, so later
//! requests can still hit them while they wait in the free queue.
//!
//! The null block: when any group slides, the pool's block 0 is reserved at construction ([`NULL_BLOCK`]): it holds
//! one reference forever (the reservation), is never handed out, never cached and never freed; table entries that
//! point at it hold no reference. It counts as neither free nor used: [`KvCacheManager::num_blocks`] is the number
//! of usable blocks (`num_blocks - 1` then), so `num_free_blocks + num_used_blocks == num_blocks` always holds.
//! Without a sliding group nothing is reserved and block 0 is an ordinary block (one-group behaviour is unchanged).
//!
//! Prefix caching per group: the key of a block in group `g` is [`BlockHasher::group_key`] of its chained token
//! hash (the hash itself in group 0), so groups never share cache entries.
//!
//! Invariant: the reference count of every block equals the number of non-null table entries holding it (plus one
//! for the reserved null block), checked by [`KvCacheManager::check_invariants`]. Boundary: this type knows tokens
//! only through [`Request`]; it never decides who runs (that is the scheduler's job).

use std::collections::hash_map::Entry;

use crate::block_hash::BlockHasher;
use crate::block_pool::BlockPool;
use crate::id_map::IdMap;
use crate::ids::{BlockHash, BlockId, RequestId};
use crate::kv_groups::{KvGroupSpec, NULL_BLOCK};
use crate::request::Request;

/// A request's block table in one KV cache group.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestBlocks {
    blocks: Vec<BlockId>,
    /// The first `num_null` entries are [`NULL_BLOCK`] (sliding-window groups only); the others are held blocks.
    num_null: usize,
    /// The first `num_cached_blocks` blocks are registered in (or came from) the prefix cache, or are null.
    num_cached_blocks: usize,
}

impl RequestBlocks {
    /// The table: one entry per logical block of the request, [`NULL_BLOCK`] before a sliding window.
    pub fn blocks(&self) -> &[BlockId] {
        &self.blocks
    }

    /// Number of entries (logical blocks), null ones included.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Number of leading [`NULL_BLOCK`] entries.
    pub fn num_null(&self) -> usize {
        self.num_null
    }

    /// Number of blocks the request holds (references) in this group.
    pub fn num_held(&self) -> usize {
        self.blocks.len() - self.num_null
    }
}

/// Block tables of all requests that hold blocks, over one block pool shared by the KV cache groups.
#[derive(Debug, Clone)]
pub struct KvCacheManager {
    pool: BlockPool,
    block_size: usize,
    hasher: BlockHasher,
    groups: Vec<KvGroupSpec>,
    /// Block 0 is reserved as [`NULL_BLOCK`] (some group slides).
    null_reserved: bool,
    /// One table per group, in `groups` order.
    tables: IdMap<RequestId, Vec<RequestBlocks>>,
}

impl KvCacheManager {
    /// A manager over `num_blocks` blocks of `block_size` slots serving the KV cache groups `groups` (at least one;
    /// an empty slice means one full group). When a group slides, block 0 is reserved as [`NULL_BLOCK`].
    pub fn new(num_blocks: usize, block_size: usize, enable_prefix_caching: bool, groups: &[KvGroupSpec]) -> Self {
        let groups = if groups.is_empty() { vec![KvGroupSpec::FULL] } else { groups.to_vec() };
        let mut pool = BlockPool::new(num_blocks, enable_prefix_caching);
        let null_reserved = num_blocks > 0 && groups.iter().any(|g| g.window.is_some());
        if null_reserved {
            // The reservation's reference: takes block 0 out of the free queue for good.
            pool.touch(&[NULL_BLOCK]);
        }
        Self { pool, block_size, hasher: BlockHasher::new(), groups, null_reserved, tables: IdMap::default() }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The KV cache groups, in table order.
    pub fn groups(&self) -> &[KvGroupSpec] {
        &self.groups
    }

    /// The reserved null block, when some group slides.
    pub fn null_block(&self) -> Option<BlockId> {
        self.null_reserved.then_some(NULL_BLOCK)
    }

    /// The underlying pool (read-only). Its counts include the reserved null block as a used block.
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    pub fn caching_enabled(&self) -> bool {
        self.pool.caching_enabled()
    }

    fn is_null(&self, b: BlockId) -> bool {
        self.null_reserved && b == NULL_BLOCK
    }

    /// Brings `req`'s block hashes up to date with its tokens (only full blocks are hashed; nothing when caching is off).
    pub fn update_block_hashes(&self, req: &mut Request) {
        if self.caching_enabled() {
            self.hasher.extend_hashes(&mut req.block_hashes, &req.token_ids, self.block_size);
        }
    }

    /// The cached block of group `group` for the block with key `hash`.
    fn cached(&self, hash: BlockHash, group: usize) -> Option<BlockId> {
        self.pool.get_cached(self.hasher.group_key(hash, group))
    }

    /// The longest cached prefix of `req`'s tokens over all groups, as one hit table per group (all of the same
    /// length `L`), and the number of tokens it covers (`L * block_size`); `(vec![], 0)` when nothing hits. At least
    /// one token is always left to compute (the runner needs it to sample), so `L <= (num_tokens - 1) / block_size`.
    /// A full group hits blocks `0..L`; a sliding group hits the blocks the next query (at position
    /// `L * block_size`) reads, from its `first_needed_block` to `L`, and its entries before are [`NULL_BLOCK`]. The
    /// blocks are not referenced yet: pass the tables to [`KvCacheManager::allocate_slots`].
    pub fn get_computed_blocks(&self, req: &Request) -> (Vec<Vec<BlockId>>, usize) {
        if !self.caching_enabled() || req.num_tokens() == 0 || req.skip_prefix_cache {
            return (Vec::new(), 0);
        }
        let bs = self.block_size;
        let max_blocks = ((req.num_tokens() - 1) / bs).min(req.block_hashes.len());
        let hashes = &req.block_hashes[..max_blocks];
        // Full groups: the longest run of hits from block 0, the shortest over the groups.
        let mut len = max_blocks;
        for (g, spec) in self.groups.iter().enumerate() {
            if spec.window.is_none() {
                len = (0..len).find(|&i| self.cached(hashes[i], g).is_none()).unwrap_or(len);
            }
        }
        // Sliding groups: lower `len` until every sliding group has the blocks its window needs at `len`.
        loop {
            let mut next = len;
            for (g, spec) in self.groups.iter().enumerate() {
                if spec.window.is_some() {
                    next = next.min(self.longest_sliding_hit(g, spec, hashes, next));
                }
            }
            if next == len {
                break;
            }
            len = next;
        }
        if len == 0 {
            return (Vec::new(), 0);
        }
        let tables: Option<Vec<Vec<BlockId>>> = self
            .groups
            .iter()
            .enumerate()
            .map(|(g, spec)| {
                let first = spec.first_needed_block(len * bs, bs).min(len);
                (0..len).map(|i| if i < first { Some(NULL_BLOCK) } else { self.cached(hashes[i], g) }).collect()
            })
            .collect();
        match tables {
            Some(t) => (t, len * bs),
            None => {
                debug_assert!(false, "hit checked above");
                (Vec::new(), 0)
            }
        }
    }

    /// The largest `L <= len` for which sliding group `g` has cached blocks `first_needed_block(L * bs)..L` (0 always
    /// qualifies). Scans right to left once: an uncached block `i` rules out every `L` in `i + 1..=end`.
    fn longest_sliding_hit(&self, g: usize, spec: &KvGroupSpec, hashes: &[BlockHash], len: usize) -> usize {
        let bs = self.block_size;
        let mut end = len;
        'candidates: while end > 0 {
            let start = spec.first_needed_block(end * bs, bs).min(end);
            let mut i = end;
            while i > start {
                i -= 1;
                if self.cached(hashes[i], g).is_none() {
                    end = i;
                    continue 'candidates;
                }
            }
            return end;
        }
        0
    }

    /// Makes room for `num_new_tokens` more tokens of `req` after its `num_computed_tokens` plus the tokens of
    /// `new_computed_blocks` (the hit tables of [`KvCacheManager::get_computed_blocks`], empty for no hits; only for
    /// a request that holds no blocks yet: hits for a request that holds blocks are refused with `None`).
    ///
    /// For a request that holds blocks, the blocks of each sliding group that lie entirely before the block its
    /// first query (at `num_computed_tokens`) reads are freed first and their entries become [`NULL_BLOCK`]. Then
    /// every group gets the blocks covering the new tokens. The free-block check counts the new blocks of all groups
    /// (and the blocks that freeing would return, and hits on free cached blocks): on `None` the pool had too few
    /// and nothing changed. Returns the request's tables, one per group.
    pub fn allocate_slots(
        &mut self,
        req: &Request,
        num_new_tokens: usize,
        new_computed_blocks: &[Vec<BlockId>],
    ) -> Option<&[RequestBlocks]> {
        let bs = self.block_size;
        let free_blocks = self.pool.num_free_blocks();
        let null_reserved = self.null_reserved;
        let is_null = |b: BlockId| null_reserved && b == NULL_BLOCK;
        let pool = &mut self.pool;
        let groups = &self.groups;
        match self.tables.entry(req.id) {
            Entry::Occupied(e) => {
                let tables = e.into_mut();
                debug_assert!(new_computed_blocks.is_empty(), "cache hits for a request holding blocks");
                if !new_computed_blocks.is_empty() {
                    return None;
                }
                let c = req.num_computed_tokens;
                let required = (c + num_new_tokens).div_ceil(bs);
                // The end of the entries to null in a group: blocks before the one the query at `c` reads.
                let skip_end = |spec: &KvGroupSpec, t: &RequestBlocks| match spec.window {
                    Some(_) if null_reserved => spec.first_needed_block(c, bs).min(t.blocks.len()).max(t.num_null),
                    _ => t.num_null,
                };
                let mut num_new_blocks = 0;
                let mut freeable = 0;
                for (spec, t) in groups.iter().zip(tables.iter()) {
                    num_new_blocks += required.saturating_sub(t.blocks.len());
                    let end = skip_end(spec, t);
                    freeable += t.blocks[t.num_null..end].iter().filter(|&&b| pool.ref_count(b) == 1).count();
                }
                if num_new_blocks > free_blocks + freeable {
                    return None;
                }
                for (spec, t) in groups.iter().zip(tables.iter_mut()) {
                    let end = skip_end(spec, t);
                    if end > t.num_null {
                        // Last block first, as in `free`: the tail of the skipped run is evicted first.
                        pool.free(t.blocks[t.num_null..end].iter().rev().copied());
                        t.blocks[t.num_null..end].fill(NULL_BLOCK);
                        t.num_null = end;
                    }
                }
                for t in tables.iter_mut() {
                    let n = required.saturating_sub(t.blocks.len());
                    if n > 0 {
                        let ok = pool.allocate_into(n, &mut t.blocks);
                        debug_assert!(ok, "allocation checked above");
                    }
                }
                Some(tables.as_slice())
            }
            Entry::Vacant(v) => {
                let num_hits = new_computed_blocks.first().map_or(0, Vec::len);
                let well_formed = new_computed_blocks.is_empty()
                    || (new_computed_blocks.len() == groups.len()
                        && new_computed_blocks.iter().all(|h| h.len() == num_hits));
                debug_assert!(well_formed, "hit tables must be one per group, of equal length");
                if !well_formed {
                    return None;
                }
                let required = (req.num_computed_tokens + num_hits * bs + num_new_tokens).div_ceil(bs);
                let per_group = required.saturating_sub(num_hits);
                // Hits on free cached blocks take them out of the free queue, so they count against the free blocks.
                let evictable_hits =
                    new_computed_blocks.iter().flatten().filter(|&&b| !is_null(b) && pool.ref_count(b) == 0).count();
                if per_group * groups.len() + evictable_hits > free_blocks {
                    return None;
                }
                // Touch the hits of every group before allocating so that allocation cannot evict them.
                let leading_nulls = |hits: &[BlockId]| hits.iter().take_while(|&&b| is_null(b)).count();
                for hits in new_computed_blocks {
                    pool.touch(&hits[leading_nulls(hits)..]);
                }
                let mut tables = Vec::with_capacity(groups.len());
                for g in 0..groups.len() {
                    let hits = new_computed_blocks.get(g).map_or(&[][..], Vec::as_slice);
                    let mut blocks = Vec::with_capacity(required);
                    blocks.extend_from_slice(hits);
                    let ok = pool.allocate_into(per_group, &mut blocks);
                    debug_assert!(ok, "allocation checked above");
                    tables.push(RequestBlocks { blocks, num_null: leading_nulls(hits), num_cached_blocks: num_hits });
                }
                Some(v.insert(tables).as_slice())
            }
        }
    }

    /// Registers `req`'s blocks that are full and computed (the first `computed` tokens, whose ids are known) in the
    /// prefix cache, in every group (null entries skipped). Call it after the step that computed them ran, so that no
    /// request can hit a block before its KV is written.
    pub fn cache_computed_blocks(&mut self, req: &Request, computed: usize) {
        if !self.caching_enabled() {
            return;
        }
        let Some(tables) = self.tables.get_mut(&req.id) else {
            return;
        };
        for (g, t) in tables.iter_mut().enumerate() {
            let num_full = (computed / self.block_size).min(req.block_hashes.len()).min(t.blocks.len());
            for i in t.num_cached_blocks.max(t.num_null)..num_full {
                self.pool.cache_block(t.blocks[i], self.hasher.group_key(req.block_hashes[i], g));
            }
            t.num_cached_blocks = t.num_cached_blocks.max(num_full);
        }
    }

    /// Frees all blocks of `id` in every group (null entries skipped), last logical block first (across the groups)
    /// so that a sequence's tail is evicted before its shared prefix. Returns false when the request held no blocks.
    pub fn free(&mut self, id: RequestId) -> bool {
        let Some(tables) = self.tables.remove(&id) else {
            return false;
        };
        let len = tables.iter().map(|t| t.blocks.len()).max().unwrap_or(0);
        let null_reserved = self.null_reserved;
        let tables = &tables;
        self.pool.free(
            (0..len)
                .rev()
                .flat_map(move |i| tables.iter().filter_map(move |t| t.blocks.get(i).copied()))
                .filter(|&b| !(null_reserved && b == NULL_BLOCK)),
        );
        true
    }

    /// Drops the prefix-cache keys of the blocks no request holds ([`BlockPool::reset_prefix_cache`]); returns how many.
    pub fn reset_prefix_cache(&mut self) -> usize {
        self.pool.reset_prefix_cache()
    }

    /// The block table of `id` in the first group (the only one of a model without sliding-window layers).
    pub fn block_table(&self, id: RequestId) -> Option<&[BlockId]> {
        self.tables.get(&id).and_then(|t| t.first()).map(|t| t.blocks.as_slice())
    }

    /// The tables of `id`, one per group, if it holds blocks.
    pub fn block_tables(&self, id: RequestId) -> Option<&[RequestBlocks]> {
        self.tables.get(&id).map(Vec::as_slice)
    }

    /// Blocks (non-null entries) `id` holds in group `group` (0 for an unknown request or group).
    pub fn blocks_held(&self, id: RequestId, group: usize) -> usize {
        self.tables.get(&id).and_then(|t| t.get(group)).map_or(0, RequestBlocks::num_held)
    }

    /// Number of requests holding block tables.
    pub fn num_tables(&self) -> usize {
        self.tables.len()
    }

    /// Usable blocks: the pool's blocks less the reserved null block.
    pub fn num_blocks(&self) -> usize {
        self.pool.num_blocks() - usize::from(self.null_reserved)
    }

    /// Free blocks, cached ones included (never the null block).
    pub fn num_free_blocks(&self) -> usize {
        self.pool.num_free_blocks()
    }

    /// Blocks some request holds (not the null block).
    pub fn num_used_blocks(&self) -> usize {
        self.pool.num_used_blocks() - usize::from(self.null_reserved)
    }

    /// Checks the pool's invariants, that every reference count equals the number of non-null table entries holding
    /// the block (plus the null block's reservation), that every request has one table per group, all of one length,
    /// and that null entries form the prefix its `num_null` says, in sliding groups only.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.pool.check_invariants()?;
        let mut holders = vec![0u32; self.pool.num_blocks()];
        if self.null_reserved {
            holders[NULL_BLOCK.index()] = 1;
            if self.pool.block_hash(NULL_BLOCK).is_some() {
                return Err("the null block is cached".into());
            }
        }
        for (id, tables) in &self.tables {
            if tables.len() != self.groups.len() {
                return Err(format!("{id} has {} tables for {} groups", tables.len(), self.groups.len()));
            }
            let len = tables[0].blocks.len();
            for (g, (spec, t)) in self.groups.iter().zip(tables).enumerate() {
                if t.blocks.len() != len {
                    return Err(format!("{id}: group {g} has {} blocks, group 0 {len}", t.blocks.len()));
                }
                if t.num_null > 0 && spec.window.is_none() {
                    return Err(format!("{id}: full group {g} has {} null entries", t.num_null));
                }
                if t.num_null > t.blocks.len() || t.num_cached_blocks > t.blocks.len() {
                    return Err(format!(
                        "{id} group {g}: {} null, {} cached of {} blocks",
                        t.num_null,
                        t.num_cached_blocks,
                        t.blocks.len()
                    ));
                }
                for (i, &b) in t.blocks.iter().enumerate() {
                    let null = self.is_null(b);
                    if null != (i < t.num_null) {
                        return Err(format!("{id} group {g}: entry {i} is {b} with {} leading nulls", t.num_null));
                    }
                    if null {
                        continue;
                    }
                    let Some(h) = holders.get_mut(b.index()) else {
                        return Err(format!("{id} holds unknown block {b}"));
                    };
                    *h += 1;
                }
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
            skip_prefix_cache: false,
            whole_prompt: false,
        };
        let mut r = Request::new(new, 1 << 20).unwrap();
        mgr.update_block_hashes(&mut r);
        r
    }

    #[test]
    fn shared_prefix_hits_full_blocks_only() {
        let mut mgr = KvCacheManager::new(16, 4, true, &[KvGroupSpec::FULL]);
        let a = request(1, (0..10).collect(), &mgr);
        assert_eq!(mgr.get_computed_blocks(&a), (vec![], 0));
        let table = mgr.allocate_slots(&a, 10, &[]).unwrap()[0].blocks().to_vec();
        assert_eq!(table.len(), 3);
        let mut a = a;
        a.num_computed_tokens = 10;
        mgr.cache_computed_blocks(&a, a.num_computed_tokens);
        assert_eq!(mgr.pool().num_cached_blocks(), 2, "the partial third block is not cached");

        // Same first 9 tokens, then different: blocks 0 and 1 (tokens 0..8) hit.
        let mut tokens: Vec<u32> = (0..9).collect();
        tokens.extend([100, 101, 102]);
        let b = request(2, tokens, &mgr);
        let (hits, n) = mgr.get_computed_blocks(&b);
        assert_eq!((hits[0].as_slice(), n), (&table[..2], 8));
        let tb = mgr.allocate_slots(&b, 12 - 8, &hits).unwrap()[0].blocks().to_vec();
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
        let mut mgr = KvCacheManager::new(3, 4, true, &[KvGroupSpec::FULL]);
        let mut a = request(1, (0..8).collect(), &mgr);
        mgr.allocate_slots(&a, 8, &[]).unwrap();
        a.num_computed_tokens = 8;
        mgr.cache_computed_blocks(&a, a.num_computed_tokens);
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
        let t = mgr.allocate_slots(&b, 8, &hits).unwrap()[0].blocks().to_vec();
        assert_eq!(t[0], hits[0][0]);
        assert_eq!(mgr.num_free_blocks(), 0);
        mgr.check_invariants().unwrap();
    }

    #[test]
    fn caching_disabled_never_hits() {
        let mut mgr = KvCacheManager::new(8, 4, false, &[KvGroupSpec::FULL]);
        let mut a = request(1, (0..8).collect(), &mgr);
        mgr.allocate_slots(&a, 8, &[]).unwrap();
        a.num_computed_tokens = 8;
        mgr.cache_computed_blocks(&a, a.num_computed_tokens);
        let b = request(2, (0..9).collect(), &mgr);
        assert_eq!(mgr.get_computed_blocks(&b), (vec![], 0));
        mgr.free(a.id);
        assert_eq!(mgr.num_free_blocks(), 8);
        mgr.check_invariants().unwrap();
    }

    const SLIDING: [KvGroupSpec; 2] = [KvGroupSpec::FULL, KvGroupSpec { window: Some(16) }];

    /// Computes `r`'s tokens one at a time from `num_computed_tokens` to `end`, caching as it goes, and checks the
    /// held blocks of each group at every step.
    fn decode_to(mgr: &mut KvCacheManager, r: &mut Request, end: usize) {
        let bs = mgr.block_size();
        for c in r.num_computed_tokens..end {
            r.num_computed_tokens = c;
            let t = mgr.allocate_slots(r, 1, &[]).expect("the pool fits the window");
            assert_eq!(t[0].num_held(), (c + 1).div_ceil(bs), "the full group holds everything");
            assert_eq!(t[1].num_held(), SLIDING[1].blocks_held(c + 1, bs), "at {} tokens", c + 1);
            assert!(t[1].blocks()[..t[1].num_null()].iter().all(|&b| b == NULL_BLOCK));
            assert_eq!(t[0].len(), t[1].len());
            assert_eq!(mgr.blocks_held(r.id, 1), SLIDING[1].blocks_held(c + 1, bs));
            assert_eq!(mgr.num_free_blocks() + mgr.num_used_blocks(), mgr.num_blocks());
            mgr.check_invariants().unwrap();
            r.num_computed_tokens = c + 1;
            mgr.cache_computed_blocks(r, r.num_computed_tokens);
        }
    }

    #[test]
    fn sliding_group_holds_its_window_while_the_full_group_holds_all() {
        for bs in [4, 16] {
            let len = 8 * 16;
            // Room for the full group and one window (plus the null block): only freeing keeps the request going.
            let num_blocks = 1 + len / bs + 16 / bs + 2;
            let mut mgr = KvCacheManager::new(num_blocks, bs, true, &SLIDING);
            assert_eq!(mgr.null_block(), Some(NULL_BLOCK));
            assert_eq!(
                (mgr.num_blocks(), mgr.num_free_blocks(), mgr.num_used_blocks()),
                (num_blocks - 1, num_blocks - 1, 0)
            );
            let mut r = request(1, (0..len as u32).collect(), &mgr);
            decode_to(&mut mgr, &mut r, len);
            assert!(mgr.free(r.id));
            assert_eq!((mgr.num_free_blocks(), mgr.num_used_blocks()), (num_blocks - 1, 0));
            assert_eq!(mgr.pool().ref_count(NULL_BLOCK), 1, "the null block stays reserved");
            mgr.check_invariants().unwrap();
        }
    }

    #[test]
    fn sliding_hits_need_the_window_before_the_next_token() {
        let (bs, len) = (4, 128);
        let num_blocks = 1 + len / bs + 16 / bs + 4;
        let mut mgr = KvCacheManager::new(num_blocks, bs, true, &SLIDING);
        let mut a = request(1, (0..len as u32).collect(), &mgr);
        decode_to(&mut mgr, &mut a, len);

        // While `a` runs: `b` (same tokens) hits 31 blocks (one token left to compute); the window of the token at
        // 124 starts in block 27, so the sliding group hits blocks 27..31 (27 was already freed by `a`, a free
        // cached block) and is null before.
        let b = request(2, (0..len as u32).collect(), &mgr);
        let (hits, n) = mgr.get_computed_blocks(&b);
        assert_eq!(n, 124);
        assert_eq!(hits.len(), 2);
        assert_eq!(hits[0].as_slice(), &mgr.block_table(a.id).unwrap()[..31]);
        assert!(hits[1][..27].iter().all(|&x| x == NULL_BLOCK));
        assert!(hits[1][27..].iter().all(|&x| x != NULL_BLOCK));
        assert_eq!(mgr.pool().ref_count(hits[1][27]), 0, "freed by a, still cached");
        assert_ne!(mgr.block_tables(a.id).unwrap()[1].blocks()[27], hits[1][27], "a's entry is null now");
        let free = mgr.num_free_blocks();
        let t = mgr.allocate_slots(&b, 4, &hits).expect("fits").to_vec();
        assert_eq!((t[0].num_held(), t[1].num_held(), t[1].num_null()), (32, 5, 27));
        assert_eq!(mgr.num_free_blocks(), free - 1 - 2, "one evictable hit and one new block per group");
        mgr.check_invariants().unwrap();
        mgr.free(b.id);
        mgr.free(a.id);
        mgr.check_invariants().unwrap();
        let (again, n) = mgr.get_computed_blocks(&b);
        assert_eq!((again.clone(), n), (hits, 124), "hits survive the frees");

        // Evict the sliding block 27 by allocating blocks for other requests: the full group still has its 31
        // blocks, so the hit is the longest shorter prefix whose window is still cached, by brute force.
        let mut k = 10;
        while mgr.pool().block_hash(again[1][27]).is_some() {
            assert!(mgr.allocate_slots(&request(k, vec![7; 3], &mgr), 3, &[]).is_some());
            k += 1;
        }
        assert!(mgr.pool().block_hash(again[0][30]).is_some(), "the full group's blocks are still cached");
        let (hits, n) = mgr.get_computed_blocks(&b);
        assert!(n < 124);
        assert_eq!(n, oracle_hit_blocks(&mgr, &b) * bs);
        assert_eq!(hits.first().map_or(0, Vec::len) * bs, n);
        mgr.check_invariants().unwrap();
    }

    #[test]
    fn failed_sliding_allocation_changes_nothing_and_counts_freeable_blocks() {
        // Window 8 over blocks of 4, 3 usable blocks (block 0 is the null block).
        let mut mgr = KvCacheManager::new(4, 4, false, &[KvGroupSpec::sliding(8)]);
        let mut r = request(1, (0..40).collect(), &mgr);
        mgr.allocate_slots(&r, 8, &[]).unwrap();
        r.num_computed_tokens = 8;
        let t = mgr.allocate_slots(&r, 4, &[]).unwrap()[0].clone();
        assert_eq!((t.num_held(), mgr.num_free_blocks()), (3, 0));
        // At 12 computed the first query reads from block 1, so block 0 could go: 8 tokens need 2 new blocks, more
        // than 0 free + 1 freeable. Nothing changes, block 0 included.
        r.num_computed_tokens = 12;
        assert!(mgr.allocate_slots(&r, 8, &[]).is_none());
        assert_eq!(mgr.block_tables(r.id).unwrap(), std::slice::from_ref(&t));
        mgr.check_invariants().unwrap();
        // 4 tokens need 1 new block: block 0 is freed and handed out again for block 3.
        let t2 = mgr.allocate_slots(&r, 4, &[]).unwrap()[0].clone();
        assert_eq!(t2.blocks(), &[NULL_BLOCK, t.blocks()[1], t.blocks()[2], t.blocks()[0]]);
        assert_eq!((t2.num_null(), t2.num_held(), mgr.num_free_blocks()), (1, 3, 0));
        mgr.check_invariants().unwrap();
        mgr.free(r.id);
        assert_eq!((mgr.num_free_blocks(), mgr.num_blocks()), (3, 3));
        mgr.check_invariants().unwrap();
    }

    /// The longest `L` with every full group cached on `0..L` and every sliding group on its window at `L`, by
    /// brute force.
    fn oracle_hit_blocks(mgr: &KvCacheManager, r: &Request) -> usize {
        let bs = mgr.block_size();
        let max = ((r.num_tokens() - 1) / bs).min(r.block_hashes.len());
        (1..=max)
            .rev()
            .find(|&l| {
                mgr.groups.iter().enumerate().all(|(g, spec)| {
                    (spec.first_needed_block(l * bs, bs)..l).all(|i| mgr.cached(r.block_hashes[i], g).is_some())
                })
            })
            .unwrap_or(0)
    }

    #[test]
    fn hits_match_a_brute_force_search_under_random_evictions() {
        // Deterministic xorshift: group shapes, prompts over a tiny vocabulary (so prefixes repeat) and lengths.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n) as usize
        };
        let mut hits_seen = 0;
        for _ in 0..60 {
            let bs = [1, 2, 4][next(3)];
            let groups: Vec<KvGroupSpec> = (0..1 + next(3))
                .map(|_| if next(3) == 0 { KvGroupSpec::FULL } else { KvGroupSpec::sliding(1 + next(12)) })
                .collect();
            let mut mgr = KvCacheManager::new(24 + next(24), bs, true, &groups);
            for id in 0..30u64 {
                let len = 2 + next(40);
                let tokens: Vec<u32> = (0..len).map(|i| if i < next(40) { i as u32 } else { next(2) as u32 }).collect();
                let mut r = request(id, tokens, &mgr);
                let (hits, n) = mgr.get_computed_blocks(&r);
                let l = oracle_hit_blocks(&mgr, &r);
                assert_eq!(n, l * bs, "{groups:?} bs {bs}");
                hits_seen += usize::from(n > 0);
                for (g, spec) in groups.iter().enumerate() {
                    let t = hits.get(g).map_or(&[][..], Vec::as_slice);
                    assert_eq!(t.len(), l);
                    let first = spec.first_needed_block(l * bs, bs).min(l);
                    assert!(t.iter().enumerate().all(|(i, &b)| (mgr.null_block() == Some(b)) == (i < first)));
                }
                // Compute the rest token by token (as decode steps), then free: blocks go back cached.
                let Some(_) = mgr.allocate_slots(&r, 1, &hits) else { continue };
                r.num_computed_tokens = n + 1;
                mgr.cache_computed_blocks(&r, r.num_computed_tokens);
                while r.num_computed_tokens < r.num_tokens() {
                    if mgr.allocate_slots(&r, 1, &[]).is_none() {
                        break;
                    }
                    r.num_computed_tokens += 1;
                    mgr.cache_computed_blocks(&r, r.num_computed_tokens);
                }
                mgr.check_invariants().unwrap();
                if next(4) != 0 {
                    mgr.free(r.id);
                }
            }
        }
        assert!(hits_seen > 100, "only {hits_seen} requests hit the cache");
    }
}
