//! Criterion benchmark of the scheduler's per-step bookkeeping: `schedule_update_256` times one `schedule()` plus one
//! `update_from_output()` (building the sampled list included) with 256 running requests in steady-state decode, the
//! output handed back with `recycle()` as the engine does. `schedule_update_256_no_recycle` drops the output instead
//! (every step allocates each seq's token, block-table and slot vectors).
//!
//! Requests never finish (huge `max_tokens`); every 1024 steps the scheduler is rebuilt outside the timed region so
//! contexts stay between 512 and 1536 tokens (32 to 96 blocks of 16). Prefix caching is on, so each step also hashes
//! and caches the blocks that became full.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use rserve_scheduler::{NewRequest, RequestId, Scheduler, SchedulerConfig, TokenId};

const NUM_REQUESTS: u64 = 256;
const PROMPT_LEN: u32 = 512;
const STEPS_PER_SCHEDULER: usize = 1024;

/// A scheduler with `NUM_REQUESTS` distinct prompts, all prefilled, so every following step is pure decode.
fn steady_state_scheduler() -> Scheduler {
    let mut cfg = SchedulerConfig::new(256 * 100, 4096);
    cfg.max_num_seqs = 256;
    cfg.max_num_batched_tokens = 8192;
    let mut sched = Scheduler::new(cfg).expect("valid config");
    for id in 0..NUM_REQUESTS {
        let prompt = (0..PROMPT_LEN).map(|t| TokenId((id as u32) * 1_000 + t)).collect();
        sched
            .add_request(NewRequest {
                id: RequestId(id),
                prompt_token_ids: prompt,
                max_tokens: 1 << 30,
                min_tokens: 0,
                stop_token_ids: vec![TokenId(u32::MAX)],
                skip_prefix_cache: false,
                whole_prompt: false,
            })
            .expect("valid request");
    }
    loop {
        let out = sched.schedule();
        let decode_only = out.seqs.len() == NUM_REQUESTS as usize && out.seqs.iter().all(|s| s.token_ids.len() == 1);
        let sampled: Vec<_> = out.seqs.iter().filter(|s| s.sample).map(|s| (s.request_id, TokenId(7))).collect();
        sched.update_from_output(&out, &sampled);
        if decode_only {
            break;
        }
    }
    assert_eq!(sched.stats().num_preemptions, 0);
    sched
}

fn bench_schedule_update(c: &mut Criterion) {
    for (name, recycle) in [("schedule_update_256", true), ("schedule_update_256_no_recycle", false)] {
        let mut sched = steady_state_scheduler();
        let mut steps = 0usize;
        let mut sampled: Vec<(RequestId, TokenId)> = Vec::with_capacity(NUM_REQUESTS as usize);
        c.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    if steps >= STEPS_PER_SCHEDULER {
                        sched = steady_state_scheduler();
                        steps = 0;
                    }
                    let start = Instant::now();
                    let out = sched.schedule();
                    sampled.clear();
                    sampled.extend(
                        out.seqs.iter().filter(|s| s.sample).map(|s| (s.request_id, TokenId((steps % 1000) as u32))),
                    );
                    let results = sched.update_from_output(&out, &sampled);
                    black_box(&results);
                    drop(results);
                    if recycle {
                        sched.recycle(out);
                    } else {
                        drop(out);
                    }
                    total += start.elapsed();
                    steps += 1;
                }
                total
            })
        });
        let st = sched.stats();
        assert_eq!((st.num_running, st.num_preemptions), (NUM_REQUESTS as usize, 0), "steady state held");
    }
}

criterion_group!(benches, bench_schedule_update);
criterion_main!(benches);
