//! Criterion benchmark of the CPU's token choice on Llama 3's vocabulary (128,256 logits a row): one row's draw
//! (`sampling::draw::sample_row`) greedy, at temperature 1, and at 0.7 / top_p 0.9, on near-uniform logits (a
//! random-weight model's, the sampler's worst case: the nucleus holds most of the vocabulary) and on peaked ones (a
//! trained model's); and a whole step of 64 rows through `Op::SampleRows` on the CPU backend (rows in parallel).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rserve_engine::backend::cpu::CpuBackend;
use rserve_engine::backend::{Backend, Op};
use rserve_engine::sampling::draw::sample_row;
use rserve_engine::sampling::RowParams;

const VOCAB: usize = 128_256;

fn logits(spread: f32, seed: u32) -> Vec<f32> {
    // A fixed pseudo-random row (xorshift): values in [-spread, spread], plus a few standout tokens.
    let mut x = seed.wrapping_mul(2_654_435_761).max(1);
    (0..VOCAB)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let v = (x as f32 / u32::MAX as f32 * 2.0 - 1.0) * spread;
            if i % 997 == 0 {
                v + 4.0 * spread
            } else {
                v
            }
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let kinds = [
        ("greedy", RowParams::GREEDY),
        ("t1", RowParams { temperature: 1.0, seed: 3, ..RowParams::GREEDY }),
        ("t07_p09", RowParams { temperature: 0.7, top_p: 0.9, seed: 3, ..RowParams::GREEDY }),
        ("t07_k50", RowParams { temperature: 0.7, top_k: 50, seed: 3, ..RowParams::GREEDY }),
    ];
    let mut g = c.benchmark_group("sample_row_128k");
    g.throughput(Throughput::Elements(1));
    for (shape, spread) in [("uniform", 0.5f32), ("peaked", 6.0)] {
        let row = logits(spread, 1);
        for (name, p) in kinds {
            let mut w = Vec::new();
            let mut position = 0;
            g.bench_function(format!("{shape}/{name}"), |b| {
                b.iter(|| {
                    position += 1;
                    black_box(sample_row(black_box(&row), &RowParams { position, ..p }, &mut w))
                })
            });
        }
    }
    g.finish();

    let rows = 64;
    let cpu = CpuBackend::new();
    let all: Vec<f32> = (0..rows as u32).flat_map(|r| logits(0.5, r + 1)).collect();
    let x = cpu.upload_f32(&all).unwrap();
    let ids = cpu.alloc_u32_output(rows).unwrap();
    let mut g = c.benchmark_group("sample_step_64x128k");
    g.throughput(Throughput::Elements(rows as u64));
    for (name, p) in kinds {
        let params: Vec<u32> = (0..rows as u64).flat_map(|r| RowParams { seed: r, ..p }.pack()).collect();
        let params = cpu.upload_u32(&params).unwrap();
        g.bench_function(name, |b| {
            b.iter(|| cpu.run(Op::SampleRows { logits: &x, params: &params, ids: &ids, rows, vocab: VOCAB }).unwrap())
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
