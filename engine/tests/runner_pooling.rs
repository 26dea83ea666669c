//! A pooling step (`StepRunner::pool`): the final-normed hidden rows it returns are the ones the LM head reads (the
//! last row times the LM head gives the same logits as a generation step), a prompt pooled in two chunks (through
//! the KV cache) returns the same rows as in one step, and only the rows asked for come back. SmolLM2 (float32) on
//! the CPU and on OpenCL (Intel's CPU runtime).

mod backends;
mod common;

use common::smollm2::load_f32 as load;
use rserve_engine::backend::cpu::CpuBackend;
use rserve_engine::backend::Backend;
use rserve_engine::model::{BlockId, ScheduledSeq, TokenId};
use rserve_engine::runner::{ModelRunner, PoolRows, StepRunner};
use rserve_scheduler::RequestId;

const BS: usize = 16;
const PROMPTS: [&[u32]; 2] = [&[1, 504, 3458, 282, 1345, 28, 29, 30, 31, 32], &[1, 2683, 314, 260]];

fn seq(i: usize, tokens: &[u32], start: usize) -> ScheduledSeq {
    let ids = tokens.iter().copied().map(TokenId).collect();
    let mut s = ScheduledSeq::new(ids, start, BlockId::run(2 * i as u32, 2), BS);
    s.request_id = RequestId(i as u64 + 1);
    s
}

fn close(a: &[f32], b: &[f32], tol: f32) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol * (1.0 + y.abs()))
}

/// One runner throughout (a device runner is slow to build): each step names its sequences' whole tables, so a
/// step over the same blocks rewrites what an earlier one cached.
fn check<B: Backend>(mut r: ModelRunner<B>, lm_head: &[f32], hidden: usize, vocab: usize)
where
    ModelRunner<B>: StepRunner,
{
    // Whole prompts in one step: every row of the first, the last row of the second.
    let batch: Vec<ScheduledSeq> = PROMPTS.iter().enumerate().map(|(i, p)| seq(i, p, 0)).collect();
    let whole = r.pool(&batch, &[PoolRows::All, PoolRows::Last], &[]).unwrap();
    assert_eq!(whole[0].len(), PROMPTS[0].len() * hidden);
    assert_eq!(whole[1].len(), hidden);
    // The last row times the LM head: the logits a generation step computes for that sequence.
    let logits = r.execute(&batch).unwrap();
    for (i, last) in [&whole[0][(PROMPTS[0].len() - 1) * hidden..], &whole[1][..]].into_iter().enumerate() {
        let ours: Vec<f32> = (0..vocab)
            .map(|v| lm_head[v * hidden..(v + 1) * hidden].iter().zip(last).map(|(w, x)| w * x).sum())
            .collect();
        assert!(close(&ours, &logits[i * vocab..(i + 1) * vocab], 1e-3), "sequence {i}: hidden x LM head vs logits");
    }
    // The first prompt in two chunks of 6 and 4 tokens: the same rows, the second chunk's keys from the cache.
    let split = 6;
    let first = r.pool(&[seq(0, &PROMPTS[0][..split], 0)], &[PoolRows::All], &[]).unwrap();
    let second = r.pool(&[seq(0, &PROMPTS[0][split..], split)], &[PoolRows::All], &[]).unwrap();
    let chunked: Vec<f32> = first[0].iter().chain(&second[0]).copied().collect();
    assert!(close(&chunked, &whole[0], 1e-4), "two chunks vs one step");
    // First and nothing.
    let rows = r.pool(&batch, &[PoolRows::First, PoolRows::Nothing], &[]).unwrap();
    assert!(close(&rows[0], &whole[0][..hidden], 1e-4));
    assert!(rows[1].is_empty());
}

fn lm_head() -> (Vec<f32>, usize, usize) {
    let (params, weights) = load();
    let t = weights.lm_head().unwrap().to_dtype(candle_core::DType::F32).unwrap();
    let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    (v, params.hidden_size, params.vocab_size)
}

#[test]
fn pooled_rows_on_the_cpu_are_the_lm_heads_input_in_any_chunking() {
    let (params, weights) = load();
    let (head, hidden, vocab) = lm_head();
    check(ModelRunner::new(CpuBackend::new(), &params, &weights, 8, BS).unwrap(), &head, hidden, vocab);
}

#[test]
fn pooled_rows_on_opencl_are_the_lm_heads_input_in_any_chunking() {
    let Some(_) = backends::opencl() else { return };
    let (params, weights) = load();
    let (head, hidden, vocab) = lm_head();
    check(ModelRunner::new(backends::opencl().unwrap(), &params, &weights, 8, BS).unwrap(), &head, hidden, vocab);
}

#[test]
fn pooling_rows_must_match_the_batch() {
    let (params, weights) = load();
    let mut r = ModelRunner::new(CpuBackend::new(), &params, &weights, 8, BS).unwrap();
    let e = r.pool(&[seq(0, PROMPTS[0], 0)], &[], &[]).unwrap_err();
    assert!(e.to_string().contains("pooling rows"), "{e}");
}
