//! Whole-model parity on OpenCL: SmolLM2-135M-Instruct (float32) gives the same first 32 greedy tokens as the CPU
//! backend for every prompt of tests/fixtures/golden/smollm2_greedy.json, run one prompt at a time (block size 16)
//! and all prompts together in one ragged batch (prefills of every length in one step, then batched decode; block
//! size 32).

mod backends;
mod common;

use candle_core::DType;
use rserve_engine::backend::cpu::CpuBackend;
use rserve_engine::backend::Backend;
use rserve_engine::config::ModelParams;
use rserve_engine::model::{BlockId, ScheduledSeq, TokenId};
use rserve_engine::runner::{ModelRunner, StepRunner};
use rserve_engine::sampling::argmax;
use rserve_engine::source::{resolve_model, ResolveOptions};
use rserve_engine::weights::Weights;
use serde_json::Value;

const STEPS: usize = 32;

fn load() -> (ModelParams, Weights) {
    let path = common::smollm2_gguf();
    let resolved =
        resolve_model(path.to_str().unwrap(), &ResolveOptions::with_cache_dir(std::env::temp_dir())).unwrap();
    let params = resolved.load_params().unwrap();
    let weights = rserve_engine::weights::load(&resolved, &params, DType::F32).unwrap();
    (params, weights)
}

/// Sequence input over blocks `first_block..` (contiguous), positions `start..start + tokens.len()`.
fn seq(tokens: &[u32], start: usize, first_block: u32, blocks: usize, bs: usize) -> ScheduledSeq {
    ScheduledSeq::new(tokens.iter().copied().map(TokenId).collect(), start, BlockId::run(first_block, blocks), bs)
}

/// Greedy tokens of one prompt alone; also the first step's logits.
fn greedy_alone(r: &mut dyn StepRunner, prompt: &[u32], bs: usize) -> (Vec<u32>, Vec<f32>) {
    let blocks = (prompt.len() + STEPS).div_ceil(bs);
    let first = r.execute(&[seq(prompt, 0, 0, blocks, bs)]).unwrap();
    let mut logits = first.clone();
    let mut out = Vec::new();
    for step in 0..STEPS {
        let t = argmax(&logits);
        out.push(t);
        if step + 1 < STEPS {
            logits = r.execute(&[seq(&[t], prompt.len() + step, 0, blocks, bs)]).unwrap();
        }
    }
    (out, first)
}

/// Greedy tokens of all prompts decoded together in one batch.
fn greedy_batched(r: &mut dyn StepRunner, prompts: &[Vec<u32>], bs: usize, blocks_per_seq: usize) -> Vec<Vec<u32>> {
    let block0 = |i: usize| (i * blocks_per_seq) as u32;
    let batch: Vec<ScheduledSeq> =
        prompts.iter().enumerate().map(|(i, p)| seq(p, 0, block0(i), blocks_per_seq, bs)).collect();
    let mut logits = r.execute(&batch).unwrap();
    let vocab = r.vocab_size();
    let mut out = vec![Vec::new(); prompts.len()];
    for step in 0..STEPS {
        let next: Vec<u32> = (0..prompts.len()).map(|i| argmax(&logits[i * vocab..(i + 1) * vocab])).collect();
        for (o, t) in out.iter_mut().zip(&next) {
            o.push(*t);
        }
        if step + 1 < STEPS {
            let seqs: Vec<ScheduledSeq> = prompts
                .iter()
                .enumerate()
                .map(|(i, p)| seq(&[next[i]], p.len() + step, block0(i), blocks_per_seq, bs))
                .collect();
            logits = r.execute(&seqs).unwrap();
        }
    }
    out
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

#[test]
fn smollm2_greedy_tokens_match_the_cpu_backend() {
    let Some(cl) = backends::opencl() else { return };
    let golden: Value =
        serde_json::from_str(&std::fs::read_to_string(common::fixture("golden/smollm2_greedy.json")).unwrap()).unwrap();
    let prompts: Vec<(String, Vec<u32>)> = golden["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["name"].as_str().unwrap().to_string(), ids(&p["prompt_token_ids"])))
        .collect();
    assert!(prompts.len() >= 8, "the fixture needs at least 8 prompts");
    let (params, weights) = load();
    let name = cl.device_name();
    let longest = prompts.iter().map(|(_, p)| p.len()).max().unwrap() + STEPS;

    let mut cpu = ModelRunner::new(CpuBackend::new(), &params, &weights, longest.div_ceil(16), 16).unwrap();
    let mut gpu = ModelRunner::new(cl, &params, &weights, longest.div_ceil(16), 16).unwrap();
    let mut reference = Vec::new();
    for (prompt_name, prompt) in &prompts {
        let (want, want_logits) = greedy_alone(&mut cpu, prompt, 16);
        let (got, got_logits) = greedy_alone(&mut gpu, prompt, 16);
        let scale = want_logits.iter().fold(0f32, |m, v| m.max(v.abs()));
        let diff = got_logits.iter().zip(&want_logits).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        eprintln!("{prompt_name}: first-step logits max |opencl - cpu| = {diff:e} (max |logit| {scale})");
        assert_eq!(got, want, "{prompt_name}: greedy tokens on {name} differ from the CPU backend");
        reference.push(want);
    }
    drop(gpu);

    let cl = backends::opencl().unwrap();
    let blocks_per_seq = longest.div_ceil(32);
    let mut gpu = ModelRunner::new(cl, &params, &weights, prompts.len() * blocks_per_seq, 32).unwrap();
    let all: Vec<Vec<u32>> = prompts.iter().map(|(_, p)| p.clone()).collect();
    let batched = greedy_batched(&mut gpu, &all, 32, blocks_per_seq);
    for (((prompt_name, _), got), want) in prompts.iter().zip(&batched).zip(&reference) {
        assert_eq!(got, want, "{prompt_name}: greedy tokens of the batched run differ from the CPU backend");
    }
}
