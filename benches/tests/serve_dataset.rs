//! `bench serve` datasets with SmolLM2's tokenizer (from its GGUF): random prompts re-tokenize to exactly the
//! length they were drawn with, lengths stay in the range-ratio window, the same seed gives the same prompts; the
//! ShareGPT reader keeps only multi-turn conversations that pass the length filters, with token counts from the
//! tokenizer.

use std::path::PathBuf;

use rserve_benches::serve::args_dataset::RangeRatio;
use rserve_benches::serve::dataset::{random_requests, sharegpt_requests, RandomSpec};
use rserve_benches::serve::tokenize::BenchTokenizer;
use rserve_tests::smollm2_gguf;

fn tokenizer() -> BenchTokenizer {
    let path = smollm2_gguf();
    BenchTokenizer::load_local(&path).expect("tokenizer")
}

fn spec(seed: u64) -> RandomSpec {
    RandomSpec {
        input_len: 64,
        output_len: 32,
        range_ratio: RangeRatio { input: 0.5, output: 0.5 },
        prefix_len: 0,
        num_prompts: 12,
        seed,
        vocab_size: None,
    }
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
    s.range_ratio = RangeRatio { input: 0.0, output: 0.0 };
    for r in random_requests(&s, &tok).await.expect("dataset") {
        assert_eq!(r.prompt_len, 64);
        assert!(!r.prompt.contains("<|im_start|>") && !r.prompt.contains("<|endoftext|>"), "{:?}", r.prompt);
    }
}

#[tokio::test]
async fn sharegpt_keeps_multi_turn_conversations_that_pass_the_filters() {
    let tok = tokenizer();
    let path = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/sharegpt_small.json"));
    let reqs = sharegpt_requests(&path, 10, None, 0, true, &tok).await.expect("dataset");
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
    let fixed = sharegpt_requests(&path, 10, Some(7), 0, true, &tok).await.expect("dataset");
    assert_eq!(fixed.len(), 4);
    assert!(fixed.iter().all(|r| r.expected_output_len == 7));
    // Asking for fewer gives the first ones of the seeded shuffle.
    assert_eq!(sharegpt_requests(&path, 2, None, 0, true, &tok).await.expect("dataset").len(), 2);
}

/// A temporary file holding `text`, named `name` (removed by the caller's `remove_file`).
fn temp_file(name: &str, text: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("rserve-{}-{name}", std::process::id()));
    std::fs::write(&p, text).expect("write");
    p
}

#[tokio::test]
async fn sonnet_prompts_share_the_prefix_lines_and_fit_the_input_length() {
    use rserve_benches::serve::sonnet::{read_lines, sonnet_requests, SonnetSpec, BASE_PROMPT};
    let tok = tokenizer();
    let text: String = (0..40).map(|i| format!("Line {i} of a sonnet, with a few more words\n")).collect();
    let path = temp_file("sonnet.txt", &text);
    let lines = read_lines(&path).expect("lines");
    std::fs::remove_file(&path).ok();
    assert_eq!(lines.len(), 40);
    let spec = SonnetSpec { input_len: 150, output_len: 9, prefix_len: 60, num_prompts: 6, seed: 1 };
    let plain = |t: &str| Ok(t.to_owned());
    let reqs = sonnet_requests(&lines, &spec, &tok, &plain).await.expect("sonnet");
    assert_eq!(reqs.len(), 6);
    // The prefix is the file's first lines: every prompt starts with the instruction and them.
    let prefix = format!("{BASE_PROMPT}{}{}", lines[0], lines[1]);
    for r in &reqs {
        assert!(r.prompt.starts_with(&prefix), "{:?}", r.prompt);
        assert!(r.prompt_len <= 150 && r.prompt_len > 60, "prompt_len {}", r.prompt_len);
        assert_eq!(r.expected_output_len, 9);
    }
    let too_short = SonnetSpec { input_len: 3, ..spec };
    assert!(sonnet_requests(&lines, &too_short, &tok, &plain).await.is_err());
}

#[tokio::test]
async fn custom_jsonl_reads_prompts_and_names_a_bad_line() {
    use rserve_benches::serve::custom::{custom_requests, read_jsonl};
    let tok = tokenizer();
    let good =
        temp_file("good.jsonl", "{\"prompt\": \"What is 2+2?\", \"output_tokens\": 5}\n\n{\"prompt\": \"00123\"}\n");
    let lines = read_jsonl(&good).expect("jsonl");
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[1].prompt, "00123", "prompts stay strings");
    let plain = |t: &str| Ok(t.to_owned());
    let reqs = custom_requests(&good, &lines, 5, Some(7), (0, false), &tok, &plain).await.expect("custom");
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[0].prompt, "What is 2+2?");
    assert_eq!(reqs[0].expected_output_len, 7);
    assert_eq!(reqs[0].prompt_len, tok.encode("What is 2+2?").await.expect("encode").len());
    // -1: each line's output_tokens, which the second line lacks.
    let err = custom_requests(&good, &lines, 5, None, (0, false), &tok, &plain).await.unwrap_err().to_string();
    assert!(err.contains("output_tokens"), "{err}");
    std::fs::remove_file(&good).ok();
    for (name, text, want) in [
        ("bad1.jsonl", "{\"prompt\": \"ok\"}\n{\"prompt\": oops}\n", "line 2 is not JSON"),
        ("bad2.jsonl", "{\"text\": \"no prompt\"}\n", "line 1 has no \"prompt\""),
        ("bad3.jsonl", "{\"prompt\": 5}\n", "line 1: \"prompt\" must be a string"),
        ("bad4.jsonl", "{\"prompt\": \"a\", \"output_tokens\": \"x\"}\n", "\"output_tokens\" must be an integer"),
        ("bad5.json", "{\"prompt\": \"a\"}\n", "only JSONL"),
    ] {
        let p = temp_file(name, text);
        let err = read_jsonl(&p).unwrap_err().to_string();
        std::fs::remove_file(&p).ok();
        assert!(err.contains(want), "{name}: {err}");
    }
}

#[tokio::test]
async fn random_prompts_start_with_the_shared_prefix() {
    let tok = tokenizer();
    let mut s = spec(9);
    s.prefix_len = 16;
    s.range_ratio = RangeRatio { input: 0.0, output: 0.0 };
    let reqs = random_requests(&s, &tok).await.expect("dataset");
    let ids: Vec<Vec<u32>> = prompt_ids(&tok, &reqs).await;
    for (r, ids) in reqs.iter().zip(&ids) {
        assert_eq!(r.prompt_len, 16 + 64, "{:?}", r.prompt);
        assert_eq!(ids.len(), r.prompt_len);
    }
    let first = &ids[0][..12];
    assert!(ids.iter().all(|i| &i[..12] == first), "every prompt starts with the same prefix tokens");
}

async fn prompt_ids(tok: &BenchTokenizer, reqs: &[rserve_benches::serve::dataset::SampleRequest]) -> Vec<Vec<u32>> {
    let mut out = Vec::new();
    for r in reqs {
        out.push(tok.encode(&r.prompt).await.expect("encode"));
    }
    out
}
