//! Scenario tests of the scheduler: prefix-cache hits, LRU eviction through the scheduler, chunked prefill,
//! preemption under a tiny cache, stop rules, aborts and request validation.

mod support;

use std::collections::HashMap;

use rserve_scheduler::{
    FinishStatus, PrefillLimits, PrefixCacheReset, Request, RequestId, Scheduler, SchedulerConfig, SchedulerError,
    TokenId,
};
use support::{check_step, new_request, sample_step, step, Outcome};

const VOCAB: u32 = 1000;

fn cfg(block_size: usize, num_blocks: usize, max_model_len: usize) -> SchedulerConfig {
    let mut c = SchedulerConfig::new(num_blocks, max_model_len);
    c.block_size = block_size;
    c
}

fn run_to_end(sched: &mut Scheduler, outcomes: &mut HashMap<RequestId, Outcome>) {
    for _ in 0..10_000 {
        if !sched.has_unfinished() {
            return;
        }
        step(sched, VOCAB, outcomes).unwrap();
    }
    panic!("requests did not finish in 10000 steps");
}

/// Tokens a probe request with `prompt` would get from the prefix cache right now.
fn cached_tokens(sched: &Scheduler, prompt: Vec<u32>) -> usize {
    let mut probe = Request::new(new_request(u64::MAX, prompt, 1, 0, vec![]), sched.config().max_model_len).unwrap();
    sched.kv_cache().update_block_hashes(&mut probe);
    sched.kv_cache().get_computed_blocks(&probe).1
}

#[test]
fn shared_prefix_starts_at_cached_full_blocks() {
    let mut sched = Scheduler::new(cfg(16, 64, 512)).unwrap();
    let shared: Vec<u32> = (1..=40).collect();
    sched.add_request(new_request(1, shared.clone(), 3, 0, vec![])).unwrap();
    let mut outcomes = HashMap::new();
    run_to_end(&mut sched, &mut outcomes);

    // Same first 37 tokens: the two full blocks (32 tokens) come from the cache, although request 1 is finished.
    let mut prompt: Vec<u32> = shared[..37].to_vec();
    prompt.extend([900, 901, 902]);
    sched.add_request(new_request(2, prompt, 2, 0, vec![])).unwrap();
    let out = sched.schedule();
    check_step(&sched, &out).unwrap();
    let seq = &out.seqs[0];
    assert_eq!(seq.request_id, RequestId(2));
    assert_eq!(seq.start_position, 32);
    assert_eq!(seq.num_cached_tokens, 32);
    assert_eq!(seq.token_ids.len(), 40 - 32);
    assert!(seq.is_first_schedule && seq.sample);
    let st = sched.stats();
    assert_eq!((st.prefix_cache_queries, st.prefix_cache_hits), (40 + 40, 32));

    // A request whose whole prompt is cached still computes its last block's tokens.
    sched.add_request(new_request(3, shared[..32].to_vec(), 1, 0, vec![])).unwrap();
    let sampled = sample_step(&out, VOCAB);
    sched.update_from_output(&out, &sampled);
    let out = sched.schedule();
    check_step(&sched, &out).unwrap();
    let s3 = out.seqs.iter().find(|s| s.request_id == RequestId(3)).unwrap();
    assert_eq!((s3.start_position, s3.token_ids.len()), (16, 16));
}

#[test]
fn prefix_caching_disabled_computes_everything() {
    let mut c = cfg(16, 64, 512);
    c.enable_prefix_caching = false;
    let mut sched = Scheduler::new(c).unwrap();
    let prompt: Vec<u32> = (1..=40).collect();
    let mut outcomes = HashMap::new();
    sched.add_request(new_request(1, prompt.clone(), 1, 0, vec![])).unwrap();
    run_to_end(&mut sched, &mut outcomes);
    sched.add_request(new_request(2, prompt, 1, 0, vec![])).unwrap();
    let out = sched.schedule();
    assert_eq!(out.seqs[0].start_position, 0);
    assert_eq!(sched.stats().prefix_cache_hits, 0);
}

