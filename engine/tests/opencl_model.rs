//! Whole-model parity on OpenCL: SmolLM2-135M-Instruct (float32) gives the same first 32 greedy tokens as the CPU
//! backend for every prompt of tests/fixtures/golden/smollm2_greedy.json, run one prompt at a time (block size 16)
//! and all prompts together in one ragged batch (prefills of every length in one step, then batched decode; block
//! size 32).

mod backends;
mod common;

use common::smollm2::load_f32 as load;
use rserve_engine::backend::cpu::CpuBackend;
use rserve_engine::backend::Backend;
use rserve_engine::model::{BlockId, ScheduledSeq, TokenId};
use rserve_engine::runner::{ModelRunner, StepRunner};
use rserve_engine::sampling::argmax;
use serde_json::Value;

const STEPS: usize = 32;

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
        serde_json::from_str(&std::fs::read_to_string(rserve_tests::fixture("golden/smollm2_greedy.json")).unwrap())
            .unwrap();
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

/// A sampled step on OpenCL chooses its tokens on the device: it reads back one id per row (plus the log-probs a row
/// asks for), and a seeded row draws the same token alone and inside a batch.
#[test]
fn sampled_steps_read_back_only_ids_and_seeded_rows_repeat() {
    use rserve_engine::backend::opencl::OpenClBackend;
    use rserve_engine::sampling::adjust::Edit;
    use rserve_engine::sampling::{RowParams, StepSampling, NO_LOGPROBS};
    let Some(cl) = backends::opencl() else { return };
    let (params, weights) = load();
    let mut gpu = ModelRunner::new(cl, &params, &weights, 64, 16).unwrap();
    let prompts: [&[u32]; 3] = [&[1, 504, 3458, 282], &[1, 2683, 314, 260, 1345], &[1, 28, 29, 30, 31, 32]];
    let seeded = RowParams { temperature: 0.9, top_p: 0.95, top_k: 50, seed: 1234, position: 3, ..RowParams::GREEDY };
    let others = [
        RowParams { temperature: 1.0, seed: 5, ..RowParams::GREEDY },
        RowParams { temperature: 0.7, min_p: 0.1, seed: 6, ..RowParams::GREEDY },
    ];
    let step = |r: &mut ModelRunner<OpenClBackend>, rows: &[(usize, RowParams)], logprobs: bool| {
        let batch: Vec<ScheduledSeq> = rows.iter().map(|&(p, _)| seq(prompts[p], 0, 4 * p as u32, 1, 16)).collect();
        let mut s = StepSampling { params: rows.iter().flat_map(|(_, p)| p.pack()).collect(), ..Default::default() };
        s.edits.push(Edit { row: 0, token: 28, mul: 1.3, add: 0.5 });
        if logprobs {
            s.logprobs = (0..rows.len()).map(|i| if i == 0 { 5 } else { NO_LOGPROBS }).collect();
        }
        let before = r.backend().bytes_read_back();
        let out = r.execute_sampled(&batch, &s, None).unwrap();
        (out, r.backend().bytes_read_back() - before)
    };
    let (alone, read) = step(&mut gpu, &[(0, seeded)], false);
    assert_eq!(read, 4, "one row: one u32 id");
    let (batched, read) = step(&mut gpu, &[(1, others[0]), (0, seeded), (2, others[1])], false);
    assert_eq!(read, 12, "three rows: three ids");
    assert_eq!(batched.ids[1], alone.ids[0], "the seeded row draws the same token inside a batch");
    assert!(batched.ids.iter().all(|&t| (t as usize) < params.vocab_size));
    let (with_lp, read) = step(&mut gpu, &[(0, seeded), (1, others[0])], true);
    let width = 1 + rserve_kernels::launch::LOGPROBS_MAX_TOP;
    assert_eq!(read as usize, 4 * (2 + 2 * width + 2 * (width - 1)), "ids, then the log-prob rows' values and ids");
    let lp = with_lp.logprobs[0].as_ref().unwrap();
    assert_eq!(lp.top.len(), 5);
    assert!(lp.top.windows(2).all(|w| w[0].1 >= w[1].1) && lp.chosen <= lp.top[0].1 + 1e-6);
    assert!(with_lp.logprobs[1].is_none());
}
