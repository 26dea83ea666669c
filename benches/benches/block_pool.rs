//! Criterion benchmarks of the KV block bookkeeping of `rserve-scheduler`:
//! - `block_pool/allocate_free_32`: take 32 blocks from a pool of 4096 and give them back;
//! - `block_pool/prefix_hit_32`: look up 32 cached block hashes, reference the blocks (taking them out of the free
//!   queue) and free them again, the pool-level work of a 512-token prefix-cache hit;
//! - `kv_cache_manager/allocate_free_512`: a 512-token request with no cache hit: hash its blocks, find no prefix,
//!   allocate its 32 blocks, free them;
//! - `kv_cache_manager/prefix_hit_512`: the same request when another request with the same prompt has run before:
//!   31 of its 32 blocks come from the prefix cache.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use rserve_scheduler::{
    BlockHash, BlockPool, KvCacheManager, KvGroupSpec, NewRequest, Request, RequestId, Scheduler, SchedulerConfig,
    TokenId,
};

const NUM_BLOCKS: usize = 4096;
const BLOCK_SIZE: usize = 16;
const PROMPT_LEN: usize = 512;

fn new_request(id: u64) -> NewRequest {
    NewRequest {
        id: RequestId(id),
        prompt_token_ids: (0..PROMPT_LEN as u32).map(|t| TokenId(t * 7 + 3)).collect(),
        max_tokens: 1,
        min_tokens: 0,
        stop_token_ids: vec![],
        skip_prefix_cache: false,
        whole_prompt: false,
    }
}

fn bench_pool(c: &mut Criterion) {
    let mut g = c.benchmark_group("block_pool");
    let mut pool = BlockPool::new(NUM_BLOCKS, true);
    let mut blocks = Vec::with_capacity(32);
    g.bench_function("allocate_free_32", |b| {
        b.iter(|| {
            blocks.clear();
            assert!(pool.allocate_into(black_box(32), &mut blocks));
            pool.free(blocks.iter().rev().copied());
        })
    });

    // 32 blocks registered in the prefix cache, then freed: they wait in the free queue, still cached.
    let mut pool = BlockPool::new(NUM_BLOCKS, true);
    let cached = pool.allocate(32).expect("pool has room");
    let hashes: Vec<BlockHash> = (0..32u64).map(|i| BlockHash(0x9e37_79b9_7f4a_7c15u64.wrapping_mul(i + 1))).collect();
    for (&b, &h) in cached.iter().zip(&hashes) {
        assert!(pool.cache_block(b, h));
    }
    pool.free(cached.iter().rev().copied());
    let mut hits = Vec::with_capacity(32);
    g.bench_function("prefix_hit_32", |b| {
        b.iter(|| {
            hits.clear();
            hits.extend(hashes.iter().map_while(|&h| pool.get_cached(black_box(h))));
            assert_eq!(hits.len(), 32);
            pool.touch(&hits);
            pool.free(hits.iter().rev().copied());
        })
    });
    g.finish();
}

fn bench_manager(c: &mut Criterion) {
    let mut g = c.benchmark_group("kv_cache_manager");
    let mut mgr = KvCacheManager::new(NUM_BLOCKS, BLOCK_SIZE, true, &[KvGroupSpec::FULL]);
    g.bench_function("allocate_free_512", |b| {
        b.iter(|| {
            let mut req = Request::new(new_request(1), 4096).expect("valid request");
            mgr.update_block_hashes(&mut req);
            let (hits, _) = mgr.get_computed_blocks(&req);
            let table = mgr.allocate_slots(&req, PROMPT_LEN, &hits).expect("room");
            black_box(table.len());
            mgr.free(req.id());
        })
    });

    // Run one request with the prompt through a scheduler so its blocks land in the prefix cache, then bench a
    // copy of that scheduler's KV cache manager.
    let mut sched = Scheduler::new(SchedulerConfig::new(NUM_BLOCKS, 4096)).expect("valid config");
    sched.add_request(new_request(1)).expect("valid request");
    while sched.has_unfinished() {
        let out = sched.schedule();
        let sampled: Vec<_> = out.seqs.iter().filter(|s| s.sample).map(|s| (s.request_id, TokenId(11))).collect();
        sched.update_from_output(&out, &sampled);
    }
    let mut mgr = sched.kv_cache().clone();
    assert!(mgr.pool().num_cached_blocks() >= PROMPT_LEN / BLOCK_SIZE - 1, "the prompt's blocks are cached");
    g.bench_function("prefix_hit_512", |b| {
        b.iter(|| {
            let mut req = Request::new(new_request(2), 4096).expect("valid request");
            mgr.update_block_hashes(&mut req);
            let (hits, num_cached) = mgr.get_computed_blocks(&req);
            assert_eq!(hits[0].len(), PROMPT_LEN / BLOCK_SIZE - 1);
            let table = mgr.allocate_slots(&req, PROMPT_LEN - num_cached, &hits).expect("room");
            black_box(table.len());
            mgr.free(req.id());
        })
    });
    g.finish();
}

criterion_group!(benches, bench_pool, bench_manager);
criterion_main!(benches);