#[test]
fn a_request_that_skips_the_prefix_cache_computes_its_whole_prompt_and_still_fills_it() {
    let mut sched = Scheduler::new(cfg(16, 64, 512)).unwrap();
    let prompt: Vec<u32> = (1..=40).collect();
    let mut outcomes = HashMap::new();
    sched.add_request(new_request(1, prompt.clone(), 1, 0, vec![])).unwrap();
    run_to_end(&mut sched, &mut outcomes);
    // Prompt log-probs need every position's logits: the cached blocks are not used.
    let uncached =
        rserve_scheduler::NewRequest { skip_prefix_cache: true, ..new_request(2, prompt.clone(), 1, 0, vec![]) };
    sched.add_request(uncached).unwrap();
    let out = sched.schedule();
    check_step(&sched, &out).unwrap();
    assert_eq!((out.seqs[0].start_position, out.seqs[0].token_ids.len(), out.seqs[0].num_cached_tokens), (0, 40, 0));
    assert_eq!(sched.stats().prefix_cache_hits, 0);
    let sampled = sample_step(&out, VOCAB);
    sched.update_from_output(&out, &sampled);
    run_to_end(&mut sched, &mut outcomes);
    // Its blocks are cached for others all the same.
    assert_eq!(cached_tokens(&sched, prompt), 32);
}

#[test]
fn a_whole_prompt_request_waits_for_a_step_with_room_and_is_never_chunked() {
    // A 48-token budget: the first prompt (30 tokens) leaves 18, too few for the second (30) whole.
    let mut config = cfg(16, 64, 48);
    config.max_num_batched_tokens = 48;
    config.max_num_seqs = 8;
    let mut sched = Scheduler::new(config).unwrap();
    let whole = |id, len: u32| rserve_scheduler::NewRequest {
        whole_prompt: true,
        ..new_request(id, (1..=len).map(|t| t + 100 * id as u32).collect(), 1, 0, vec![])
    };
    sched.add_request(whole(1, 30)).unwrap();
    sched.add_request(whole(2, 30)).unwrap();
    let out = sched.schedule();
    check_step(&sched, &out).unwrap();
    assert_eq!(out.seqs.len(), 1, "the second prompt waits instead of running 18 of its 30 tokens");
    assert_eq!(out.seqs[0].token_ids.len(), 30);
    let sampled = sample_step(&out, VOCAB);
    sched.update_from_output(&out, &sampled);
    let out = sched.schedule();
    check_step(&sched, &out).unwrap();
    let second = out.seqs.iter().find(|q| q.request_id == RequestId(2)).expect("admitted in the next step");
    assert_eq!((second.start_position, second.token_ids.len()), (0, 30));
}

#[test]
fn eviction_takes_least_recently_freed_blocks_tail_first() {
    // 8 blocks of 4 slots. A and B each cache 2 full blocks and finish, A first.
    let mut sched = Scheduler::new(cfg(4, 8, 32)).unwrap();
    let a: Vec<u32> = (100..109).collect();
    let b: Vec<u32> = (200..209).collect();
    let mut outcomes = HashMap::new();
    sched.add_request(new_request(1, a.clone(), 1, 0, vec![])).unwrap();
    run_to_end(&mut sched, &mut outcomes);
    sched.add_request(new_request(2, b.clone(), 1, 0, vec![])).unwrap();
    run_to_end(&mut sched, &mut outcomes);
    assert_eq!((cached_tokens(&sched, a.clone()), cached_tokens(&sched, b.clone())), (8, 8));
    assert_eq!(sched.stats().num_blocks_free, 8);

    // E needs 5 blocks: the 4 never-cached free blocks plus one cached block, which must be A's last full block
    // (A was freed before B; a request's tail is evicted before its head).
    sched.add_request(new_request(3, (300..320).collect(), 1, 0, vec![])).unwrap();
    let out = sched.schedule();
    check_step(&sched, &out).unwrap();
    assert_eq!(out.seqs[0].block_table().len(), 5);
    assert_eq!(cached_tokens(&sched, a.clone()), 4);
    assert_eq!(cached_tokens(&sched, b.clone()), 8);
}

#[test]
fn chunked_prefill_splits_a_long_prompt() {
    let mut c = cfg(16, 64, 512);
    c.max_num_batched_tokens = 32;
    c.max_num_seqs = 4;
    let mut sched = Scheduler::new(c).unwrap();
    let prompt: Vec<u32> = (0..100).collect();
    sched.add_request(new_request(1, prompt.clone(), 2, 0, vec![])).unwrap();
    let prompt = support::toks(prompt);
    let mut outcomes = HashMap::new();
    let mut chunks = Vec::new();
    while sched.has_unfinished() {
        let out = step(&mut sched, VOCAB, &mut outcomes).unwrap();
        let s = &out.seqs[0];
        if s.start_position < 100 {
            assert_eq!(s.token_ids, prompt[s.start_position..s.start_position + s.token_ids.len()]);
        }
        chunks.push((s.start_position, s.token_ids.len(), s.sample));
    }
    assert_eq!(chunks, vec![(0, 32, false), (32, 32, false), (64, 32, false), (96, 4, true), (100, 1, true)]);
    assert_eq!(outcomes[&RequestId(1)].tokens.len(), 2);
    assert_eq!(outcomes[&RequestId(1)].finish, Some(FinishStatus::Length));
}

