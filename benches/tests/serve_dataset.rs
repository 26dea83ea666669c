//! `bench serve` datasets with SmolLM2's tokenizer (from its GGUF): random prompts re-tokenize to exactly the
//! length they were drawn with, lengths stay in the range-ratio window, the same seed gives the same prompts; the
//! ShareGPT reader keeps only multi-turn conversations that pass the length filters, with token counts from the
//! tokenizer.

use std::path::PathBuf;

use rserve_benches::models::smollm2_gguf;
use rserve_benches::serve::dataset::{random_requests, sharegpt_requests, RandomSpec};
use rserve_benches::serve::tokenize::BenchTokenizer;

fn tokenizer() -> BenchTokenizer {
    let path = smollm2_gguf().unwrap_or_else(|e| panic!("{e}"));
    BenchTokenizer::load_local(&path).expect("tokenizer")
}

fn spec(seed: u64) -> RandomSpec {
    RandomSpec { input_len: 64, output_len: 32, range_ratio: 0.5, num_prompts: 12, seed, vocab_size: None }
}

#[tokio::test]
async fn random_prompts_have_exact_lengths_in_range() {
    let tok = tokenizer();
    let reqs = random_requests(&spec(3), &tok).await.expect("dataset");
    assert_eq!(reqs.len(), 12);
    for r in &reqs {
        assert_eq!(tok.encode(&r.prompt).await.expect("encode").len(), r.prompt_len, "{:?}", r.prompt);
        assert!((32..=96).contains(&r.prompt_len), "prompt_len {}", r.prompt_len);
        assert!((16..=48).contains(&r.expected_output_len), "output_len {}", r.expected_output_len);
    }
    let lens: std::collections::HashSet<usize> = reqs.iter().map(|r| r.prompt_len).collect();
    assert!(lens.len() > 3, "lengths vary with a range ratio: {lens:?}");
    assert_eq!(reqs, random_requests(&spec(3), &tok).await.expect("dataset"));
    assert_ne!(reqs, random_requests(&spec(4), &tok).await.expect("dataset"));
}

#[tokio::test]
async fn random_prompts_avoid_special_tokens() {
    let tok = tokenizer();
    let mut s = spec(5);
    s.range_ratio = 0.0;
    for r in random_requests(&s, &tok).await.expect("dataset") {
        assert_eq!(r.prompt_len, 64);
        assert!(!r.prompt.contains("<|im_start|>") && !r.prompt.contains("<|endoftext|>"), "{:?}", r.prompt);
    }
}

#[tokio::test]
async fn sharegpt_keeps_multi_turn_conversations_that_pass_the_filters() {
    let tok = tokenizer();
    let path = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/sharegpt_small.json"));
    let reqs = sharegpt_requests(&path, 10, None, 0, &tok).await.expect("dataset");
    let mut prompts: Vec<&str> = reqs.iter().map(|r| r.prompt.as_str()).collect();
    prompts.sort();
    assert_eq!(
        prompts,
        vec![
            "Explain what a paged KV cache is in two sentences.",
            "What is the capital of France, and why is it famous?",
            "Write a haiku about a small language model running on two CPU cores.",
        ]
    );
    for r in &reqs {
        assert_eq!(r.prompt_len, tok.encode(&r.prompt).await.expect("encode").len());
    }
    // A fixed output length skips the reply-length filter ("Yes" passes) and replaces the reply's length.
    let fixed = sharegpt_requests(&path, 10, Some(7), 0, &tok).await.expect("dataset");
    assert_eq!(fixed.len(), 4);
    assert!(fixed.iter().all(|r| r.expected_output_len == 7));
    // Asking for fewer gives the first ones of the seeded shuffle.
    assert_eq!(sharegpt_requests(&path, 2, None, 0, &tok).await.expect("dataset").len(), 2);
}
