//! The CPU forward pass against Hugging Face transformers (float32) on SmolLM2-135M-Instruct: the first 32 greedy
//! tokens match exactly and the first-token log-probs agree within 1e-3; a batch of mixed prefill chunks and decode
//! tokens gives the same logits as each sequence alone.

use candle_core::DType;
use rserve_engine::backend::cpu::CpuBackend;
use rserve_engine::config::ModelParams;
use rserve_engine::model::{BlockId, ScheduledSeq, TokenId};
use rserve_engine::runner::{ModelRunner, StepRunner};
use rserve_engine::sampling::argmax;
use rserve_engine::sampling::logprobs;
use rserve_engine::source::{resolve_model, ResolveOptions};
use serde_json::Value;

const BS: usize = 16;

fn runner(num_blocks: usize) -> (ModelRunner<CpuBackend>, ModelParams) {
    let resolved = resolve_model(
        rserve_tests::smollm2_gguf().to_str().unwrap(),
        &ResolveOptions::with_cache_dir(std::env::temp_dir()),
    )
    .unwrap();
    let params = resolved.load_params().unwrap();
    let weights = rserve_engine::weights::load(&resolved, &params, DType::F32).unwrap();
    (ModelRunner::new(CpuBackend::new(), &params, &weights, num_blocks, BS).unwrap(), params)
}

/// A sequence using blocks `first_block..` contiguously.
fn seq(tokens: &[u32], start: usize, first_block: u32, total_len: usize) -> ScheduledSeq {
    ScheduledSeq::new(
        tokens.iter().copied().map(TokenId).collect(),
        start,
        BlockId::run(first_block, total_len.div_ceil(BS)),
        BS,
    )
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

#[test]
fn greedy_tokens_and_first_logprobs_match_transformers() {
    let golden: Value =
        serde_json::from_str(&std::fs::read_to_string(rserve_tests::fixture("golden/smollm2_greedy.json")).unwrap())
            .unwrap();
    let (mut r, params) = runner(64);
    let prompts = golden["prompts"].as_array().unwrap();
    assert!(prompts.len() >= 8);
    for p in prompts {
        let name = p["name"].as_str().unwrap();
        let prompt = ids(&p["prompt_token_ids"]);
        let want = ids(&p["greedy_token_ids"]);
        let total = prompt.len() + want.len();
        let mut logits = r.execute(&[seq(&prompt, 0, 0, total)]).unwrap();
        assert_eq!(logits.len(), params.vocab_size);
        let lp = logprobs::log_softmax(&logits);
        for pair in p["first_step_top20"].as_array().unwrap() {
            let (id, want_lp) = (pair[0].as_u64().unwrap() as usize, pair[1].as_f64().unwrap() as f32);
            assert!((lp[id] - want_lp).abs() < 1e-3, "{name}: logprob of {id}: {} vs {want_lp}", lp[id]);
        }
        let mut got = Vec::new();
        for step in 0..want.len() {
            let t = argmax(&logits);
            got.push(t);
            if step + 1 < want.len() {
                let pos = prompt.len() + step;
                logits = r.execute(&[seq(&[t], pos, 0, total)]).unwrap();
            }
        }
        assert_eq!(got, want, "{name}: greedy tokens differ");
    }
}

#[test]
fn mixed_batch_equals_one_at_a_time() {
    let (mut r, _) = runner(64);
    let a: Vec<u32> = (0..40).map(|i| 100 + i * 7).collect();
    let b: Vec<u32> = (0..25).map(|i| 300 + i * 11).collect();
    let c: Vec<u32> = (0..9).map(|i| 50 + i).collect();
    // Alone: a fully, b's first 20 then 5, c fully (each in its own blocks).
    let alone_a = r.execute(&[seq(&a, 0, 0, 48)]).unwrap();
    r.execute(&[seq(&b[..20], 0, 10, 32)]).unwrap();
    let alone_b = r.execute(&[seq(&b[20..], 20, 10, 32)]).unwrap();
    let alone_c = r.execute(&[seq(&c, 0, 20, 16)]).unwrap();
    // Mixed: b's prefix first (as a previous step), then one step holding a decode token of a (next position),
    // b's second chunk and c whole, written to fresh blocks.
    r.execute(&[seq(&a, 0, 30, 48), seq(&b[..20], 0, 40, 32)]).unwrap();
    let next_a = argmax(&alone_a);
    let mixed = r.execute(&[seq(&[next_a], 40, 30, 48), seq(&b[20..], 20, 40, 32), seq(&c, 0, 50, 16)]).unwrap();
    let v = alone_b.len();
    let close = |x: &[f32], y: &[f32], what: &str| {
        for (i, (p, q)) in x.iter().zip(y).enumerate() {
            assert!((p - q).abs() <= 1e-4 * q.abs().max(1.0), "{what}: logit {i}: {p} vs {q}");
        }
    };
    close(&mixed[v..2 * v], &alone_b, "chunked b");
    close(&mixed[2 * v..], &alone_c, "c");
    // a's decode step alone, in its original blocks, for the first row.
    let alone_a2 = r.execute(&[seq(&[next_a], 40, 0, 48)]).unwrap();
    close(&mixed[..v], &alone_a2, "decode a");
}
