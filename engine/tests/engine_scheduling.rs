//! The engine thread on the real SmolLM2 model: preemption under a tiny KV cache, chunked prefill, prefix caching and
//! async scheduling change how work is scheduled but never the tokens; a shared prefix is computed once.

use rserve_engine::api::{FinishReason, GenerateRequest, RequestEvent, SamplingParams, StopParams};
use rserve_engine::engine::{start, EngineConfig, EngineHandle};
use rserve_engine::TokenId;

const PER_TOKEN_KV_BYTES: u64 = 30 * 2 * 3 * 64 * 4;

fn config(max_model_len: usize, kv_tokens: u64, batched: usize) -> EngineConfig {
    let mut c = EngineConfig::new(rserve_tests::smollm2_gguf().to_str().unwrap());
    c.max_model_len = Some(max_model_len);
    c.kv_cache_memory_bytes = Some(kv_tokens * PER_TOKEN_KV_BYTES);
    c.max_num_batched_tokens = Some(batched);
    c.max_num_seqs = 8;
    // The dequantized reference: which matmul path runs (packed kernels take some row counts, f32 tiles others) must
    // not be what decides a near-tie between the schedules compared here.
    c.cpu_packed_weights = false;
    c
}

fn greedy(prompt: Vec<TokenId>, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        prompt_token_ids: prompt,
        sampling: SamplingParams { temperature: 0.0, ..Default::default() },
        stop: StopParams { max_tokens, ignore_eos: true, skip_special_tokens: true, ..Default::default() },
        pooling: None,
    }
}

/// Submits all requests at once; returns each one's tokens and cached-token count.
fn run_all(engine: &EngineHandle, reqs: Vec<GenerateRequest>) -> Vec<(Vec<TokenId>, usize)> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut streams: Vec<_> = reqs.into_iter().map(|r| engine.submit(r).unwrap()).collect();
        let mut results = Vec::new();
        for s in streams.iter_mut() {
            let mut toks = Vec::new();
            loop {
                match s.next().await.expect("stream ended without Finished") {
                    RequestEvent::Delta { token_ids, .. } => toks.extend(token_ids),
                    RequestEvent::Finished { reason, usage, .. } => {
                        assert_eq!(reason, FinishReason::Length);
                        assert_eq!(usage.completion_tokens, toks.len());
                        results.push((toks, usage.cached_tokens));
                        break;
                    }
                    RequestEvent::Error(e) => panic!("engine error: {e}"),
                    RequestEvent::PromptLogprobs { .. } => panic!("prompt log-probs nobody asked for"),
                    RequestEvent::Pooled { .. } => panic!("a pooled result from a generation request"),
                }
            }
        }
        results
    })
}

fn prompt(seed: u32, len: usize) -> Vec<TokenId> {
    (0..len as u32).map(|i| TokenId(200 + (seed * 7919 + i * 104_729) % 40_000)).collect()
}

fn tokens(r: Vec<(Vec<TokenId>, usize)>) -> Vec<Vec<TokenId>> {
    r.into_iter().map(|(t, _)| t).collect()
}

#[test]
fn preemption_and_chunking_keep_greedy_outputs() {
    let reqs = || (0..6).map(|i| greedy(prompt(i, 20 + 7 * i as usize), 40)).collect::<Vec<_>>();
    let ample = start(config(128, 4096, 2048)).unwrap();
    let want = tokens(run_all(&ample, reqs()));
    ample.shutdown();

    // 8 blocks of 16: exactly one maximum-length (128) request fits, six compete.
    let tiny = start(config(128, 128, 2048)).unwrap();
    let got = tokens(run_all(&tiny, reqs()));
    assert!(tiny.metrics().num_preemptions.get() > 0, "the tiny cache never preempted");
    assert_eq!(got, want, "outputs changed under preemption");
    tiny.shutdown();

    // A prompt longer than --max-num-batched-tokens is prefilled in chunks of 16.
    let chunked = start(config(128, 4096, 16)).unwrap();
    let got = tokens(run_all(&chunked, reqs()));
    assert_eq!(got, want, "outputs changed under chunked prefill");
    chunked.shutdown();
}

#[test]
fn shared_prefix_is_computed_once() {
    let engine = start(config(1280, 4096, 2048)).unwrap();
    let prefix = prompt(1, 1000);
    let mut a = prefix.clone();
    a.extend(prompt(2, 10));
    let mut b = prefix.clone();
    b.extend(prompt(3, 20));
    let (a_out, a_cached) = run_all(&engine, vec![greedy(a.clone(), 1)]).remove(0);
    assert_eq!((a_out.len(), a_cached), (1, 0));
    let before = engine.metrics().computed_tokens.get();
    let (_, b_cached) = run_all(&engine, vec![greedy(b.clone(), 1)]).remove(0);
    let computed = engine.metrics().computed_tokens.get() - before;
    let full_blocks = 1000 / 16 * 16;
    assert_eq!(b_cached, full_blocks, "prefix cache hit");
    assert_eq!(computed as usize, b.len() - full_blocks, "only the suffix is computed");
    engine.shutdown();
    // The same request on an engine without prefix caching computes everything.
    let mut cfg = config(1280, 4096, 2048);
    cfg.enable_prefix_caching = false;
    let plain = start(cfg).unwrap();
    run_all(&plain, vec![greedy(a, 1)]);
    let before = plain.metrics().computed_tokens.get();
    run_all(&plain, vec![greedy(b.clone(), 1)]);
    assert_eq!((plain.metrics().computed_tokens.get() - before) as usize, b.len());
    assert!(plain.is_alive());
    plain.shutdown();
    assert!(!plain.is_alive(), "a stopped engine thread is not alive");
}

/// A sampled request with its own seed; `penalty`: a repetition penalty, whose steps wait for the step before (the
/// penalty reads the output so far).
fn sampled(prompt: Vec<TokenId>, max_tokens: usize, seed: u64, penalty: bool) -> GenerateRequest {
    let repetition_penalty = if penalty { 1.3 } else { 1.0 };
    GenerateRequest {
        prompt_token_ids: prompt,
        sampling: SamplingParams { temperature: 0.8, seed: Some(seed), repetition_penalty, ..Default::default() },
        stop: StopParams { max_tokens, ignore_eos: true, skip_special_tokens: true, ..Default::default() },
        pooling: None,
    }
}

#[test]
fn async_scheduling_keeps_tokens_under_preemption_and_mixed_sampling() {
    // Greedy and seeded sampled requests, one with a penalty (its steps fall back to waiting), in a cache that
    // preempts: the same tokens whether each step is scheduled after the one before ended or while it runs.
    let reqs = || {
        (0..6u32)
            .map(|i| match i % 3 {
                0 => greedy(prompt(i, 20 + 7 * i as usize), 40),
                1 => sampled(prompt(i, 20 + 7 * i as usize), 40, u64::from(i), false),
                _ => sampled(prompt(i, 20 + 7 * i as usize), 40, u64::from(i), i == 2),
            })
            .collect::<Vec<_>>()
    };
    let mut off = config(128, 128, 2048);
    off.async_scheduling = false;
    let sync = start(off).unwrap();
    let want = tokens(run_all(&sync, reqs()));
    sync.shutdown();
    let ahead = start(config(128, 128, 2048)).unwrap();
    let got = tokens(run_all(&ahead, reqs()));
    assert!(ahead.metrics().num_preemptions.get() > 0, "the tiny cache never preempted");
    assert_eq!(got, want, "outputs changed under async scheduling");
    ahead.shutdown();
}
