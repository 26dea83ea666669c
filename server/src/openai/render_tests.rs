//! Shapes of responses and stream chunks, checked field by field against OpenAI's documented objects: ids, `object`,
//! `created`, `model`, the role-first delta, finish chunks, `usage` (null in chunks when asked for, a final
//! choices-less chunk), log-probs, echo, and `[DONE]` last.

use futures_util::StreamExt;
use rserve_engine::api::{FinishReason, RequestEvent, StopReason, TokenLogprob, Usage};
use rserve_engine::TokenId;
use serde_json::{json, Value};

use super::*;
use crate::sse::payloads;

fn meta() -> ResponseMeta {
    ResponseMeta { id: "chatcmpl-1".into(), created: 7, model: "m".into() }
}

fn delta(text: &str) -> RequestEvent {
    RequestEvent::Delta { text: text.into(), token_ids: vec![TokenId(1)], logprobs: Vec::new() }
}

/// A one-token delta with its log-prob and one alternative: (id, text, log-prob) each.
fn logprob_delta(
    (id, text, logprob): (u32, &str, f32),
    (top_id, top_text, top_logprob): (u32, &str, f32),
) -> RequestEvent {
    let lp = TokenLogprob {
        token_id: TokenId(id),
        token: text.into(),
        logprob,
        top: vec![(TokenId(top_id), top_text.into(), top_logprob)],
    };
    RequestEvent::Delta { text: text.into(), token_ids: vec![TokenId(id)], logprobs: vec![lp] }
}

fn finished(reason: FinishReason, completion_tokens: usize) -> RequestEvent {
    RequestEvent::Finished {
        reason,
        usage: Usage { prompt_tokens: 5, completion_tokens, cached_tokens: 0 },
        stop_reason: None,
    }
}

/// Runs a renderer over scripted `(choice, event)`s and returns the parsed payloads (`[DONE]` as a string).
async fn run<R: StreamRenderer>(renderer: R, events: Vec<(usize, RequestEvent)>) -> Vec<Value> {
    let merged = futures_util::stream::iter(events).boxed();
    payloads(renderer, merged)
        .map(|p| if p == "[DONE]" { Value::String(p) } else { serde_json::from_str(&p).expect("JSON payload") })
        .collect()
        .await
}

