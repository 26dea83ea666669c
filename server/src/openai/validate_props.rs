//! Hostile request bodies (issue #28 item 4): property tests that build chat and completion bodies from hostile
//! values (extremes, wrong types, nesting) and run them through the edge's deserialisation and validation. Every body
//! is refused with an error or becomes engine requests the engine can run: never a panic. Bounded to a few hundred
//! cases, seconds in CI.

use proptest::prelude::*;
use serde_json::{json, Value};

use super::*;
use crate::testing::FakeEngine;

const MAX_MODEL_LEN: usize = 64;

fn hostile_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        Just(json!(0)),
        Just(json!(-1)),
        Just(json!(1)),
        Just(json!(2)),
        Just(json!(i64::MIN)),
        Just(json!(u64::MAX)),
        Just(json!(1e308)),
        Just(json!(-1e-308)),
        Just(json!(0.5)),
        (-5i64..200).prop_map(Value::from),
        Just(json!("")),
        Just(json!("hi")),
        Just(json!("\u{0}\u{ffff}")),
        "[a-z\\[\\]{}\"\\\\<|>]{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(2, 12, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::hash_map("[a-z_]{1,8}", inner, 0..3).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

const FIELDS: &[&str] = &[
    "max_tokens",
    "max_completion_tokens",
    "min_tokens",
    "n",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "logprobs",
    "top_logprobs",
    "prompt_logprobs",
    "logit_bias",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "truncate_prompt_tokens",
    "stream",
    "stream_options",
    "echo",
    "best_of",
    "suffix",
    "response_format",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "structured_outputs",
    "tools",
    "tool_choice",
    "ignore_eos",
    "skip_special_tokens",
    "add_generation_prompt",
    "continue_final_message",
    "chat_template_kwargs",
];

/// A body with some hostile fields; `base` holds what makes it a chat or a completion request.
fn body(base: Value) -> impl Strategy<Value = Value> {
    prop::collection::vec((prop::sample::select(FIELDS), hostile_value()), 0..6).prop_map(move |fields| {
        let mut b = base.clone();
        let obj = b.as_object_mut().expect("object");
        for (k, v) in fields {
            obj.insert(k.to_owned(), v);
        }
        b
    })
}

fn messages() -> impl Strategy<Value = Value> {
    let role = prop_oneof![
        Just(json!("user")),
        Just(json!("system")),
        Just(json!("assistant")),
        Just(json!("tool")),
        hostile_value()
    ];
    let msg = (role, hostile_value(), prop::option::of(hostile_value())).prop_map(|(role, content, tool_calls)| {
        let mut m = json!({"role": role, "content": content});
        if let Some(tc) = tool_calls {
            m["tool_calls"] = tc;
        }
        m
    });
    prop_oneof![prop::collection::vec(msg, 0..4).prop_map(Value::Array), hostile_value()]
}

fn prompt() -> impl Strategy<Value = Value> {
    prop_oneof![
        "[a-z ]{0,40}".prop_map(Value::from),
        prop::collection::vec(-3i64..80, 0..70).prop_map(|v| json!(v)),
        prop::collection::vec(prop::collection::vec(-3i64..80, 0..5), 0..3).prop_map(|v| json!(v)),
        hostile_value(),
    ]
}

/// What every accepted request must satisfy for the engine: a prompt, a token to generate, room in the context.
fn runnable(requests: &[GenerateRequest]) -> std::result::Result<(), TestCaseError> {
    for r in requests {
        prop_assert!(!r.prompt_token_ids.is_empty());
        prop_assert!(r.stop.max_tokens >= 1);
        prop_assert!(r.prompt_token_ids.len() + r.stop.max_tokens <= MAX_MODEL_LEN, "{r:?}");
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn hostile_chat_bodies_are_refused_or_runnable(msgs in messages(), b in body(json!({"model": "m"}))) {
        let mut b = b;
        b["messages"] = msgs;
        if let Ok(req) = serde_json::from_value::<ChatCompletionRequest>(b) {
            if let Ok(valid) = chat(&req, &FakeEngine::new(MAX_MODEL_LEN), &Default::default(), None) {
                runnable(&valid.requests)?;
            }
        }
    }

    #[test]
    fn hostile_completion_bodies_are_refused_or_runnable(p in prompt(), b in body(json!({"model": "m"}))) {
        let mut b = b;
        b["prompt"] = p;
        if let Ok(req) = serde_json::from_value::<CompletionRequest>(b) {
            if let Ok(valid) = completion(&req, &FakeEngine::new(MAX_MODEL_LEN)) {
                runnable(&valid.requests)?;
            }
        }
    }
}
