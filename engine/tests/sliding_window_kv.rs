//! Sliding-window layers keep only their window in the paged KV cache: the tiny Gemma 3 checkpoint (5 local layers
//! with a 16-token window, 1 global layer) serves its 146-token golden prompt (more than 8x the window) through the
//! real scheduler, with chunked prefill and blocks of 4 tokens, on the CPU backend. At every step each local KV
//! cache group holds no more blocks than the window of the step's queries needs, the global group holds all of
//! them, and the 32 greedy tokens equal transformers'. A second request with the same prompt then hits the prefix
//! cache (the freed local blocks stay cached) and gives the same tokens.

use candle_core::DType;
use rserve_engine::backend::cpu::CpuBackend;
use rserve_engine::model::{KvLayout, TokenId};
use rserve_engine::runner::{ModelRunner, StepRunner};
use rserve_engine::sampling::argmax;
use rserve_engine::source::{resolve_model, ResolveOptions};
use rserve_scheduler::{NewRequest, RequestId, Scheduler, SchedulerConfig};
use serde_json::Value;

const BS: usize = 4;
const STEPS: usize = 32;

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

#[test]
fn gemma3_local_layers_hold_only_their_window_and_outputs_match_transformers() {
    let g: Value = serde_json::from_str(
        &std::fs::read_to_string(rserve_tests::fixture("golden/tiny/gemma3.json")).expect("gemma3 golden"),
    )
    .unwrap();
    let folder = g["model"]["folder"].as_str().unwrap();
    rserve_tests::model_file(&format!("{folder}/model.safetensors"));
    let folder = rserve_tests::models_dir().join(folder);
    let long = g["prompts"].as_array().unwrap().iter().max_by_key(|p| p["prompt_token_ids"].as_array().unwrap().len());
    let long = long.unwrap();
    let (prompt, want) = (ids(&long["prompt_token_ids"]), ids(&long["greedy_token_ids"]));

    let resolved =
        resolve_model(folder.to_str().unwrap(), &ResolveOptions::with_cache_dir(std::env::temp_dir())).unwrap();
    let params = resolved.load_params().unwrap();
    let window = params.sliding_window.expect("gemma3 has sliding layers");
    assert!(prompt.len() > 8 * window, "the prompt ({}) must be longer than 8 windows ({window})", prompt.len());
    let weights = rserve_engine::weights::load(&resolved, &params, DType::F32).unwrap();
    let layout = KvLayout::of(&params);
    assert!(layout.has_sliding() && layout.groups.iter().any(|g| g.window.is_none()));

    let num_blocks = 4 * (prompt.len() + STEPS).div_ceil(BS);
    let mut cfg = SchedulerConfig::new(num_blocks, prompt.len() + STEPS);
    cfg.block_size = BS;
    cfg.max_num_batched_tokens = 24;
    cfg.max_num_seqs = 4;
    cfg.kv_groups = layout.groups.clone();
    let mut sched = Scheduler::new(cfg).unwrap();
    let mut runner = ModelRunner::new(CpuBackend::new(), &params, &weights, num_blocks, BS).unwrap();

    for (round, id) in [RequestId(1), RequestId(2)].into_iter().enumerate() {
        sched
            .add_request(NewRequest {
                id,
                prompt_token_ids: prompt.iter().copied().map(TokenId).collect(),
                max_tokens: STEPS,
                min_tokens: 0,
                stop_token_ids: vec![],
                skip_prefix_cache: false,
                whole_prompt: false,
            })
            .unwrap();
        let mut got = Vec::new();
        let mut most_local = 0;
        let mut cached = 0;
        while sched.has_unfinished() {
            let step = sched.schedule();
            let logits = runner.execute(&step.seqs).unwrap();
            let vocab = params.vocab_size;
            let mut sampled = Vec::new();
            for (i, s) in step.seqs.iter().enumerate() {
                // What the step's queries read: from the window of its first query to its last token.
                let (first, end) = (s.start_position, s.start_position + s.token_ids.len());
                for (gi, spec) in layout.groups.iter().enumerate() {
                    let held = sched.kv().blocks_held(s.request_id, gi);
                    let all = end.div_ceil(BS);
                    match spec.window {
                        None => assert_eq!(held, all, "global group {gi} at {end} tokens"),
                        Some(_) => {
                            let need = all - spec.first_needed_block(first, BS);
                            assert!(held <= need, "local group {gi} holds {held} blocks at {end} tokens, needs {need}");
                            if s.token_ids.len() == 1 {
                                most_local = most_local.max(held);
                            }
                        }
                    }
                }
                cached = cached.max(s.num_cached_tokens);
                if s.sample {
                    let t = argmax(&logits[i * vocab..(i + 1) * vocab]);
                    sampled.push((s.request_id, TokenId(t)));
                    got.push(t);
                }
            }
            sched.update_from_output(&step, &sampled);
            sched.recycle(step);
        }
        assert_eq!(got, want, "round {round}: greedy tokens differ from transformers");
        // Decode steps: a window of 16 over blocks of 4 is 4 blocks, 5 while the newest block fills.
        assert!(most_local <= window / BS + 1, "a decode step held {most_local} local blocks");
        assert_eq!(sched.kv().num_used_blocks(), 0, "every block is back in the pool");
        if round == 1 {
            assert!(cached >= 8 * window, "the second request hit only {cached} cached prompt tokens");
        }
    }
}