#[tokio::test]
async fn chat_stream_shape() {
    let r = ChatStream::new(meta(), 2, 5, false, false);
    let out = run(
        r,
        vec![
            (0, delta("Hi")),
            (1, delta("Yo")),
            (0, finished(FinishReason::Stop, 1)),
            (1, finished(FinishReason::Length, 1)),
        ],
    )
    .await;
    assert_eq!(out.len(), 7);
    for c in &out[..6] {
        assert_eq!(c["id"], "chatcmpl-1");
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(c["created"], 7);
        assert_eq!(c["model"], "m");
        assert!(c.get("usage").is_none(), "usage only with include_usage: {c}");
        assert_eq!(c["choices"].as_array().map(Vec::len), Some(1));
    }
    assert_eq!(
        out[0]["choices"][0],
        json!({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null, "stop_reason": null})
    );
    assert_eq!(out[1]["choices"][0]["index"], 1);
    assert_eq!(out[1]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(
        out[2]["choices"][0],
        json!({"index": 0, "delta": {"content": "Hi"}, "logprobs": null, "finish_reason": null, "stop_reason": null})
    );
    assert_eq!(out[3]["choices"][0]["delta"], json!({"content": "Yo"}));
    assert_eq!(
        out[4]["choices"][0],
        json!({"index": 0, "delta": {}, "logprobs": null, "finish_reason": "stop", "stop_reason": null})
    );
    assert_eq!(out[5]["choices"][0]["finish_reason"], "length");
    assert_eq!(out[6], json!("[DONE]"));
}

#[tokio::test]
async fn chat_stream_usage_and_logprobs() {
    let ev = logprob_delta((3, "Hi", -0.1), (3, "Hi", -0.1));
    let r = ChatStream::new(meta(), 1, 5, true, true);
    let out = run(r, vec![(0, ev), (0, delta("")), (0, finished(FinishReason::Stop, 2))]).await;
    // role, "Hi", finish, usage, [DONE]: the empty delta without log-probs is not sent.
    assert_eq!(out.len(), 5);
    for c in &out[..3] {
        assert!(c["usage"].is_null() && c.get("usage").is_some(), "usage must be null: {c}");
    }
    assert_eq!(out[1]["choices"][0]["logprobs"]["content"][0]["token"], "Hi");
    assert_eq!(
        out[1]["choices"][0]["logprobs"]["content"][0]["top_logprobs"][0]["logprob"]
            .as_f64()
            .map(|x| (x * 10.0).round()),
        Some(-1.0)
    );
    assert_eq!(out[3]["choices"], json!([]));
    assert_eq!(
        out[3]["usage"],
        json!({"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7, "prompt_tokens_details": {"cached_tokens": 0}})
    );
    assert_eq!(out[4], json!("[DONE]"));
}

#[tokio::test]
async fn stream_error_stops_the_stream() {
    let r = ChatStream::new(meta(), 2, 5, true, false);
    let out = run(r, vec![(0, delta("a")), (1, RequestEvent::Error("boom".into())), (0, delta("never"))]).await;
    let last_two = &out[out.len() - 2..];
    assert_eq!(last_two[0]["error"]["type"], "InternalServerError");
    assert!(last_two[0]["error"]["message"].as_str().is_some_and(|m| m.contains("boom")));
    assert_eq!(last_two[1], json!("[DONE]"));
    assert!(!out.iter().any(|c| c.to_string().contains("never")));
}

#[tokio::test]
async fn completion_stream_shape_with_echo_and_logprobs() {
    let m = ResponseMeta { id: "cmpl-1".into(), created: 7, model: "m".into() };
    let prompts = vec![ValidPrompt { token_count: 3, echo: Some("ab".into()) }];
    let ev = logprob_delta((9, "c", -0.5), (8, "d", -0.25));
    let stop = RequestEvent::Finished {
        reason: FinishReason::Stop,
        usage: Usage { prompt_tokens: 3, completion_tokens: 1, cached_tokens: 0 },
        stop_reason: Some(StopReason::Text("\n".into())),
    };
    // The echo waits for its prompt's scores (echo with logprobs asks the engine for them).
    let b = TokenLogprob { token_id: TokenId(2), token: "b".into(), logprob: -1.0, top: vec![] };
    let prompt = RequestEvent::PromptLogprobs { first: "a".into(), scored: vec![b] };
    let out = run(CompletionStream::new(m, &prompts, 1, true, true), vec![(0, prompt), (0, ev), (0, stop)]).await;
    assert_eq!(out.len(), 5);
    for c in &out[..3] {
        assert_eq!(c["object"], "text_completion");
        assert_eq!(c["id"], "cmpl-1");
        assert!(c["usage"].is_null());
    }
    assert_eq!(out[0]["choices"][0]["text"], "ab");
    assert_eq!(
        out[0]["choices"][0]["logprobs"],
        json!({"tokens": ["a", "b"], "token_logprobs": [null, -1.0], "top_logprobs": [null, {"b": -1.0}], "text_offset": [0, 1]})
    );
    assert_eq!(out[1]["choices"][0]["text"], "c");
    assert_eq!(
        out[1]["choices"][0]["logprobs"],
        json!({"tokens": ["c"], "token_logprobs": [-0.5], "top_logprobs": [{"d": -0.25, "c": -0.5}], "text_offset": [2]})
    );
    assert_eq!(out[2]["choices"][0]["finish_reason"], "stop");
    assert_eq!(out[2]["choices"][0]["stop_reason"], "\n");
    assert_eq!(out[3]["usage"]["total_tokens"], 4);
    assert_eq!(out[4], json!("[DONE]"));
}

#[test]
fn chat_response_shape() {
    let outputs = vec![
        ChoiceOutput {
            text: "Hello".into(),
            finish: Some(FinishReason::Stop),
            usage: Usage { prompt_tokens: 5, completion_tokens: 2, cached_tokens: 1 },
            ..Default::default()
        },
        ChoiceOutput {
            text: "Hey".into(),
            finish: Some(FinishReason::Length),
            usage: Usage { prompt_tokens: 5, completion_tokens: 3, cached_tokens: 0 },
            ..Default::default()
        },
        ChoiceOutput {
            text: "Hi".into(),
            finish: Some(FinishReason::Stop),
            stop_reason: Some(StopReason::Token(TokenId(42))),
            ..Default::default()
        },
    ];
    let v =
        serde_json::to_value(chat_response(meta(), 5, outputs, false, &ToolReading::default(), None)).expect("json");
    // vLLM: null when EOS ended the choice, the id (a number) for a stop token id, the string for a stop string.
    assert_eq!(v["choices"][2]["stop_reason"], json!(42));
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["id"], "chatcmpl-1");
    assert_eq!(
        v["choices"][0],
        json!({"index": 0, "message": {"role": "assistant", "content": "Hello", "tool_calls": [], "reasoning": null}, "logprobs": null, "finish_reason": "stop", "stop_reason": null})
    );
    assert_eq!(v["choices"][1]["finish_reason"], "length");
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10, "prompt_tokens_details": {"cached_tokens": 1}})
    );
}