#[test]
fn decodes_share_the_budget_with_a_prefill_chunk() {
    let mut c = cfg(4, 64, 256);
    c.max_num_batched_tokens = 8;
    c.max_num_seqs = 4;
    let mut sched = Scheduler::new(c).unwrap();
    let mut outcomes = HashMap::new();
    sched.add_request(new_request(1, vec![1, 2, 3], 50, 0, vec![])).unwrap();
    step(&mut sched, VOCAB, &mut outcomes).unwrap();
    sched.add_request(new_request(2, (0..20).collect(), 5, 0, vec![])).unwrap();
    let out = step(&mut sched, VOCAB, &mut outcomes).unwrap();
    let lens: Vec<_> = out.seqs.iter().map(|s| (s.request_id.0, s.token_ids.len())).collect();
    assert_eq!(lens, vec![(1, 1), (2, 7)], "the decode goes first, the prefill chunk fills the rest");
}

/// The same workload on a cache large enough for everything and on a cache that forces preemption.
fn run_workload(num_blocks: usize, caching: bool) -> (HashMap<RequestId, Outcome>, u64) {
    let mut c = cfg(4, num_blocks, 24);
    c.enable_prefix_caching = caching;
    c.max_num_seqs = 4;
    c.max_num_batched_tokens = 16;
    let mut sched = Scheduler::new(c).unwrap();
    for id in 0..4u64 {
        let prompt: Vec<u32> = (0..8).map(|k| (id as u32) * 10 + k).collect();
        sched.add_request(new_request(id, prompt, 12, 0, vec![])).unwrap();
    }
    let mut outcomes = HashMap::new();
    run_to_end(&mut sched, &mut outcomes);
    assert_eq!(sched.stats().num_blocks_used, 0);
    (outcomes, sched.stats().num_preemptions)
}

#[test]
fn preemption_under_a_tiny_cache_still_finishes_every_request() {
    let (roomy, roomy_preemptions) = run_workload(64, true);
    assert_eq!(roomy_preemptions, 0);
    for caching in [true, false] {
        // 6 blocks hold 24 tokens: one request of 8 + 12 = 20 tokens (5 blocks) at a time is guaranteed.
        let (tight, preemptions) = run_workload(6, caching);
        assert!(preemptions > 0, "the tiny cache must force preemptions");
        for id in 0..4 {
            let o = &tight[&RequestId(id)];
            assert_eq!(o.tokens.len(), 12);
            assert_eq!(o.finish, Some(FinishStatus::Length));
            assert_eq!(o, &roomy[&RequestId(id)], "recompute after preemption yields the same tokens");
        }
    }
}

#[test]
fn preempted_request_goes_back_to_the_front_and_recomputes_its_outputs() {
    let mut c = cfg(4, 3, 12);
    c.max_num_seqs = 2;
    c.max_num_batched_tokens = 8;
    let mut sched = Scheduler::new(c).unwrap();
    let mut outcomes = HashMap::new();
    sched.add_request(new_request(1, vec![1, 2, 3, 4], 8, 0, vec![])).unwrap();
    sched.add_request(new_request(2, vec![5, 6, 7], 8, 0, vec![])).unwrap();
    sched.add_request(new_request(3, vec![8], 1, 0, vec![])).unwrap();
    let mut saw_preemption = false;
    while sched.has_unfinished() {
        let out = step(&mut sched, VOCAB, &mut outcomes).unwrap();
        if let Some(&victim) = out.preempted.first() {
            saw_preemption = true;
            assert!(out.seqs.iter().all(|s| s.request_id != victim), "a preempted request is not scheduled");
            let next = sched.schedule();
            check_step(&sched, &next).unwrap();
            let readmitted = next.seqs.iter().find(|s| s.request_id == victim);
            if let Some(s) = readmitted {
                assert!(s.is_first_schedule);
                assert!(s.start_position < sched.request(victim).unwrap().num_tokens());
            }
            let sampled = sample_step(&next, VOCAB);
            support::record(&sched.update_from_output(&next, &sampled), &mut outcomes).unwrap();
        }
    }
    assert!(saw_preemption);
    assert_eq!(outcomes[&RequestId(1)].tokens.len(), 8);
    assert_eq!(outcomes[&RequestId(2)].tokens.len(), 8);
    assert_eq!(outcomes[&RequestId(3)].tokens.len(), 1);
}

