//! Criterion benchmarks of the tokenizer built from SmolLM2's GGUF metadata (`Tokenizer::from_gguf`):
//! encode a short chat-sized sentence and a ~1k-token text, decode the ~1k tokens in one call, and stream them
//! through the incremental detokenizer one id at a time (the per-token cost the engine pays while streaming).

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rserve_engine::config::gguf_meta::read_gguf_header;
use rserve_engine::tokenizer::{IncrementalDetokenizer, Tokenizer};
use rserve_tests::smollm2_gguf;

const SENTENCE: &str = "What is the capital of France? Answer in one short sentence, please.";
const PARAGRAPH: &str = "The paged KV cache splits every sequence's keys and values into fixed-size blocks, so memory \
is allocated on demand and freed the moment a request finishes. A scheduler with a token budget mixes prefill chunks \
with decode tokens in one batch; when blocks run out, the newest request is preempted and recomputed later. Numbers \
like 3.14159, dates like 2026-12-02, code like `fn main() { println!(\"hi\"); }` and accents (café, naïve, Zürich) \
exercise the byte-level pre-tokenizer. ";

fn load() -> Tokenizer {
    let path = smollm2_gguf();
    let content = read_gguf_header(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Tokenizer::from_gguf(&content).unwrap_or_else(|e| panic!("tokenizer from {}: {e}", path.display()))
}

fn bench_tokenizer(c: &mut Criterion) {
    let tok = Arc::new(load());
    let long: String = PARAGRAPH.repeat(10);
    let ids = tok.encode(&long, false).expect("encode");
    let mut g = c.benchmark_group("tokenizer");
    g.throughput(Throughput::Elements(tok.encode(SENTENCE, false).expect("encode").len() as u64));
    g.bench_function("encode_sentence", |b| b.iter(|| tok.encode(black_box(SENTENCE), false).expect("encode")));
    g.throughput(Throughput::Elements(ids.len() as u64));
    g.bench_function(format!("encode_{}_tokens", ids.len()), |b| {
        b.iter(|| tok.encode(black_box(&long), false).expect("encode"))
    });
    g.bench_function(format!("decode_{}_tokens", ids.len()), |b| {
        b.iter(|| tok.decode(black_box(&ids), false).expect("decode"))
    });
    g.bench_function(format!("incremental_decode_{}_tokens", ids.len()), |b| {
        b.iter(|| {
            let mut d = IncrementalDetokenizer::new(tok.clone(), true);
            let mut n = 0;
            for &id in &ids {
                n += d.push(id).expect("push").len();
            }
            n + d.finish().expect("finish").len()
        })
    });
    g.finish();
}

criterion_group!(benches, bench_tokenizer);
criterion_main!(benches);
