//! The parsers against whole outputs, and streamed: every output cut at every byte boundary (and fed a character at
//! a time) must add up to the whole split.

use serde_json::{json, Map, Value};

use super::*;

fn reading(parser: ReasoningParser, kwargs: Value) -> ReasoningReading {
    let kwargs: Map<String, Value> = kwargs.as_object().cloned().unwrap_or_default();
    ReasoningReading::new(parser, true, &kwargs, "")
}

fn whole(parser: ReasoningParser, text: &str) -> (Option<String>, Option<String>, Vec<FunctionCall>) {
    reading(parser, json!({"thinking": true})).splitter().split_whole(text)
}

fn s(v: &str) -> Option<String> {
    Some(v.to_owned())
}

/// Streams `pieces` through a fresh splitter; returns the sides concatenated.
fn streamed(parser: ReasoningParser, pieces: &[&str]) -> (Option<String>, Option<String>, Vec<FunctionCall>) {
    let mut split = reading(parser, json!({"thinking": true})).splitter();
    let (mut r, mut c, mut calls) = (String::new(), String::new(), Vec::new());
    let mut all: Vec<ReasoningPiece> = pieces.iter().map(|p| split.push(p)).collect();
    all.push(split.finish());
    for p in all {
        r.push_str(&p.reasoning);
        c.push_str(&p.content);
        calls.extend(p.calls);
    }
    let some = |s: String| (!s.is_empty()).then_some(s);
    (some(r), some(c), calls)
}

const SAMPLES: &[(ReasoningParser, &str)] = &[
    (ReasoningParser::DeepseekR1, "<think>a < b</think>The answer</th"),
    (ReasoningParser::DeepseekR1, "no end <think marker"),
    (ReasoningParser::DeepseekV3, "x</think>y"),
    (ReasoningParser::Qwen3, "I think é</think>\n\nDone <think>kept"),
    (ReasoningParser::Qwen3, "plan<tool_call>\n<function=f>"),
    (ReasoningParser::Qwen3, "says <tool_call> as text</think>ok"),
    (ReasoningParser::Mistral, "pre[THINK]deep [/THINK]post[/THINK]"),
    (ReasoningParser::Mistral, "only [/THINK] end"),
    (
        ReasoningParser::GptOss,
        "<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>commentary to=functions.get \
         <|constrain|>json<|message|>{\"a\": 1}<|call|>",
    ),
    (
        ReasoningParser::GptOss,
        "<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>final<|message|>Hi <|x|>!<|return|>",
    ),
];

#[test]
fn whole_outputs_split_as_vllm_splits_them() {
    use ReasoningParser::*;
    assert_eq!(whole(DeepseekR1, "<think>a</think>b"), (s("a"), s("b"), vec![]));
    assert_eq!(whole(DeepseekR1, "a</think>"), (s("a"), None, vec![]));
    assert_eq!(whole(DeepseekR1, "cut short"), (s("cut short"), None, vec![]));
    assert_eq!(whole(Qwen3, "r</think>\n\nc"), (s("r"), s("\n\nc"), vec![]));
    assert_eq!(whole(Qwen3, "r<tool_call>\n<function=f>"), (s("r"), s("<tool_call>\n<function=f>"), vec![]));
    assert_eq!(whole(Qwen3, "r <tool_call> x"), (s("r <tool_call> x"), None, vec![]));
    assert_eq!(whole(Mistral, "a[THINK]b[/THINK]c"), (s("b"), s("ac"), vec![]));
    assert_eq!(whole(Mistral, "plain"), (None, s("plain"), vec![]));
    assert_eq!(whole(Mistral, "x[/THINK]y"), (None, s("xy"), vec![]));
    assert_eq!(whole(Mistral, "[THINK]open"), (s("open"), None, vec![]));
    let (r, c, calls) = whole(GptOss, SAMPLES[8].1);
    assert_eq!((r, c), (s("think"), None));
    assert_eq!(calls, vec![FunctionCall { name: "get".into(), arguments: "{\"a\": 1}".into() }]);
    assert_eq!(whole(GptOss, SAMPLES[9].1), (s("hm"), s("Hi <|x|>!"), vec![]));
    assert_eq!(whole(GptOss, "no harmony at all"), (None, s("no harmony at all"), vec![]));
}

#[test]
fn thinking_turned_off_or_closed_in_the_prompt_is_all_content() {
    let off = json!({"enable_thinking": false}).as_object().cloned().unwrap();
    let r = ReasoningReading::new(ReasoningParser::Qwen3, true, &off, "");
    assert_eq!(r.splitter().split_whole("a</think>b"), (None, s("a</think>b"), vec![]));
    let none = Map::new();
    let v3 = ReasoningReading::new(ReasoningParser::DeepseekV3, true, &none, "");
    assert_eq!(v3.splitter().split_whole("a</think>b"), (None, s("a</think>b"), vec![]));
    let closed = ReasoningReading::new(ReasoningParser::Qwen3, true, &none, "<think>\n\n</think>\n\n");
    assert!(closed.identity);
    let open = ReasoningReading::new(ReasoningParser::DeepseekR1, true, &none, "</think>old<think>\n");
    assert!(!open.identity);
}

#[test]
fn include_reasoning_false_drops_the_reasoning() {
    let r = ReasoningReading::new(ReasoningParser::DeepseekR1, false, &Map::new(), "");
    assert_eq!(r.splitter().split_whole("a</think>b"), (None, s("b"), vec![]));
}

#[test]
fn every_cut_of_every_sample_adds_up_to_the_whole_split() {
    for &(parser, text) in SAMPLES {
        let expected = whole(parser, text);
        for cut in (0..=text.len()).filter(|&i| text.is_char_boundary(i)) {
            assert_eq!(streamed(parser, &[&text[..cut], &text[cut..]]), expected, "{parser:?} {text:?} cut at {cut}");
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(streamed(parser, &pieces), expected, "{parser:?} {text:?} a character at a time");
    }
}

#[test]
fn reasoning_streams_before_the_end_marker_arrives() {
    let mut split = reading(ReasoningParser::DeepseekR1, json!({})).splitter();
    assert_eq!(split.push("step one ").reasoning, "step one ");
    // `</th` could begin the end marker: held.
    let p = split.push("then </th");
    assert_eq!((p.reasoning.as_str(), p.content.as_str()), ("then ", ""));
    let p = split.push("ink>answer");
    assert_eq!((p.reasoning.as_str(), p.content.as_str()), ("", "answer"));
}