#[test]
fn stop_token_respects_min_tokens_and_is_reported() {
    let mut sched = Scheduler::new(cfg(4, 16, 64)).unwrap();
    // Find what the fake model emits after the prompt, then use its second output token as the stop token.
    let mut outcomes = HashMap::new();
    sched.add_request(new_request(1, vec![1, 2, 3], 5, 0, vec![])).unwrap();
    run_to_end(&mut sched, &mut outcomes);
    let free_run = outcomes[&RequestId(1)].tokens.clone();
    let stop = free_run[1];
    assert!(free_run[..1].iter().all(|&t| t != stop), "pick a prompt whose first output differs");

    sched.add_request(new_request(2, vec![1, 2, 3], 5, 0, vec![stop.0])).unwrap();
    sched.add_request(new_request(3, vec![1, 2, 3], 5, 3, vec![stop.0])).unwrap();
    run_to_end(&mut sched, &mut outcomes);
    assert_eq!(outcomes[&RequestId(2)].tokens, free_run[..2].to_vec());
    assert_eq!(outcomes[&RequestId(2)].finish, Some(FinishStatus::StopToken(stop)));
    let o3 = &outcomes[&RequestId(3)];
    assert!(o3.tokens.len() >= 3);
    assert_eq!(o3.tokens[..], free_run[..o3.tokens.len()]);
}

#[test]
fn max_model_len_ends_generation() {
    let mut sched = Scheduler::new(cfg(4, 8, 10)).unwrap();
    let mut outcomes = HashMap::new();
    sched.add_request(new_request(1, vec![1; 7], 100, 0, vec![])).unwrap();
    sched.add_request(new_request(2, vec![2; 10], 100, 0, vec![])).unwrap();
    run_to_end(&mut sched, &mut outcomes);
    assert_eq!(outcomes[&RequestId(1)].tokens.len(), 3);
    assert_eq!(outcomes[&RequestId(1)].finish, Some(FinishStatus::Length));
    assert_eq!(outcomes[&RequestId(2)].tokens.len(), 1, "a prompt of max_model_len still yields one token");
}

#[test]
fn abort_frees_blocks_at_any_time() {
    let mut sched = Scheduler::new(cfg(4, 16, 64)).unwrap();
    let mut outcomes = HashMap::new();
    for id in 1..=3 {
        sched.add_request(new_request(id, (0..10).map(|t| t + id as u32 * 100).collect(), 20, 0, vec![])).unwrap();
    }
    step(&mut sched, VOCAB, &mut outcomes).unwrap();
    let used = sched.stats().num_blocks_used;
    assert!(sched.abort(RequestId(1)));
    assert!(!sched.abort(RequestId(1)), "second abort is a no-op");
    assert_eq!(sched.stats().num_blocks_used, used - 3);
    sched.check_invariants().unwrap();

    // Abort between schedule() and update_from_output(): the stale entry is ignored.
    let out = sched.schedule();
    assert_eq!(out.finished_ids, vec![RequestId(1)], "the runner learns of the abort at the next step");
    assert!(sched.abort(RequestId(2)));
    let sampled = sample_step(&out, VOCAB);
    let results = sched.update_from_output(&out, &sampled);
    assert!(results.iter().all(|r| r.request_id != RequestId(2)));
    sched.check_invariants().unwrap();

    // Abort a waiting request.
    sched.add_request(new_request(9, vec![1, 2], 4, 0, vec![])).unwrap();
    assert!(sched.abort(RequestId(9)));
    let out = sched.schedule();
    assert_eq!(out.finished_ids, vec![RequestId(2), RequestId(9)]);
    assert!(out.seqs.iter().all(|s| s.request_id == RequestId(3)));
    sched.update_from_output(&out, &sample_step(&out, VOCAB));
    assert!(sched.abort(RequestId(3)));
    assert!(!sched.has_unfinished());
    let st = sched.stats();
    assert_eq!((st.num_blocks_used, st.num_blocks_free), (0, 16));
}

