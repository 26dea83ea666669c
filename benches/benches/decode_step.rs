//! Criterion benchmark of one full decode step of SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized to f32 as the
//! engine serves it) on the CPU backend: `ModelRunner::execute` for 1 and 16 sequences, each with a 128-token
//! prompt already in the paged KV cache, computing one new token (embedding, 30 layers, LM head, logits back).
//! Each iteration writes the same cache slot again, so the context stays at 129 tokens.

use std::time::Duration;

use candle_core::DType;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rserve_engine::backend::cpu::CpuBackend;
use rserve_engine::model::{BlockId, ScheduledSeq, TokenId};
use rserve_engine::runner::{ModelRunner, StepRunner};
use rserve_engine::source::{resolve_model, ResolveOptions};
use rserve_tests::smollm2_gguf;

const BS: usize = 16;
const PROMPT_LEN: usize = 128;
const MAX_BATCH: usize = 16;

/// Sequence `i` owns blocks `i * blocks_per_seq ..`; `tokens` start at `start`.
fn seq(i: usize, tokens: &[u32], start: usize, blocks_per_seq: usize) -> ScheduledSeq {
    ScheduledSeq::new(
        tokens.iter().copied().map(TokenId).collect(),
        start,
        BlockId::run((i * blocks_per_seq) as u32, blocks_per_seq),
        BS,
    )
}

fn bench_decode(c: &mut Criterion) {
    let path = smollm2_gguf();
    let path_str = path.to_str().expect("utf-8 model path");
    let resolved = resolve_model(path_str, &ResolveOptions::with_cache_dir(std::env::temp_dir())).expect("resolve");
    let params = resolved.load_params().expect("params");
    let weights = rserve_engine::weights::load(&resolved, &params, DType::F32).expect("weights");
    let blocks_per_seq = (PROMPT_LEN + 1).div_ceil(BS);
    let mut runner =
        ModelRunner::new(CpuBackend::new(), &params, &weights, MAX_BATCH * blocks_per_seq, BS).expect("runner");
    // Prefill every sequence's prompt (distinct prompts) once.
    let prompts: Vec<Vec<u32>> = (0..MAX_BATCH)
        .map(|i| (0..PROMPT_LEN as u32).map(|t| 200 + (i as u32 * 131 + t * 17) % 40_000).collect())
        .collect();
    let prefill: Vec<ScheduledSeq> = prompts.iter().enumerate().map(|(i, p)| seq(i, p, 0, blocks_per_seq)).collect();
    runner.execute(&prefill).expect("prefill");

    let mut g = c.benchmark_group("decode_step");
    g.sample_size(20).warm_up_time(Duration::from_secs(2)).measurement_time(Duration::from_secs(8));
    for batch in [1usize, MAX_BATCH] {
        let step: Vec<ScheduledSeq> = (0..batch).map(|i| seq(i, &[42], PROMPT_LEN, blocks_per_seq)).collect();
        g.throughput(Throughput::Elements(batch as u64));
        g.bench_function(BenchmarkId::new("smollm2_ctx129", format!("batch{batch}")), |b| {
            b.iter(|| runner.execute(&step).expect("decode step"))
        });
    }
    g.finish();
}

criterion_group!(benches, bench_decode);
criterion_main!(benches);