#[test]
fn completion_response_shape() {
    let m = ResponseMeta { id: "cmpl-1".into(), created: 7, model: "m".into() };
    let prompts =
        vec![ValidPrompt { token_count: 3, echo: None }, ValidPrompt { token_count: 4, echo: Some("P".into()) }];
    let out = |t: &str| ChoiceOutput {
        text: t.into(),
        finish: Some(FinishReason::Length),
        usage: Usage { prompt_tokens: 0, completion_tokens: 1, cached_tokens: 0 },
        ..Default::default()
    };
    let v = serde_json::to_value(completion_response(m.clone(), &prompts, 1, vec![out("a"), out("b")], false, false))
        .expect("json");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(
        v["choices"][0],
        json!({"index": 0, "text": "a", "logprobs": null, "finish_reason": "length", "stop_reason": null})
    );
    assert_eq!(v["choices"][1]["text"], "Pb");
    assert_eq!(v["usage"]["prompt_tokens"], 7);
    assert_eq!(v["usage"]["completion_tokens"], 2);
    // `max_tokens: 0` with echo and logprobs: the scored prompt alone, the engine's one token left out.
    let tl = |id: u32, text: &str, lp: f32| TokenLogprob {
        token_id: TokenId(id),
        token: text.into(),
        logprob: lp,
        top: vec![],
    };
    let scored = ChoiceOutput {
        logprobs: vec![tl(9, "x", -0.5)],
        prompt_logprobs: Some(("P".into(), vec![tl(4, "q", -2.0)])),
        ..out("x")
    };
    let v = serde_json::to_value(completion_response(m, &prompts[1..], 1, vec![scored], true, true)).expect("json");
    let c = &v["choices"][0];
    assert_eq!((c["text"].as_str(), c["finish_reason"].as_str()), (Some("P"), Some("length")));
    assert_eq!(c["logprobs"]["tokens"], json!(["P", "q"]));
    assert_eq!(c["logprobs"]["token_logprobs"], json!([null, -2.0]));
    assert_eq!(c["prompt_logprobs"][1]["4"]["logprob"], json!(-2.0));
    assert_eq!(v["usage"]["completion_tokens"], 0);
}

#[test]
fn ids_have_openai_prefixes() {
    let a = ResponseMeta::new("chatcmpl", "m".into());
    let b = ResponseMeta::new("chatcmpl", "m".into());
    assert!(a.id.starts_with("chatcmpl-") && a.id.len() == "chatcmpl-".len() + 32);
    assert_ne!(a.id, b.id);
    assert!(a.created > 1_600_000_000);
}

#[test]
fn the_head_comes_first_and_in_order() {
    let choice = CompletionChoice {
        index: 0,
        text: "a".into(),
        logprobs: None,
        prompt_logprobs: None,
        finish_reason: None,
        stop_reason: None,
    };
    let chunk = CompletionResponse { head: meta().head("text_completion"), choices: vec![choice], usage: None };
    assert_eq!(
        to_json(&chunk),
        r#"{"id":"chatcmpl-1","object":"text_completion","created":7,"model":"m","choices":[{"index":0,"text":"a","logprobs":null,"finish_reason":null,"stop_reason":null}]}"#
    );
    let v = to_json(&chat_response(meta(), 1, Vec::new(), false, &ToolReading::default(), None));
    assert_eq!(
        v,
        r#"{"id":"chatcmpl-1","object":"chat.completion","created":7,"model":"m","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":0,"total_tokens":1,"prompt_tokens_details":{"cached_tokens":0}}}"#
    );
}