#[test]
fn invalid_requests_and_configs_are_rejected() {
    let mut sched = Scheduler::new(cfg(4, 16, 64)).unwrap();
    assert!(matches!(sched.add_request(new_request(1, vec![], 4, 0, vec![])), Err(SchedulerError::EmptyPrompt { .. })));
    assert!(matches!(
        sched.add_request(new_request(1, vec![0; 65], 4, 0, vec![])),
        Err(SchedulerError::PromptTooLong { prompt_len: 65, max_model_len: 64, .. })
    ));
    sched.add_request(new_request(1, vec![1], 4, 0, vec![])).unwrap();
    assert_eq!(
        sched.add_request(new_request(1, vec![1], 4, 0, vec![])),
        Err(SchedulerError::DuplicateRequest { id: RequestId(1) })
    );
    assert_eq!(sched.stats().num_waiting, 1);
    assert!(matches!(Scheduler::new(cfg(4, 15, 64)), Err(SchedulerError::CacheSmallerThanModelLen { .. })));
}

#[test]
fn missing_sample_recomputes_the_last_token_instead_of_stalling() {
    let mut sched = Scheduler::new(cfg(4, 16, 64)).unwrap();
    sched.add_request(new_request(1, vec![1, 2, 3, 4, 5], 2, 0, vec![])).unwrap();
    let out = sched.schedule();
    assert_eq!(sched.update_from_output(&out, &[]), vec![]);
    sched.check_invariants().unwrap();
    let out = sched.schedule();
    check_step(&sched, &out).unwrap();
    assert_eq!(
        (out.seqs[0].start_position, out.seqs[0].token_ids.clone(), out.seqs[0].sample),
        (4, vec![TokenId(5)], true)
    );
    let mut outcomes = HashMap::new();
    support::record(&sched.update_from_output(&out, &sample_step(&out, VOCAB)), &mut outcomes).unwrap();
    run_to_end(&mut sched, &mut outcomes);
    assert_eq!(outcomes[&RequestId(1)].tokens.len(), 2);
}

#[test]
fn reset_prefix_cache_drops_only_blocks_no_request_holds() {
    let mut sched = Scheduler::new(cfg(16, 64, 512)).unwrap();
    let mut outcomes = HashMap::new();
    // Request 1 finishes: its full blocks (2 of 40 prompt + 2 output tokens) stay cached but unreferenced.
    let first: Vec<u32> = (1..=40).collect();
    sched.add_request(new_request(1, first.clone(), 3, 0, vec![])).unwrap();
    run_to_end(&mut sched, &mut outcomes);
    assert_eq!(cached_tokens(&sched, first.clone()), 32);

    // Request 2 (another prompt) runs one step: its first full block is cached and held.
    let second: Vec<u32> = (500..=520).collect();
    sched.add_request(new_request(2, second.clone(), 50, 0, vec![])).unwrap();
    let out = sched.schedule();
    let sampled = sample_step(&out, VOCAB);
    sched.update_from_output(&out, &sampled);
    assert_eq!(cached_tokens(&sched, second.clone()), 16);
    let used = sched.kv_cache().num_used_blocks();

    let reset = sched.reset_prefix_cache(false);
    sched.check_invariants().unwrap();
    assert_eq!(reset, PrefixCacheReset { dropped_blocks: 2, complete: false });
    assert_eq!(cached_tokens(&sched, first.clone()), 0, "request 1's blocks are gone from the cache");
    assert_eq!(cached_tokens(&sched, second.clone()), 16, "the running request's block is still cached");
    assert_eq!(sched.kv_cache().num_used_blocks(), used, "nothing in use was freed");

    // vLLM's reset_running_requests: preempt what runs, then the whole cache goes.
    let reset = sched.reset_prefix_cache(true);
    sched.check_invariants().unwrap();
    assert_eq!(reset, PrefixCacheReset { dropped_blocks: 1, complete: true });
    assert_eq!(cached_tokens(&sched, second), 0);
    // The preempted request is recomputed and finishes.
    run_to_end(&mut sched, &mut outcomes);
    assert!(outcomes.contains_key(&RequestId(2)));
}

/// vLLM's partial-prefill limits: two decodes keep a step each while a long prompt prefills in chunks of the
/// threshold; a second long prompt waits for the first, and a short one behind it goes first.
#[test]
fn partial_prefill_limits_keep_decodes_flowing_and_let_short_prompts_pass_long_ones() {
    let mut c = cfg(16, 256, 1024);
    c.prefill_limits = PrefillLimits::resolve(Some(2), Some(1), Some(64), 1024).unwrap();
    let mut sched = Scheduler::new(c).unwrap();
    let mut outcomes = HashMap::new();
    for id in [1, 2] {
        sched.add_request(new_request(id, vec![id as u32; 8], 50, 0, vec![])).unwrap();
    }
    step(&mut sched, VOCAB, &mut outcomes).unwrap(); // both short prompts prefill in one step (2 partial prefills)
    sched.add_request(new_request(3, (0..500).collect(), 4, 0, vec![])).unwrap();
    sched.add_request(new_request(4, (1000..1300).collect(), 4, 0, vec![])).unwrap();
    sched.add_request(new_request(5, vec![7; 20], 4, 0, vec![])).unwrap();
    let out = step(&mut sched, VOCAB, &mut outcomes).unwrap();
    let got: Vec<(u64, usize)> = out.seqs.iter().map(|s| (s.request_id.0, s.token_ids.len())).collect();
    // Decodes of 1 and 2, the first 64 tokens of the long 3; the long 4 waits, the short 5 passes it.
    assert_eq!(got, vec![(1, 1), (2, 1), (3, 64), (5, 20)]);
    for _ in 0..6 {
        let out = step(&mut sched, VOCAB, &mut outcomes).unwrap();
        let ids: Vec<u64> = out.seqs.iter().map(|s| s.request_id.0).collect();
        assert!(ids.starts_with(&[1, 2]), "decodes run every step: {ids:?}");
        assert!(!ids.contains(&4), "one long prefill at a time: {ids:?}");
        assert!(out.seqs.iter().all(|s| s.token_ids.len() <= 64));
    }
    run_to_end(&mut sched, &mut outcomes);
    assert!((1..=5).all(|id| outcomes[&RequestId(id)].finish.is_some()));
    assert_eq!(sched.stats().num_blocks_used, 0);
}

/// Async scheduling: the next step is scheduled while a sample is out. The running request computes its next
/// position from a placeholder; a request whose `max_tokens` the samples out reach is not scheduled again; an output
/// applied after its request ended (a stop token in flight) is ignored; and the blocks all come back.
#[test]
fn async_scheduling_schedules_ahead_of_samples() {
    let mut sched = Scheduler::new(cfg(4, 16, 64)).unwrap();
    sched.add_request(new_request(1, vec![5, 6, 7], 3, 0, vec![900])).unwrap();
    sched.add_request(new_request(2, vec![8, 9], 2, 0, vec![])).unwrap();
    let s1 = sched.schedule();
    assert_eq!(s1.seqs.len(), 2);
    assert!(s1.seqs.iter().all(|s| s.sample));
    // Step 2 is scheduled before step 1's samples are back: one placeholder each, at the next position.
    let s2 = sched.schedule();
    assert_eq!(s2.seqs.len(), 2);
    for (s, start) in s2.seqs.iter().zip([3, 2]) {
        assert_eq!((s.start_position, s.token_ids.as_slice(), s.sample), (start, &[TokenId::PLACEHOLDER][..], true));
    }
    assert_eq!(sched.request(RequestId(2)).unwrap().num_output_placeholders(), 2);
    let out1 = sched.update_from_output(&s1, &[(RequestId(1), TokenId(11)), (RequestId(2), TokenId(21))]);
    assert!(out1.iter().all(|o| o.finished.is_none()), "{out1:?}");
    // Request 2 reaches max_tokens = 2 with the sample still out: step 3 has only request 1.
    let s3 = sched.schedule();
    assert_eq!(s3.seqs.iter().map(|s| s.request_id).collect::<Vec<_>>(), vec![RequestId(1)]);
    // Request 1 samples its stop token in step 2: step 3's output for it is computed but ignored.
    let out2 = sched.update_from_output(&s2, &[(RequestId(1), TokenId(900)), (RequestId(2), TokenId(22))]);
    assert_eq!(out2.len(), 2);
    assert_eq!(out2[0].finished, Some(FinishStatus::StopToken(TokenId(900))));
    assert_eq!(out2[1].finished, Some(FinishStatus::Length));
    assert!(sched.update_from_output(&s3, &[(RequestId(1), TokenId(12))]).is_empty());
    assert!(!sched.has_unfinished());
    assert_eq!(sched.kv_cache().num_used_blocks(), 0);
    sched.check_invariants().unwrap();
}
