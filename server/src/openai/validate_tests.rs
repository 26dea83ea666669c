//! One test per validation rule (the rule's error, its param and its message), plus the happy paths that show how
//! requests become engine requests.

use serde_json::json;

use super::*;
use crate::testing::{ids, FakeEngine, VOCAB};

fn chat_req(v: serde_json::Value) -> ChatCompletionRequest {
    serde_json::from_value(v).expect("valid JSON shape")
}

fn compl_req(v: serde_json::Value) -> CompletionRequest {
    serde_json::from_value(v).expect("valid JSON shape")
}

fn chat_with(extra: serde_json::Value) -> Result<ValidChat> {
    let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    chat(&chat_req(body), &FakeEngine::new(64), &Default::default(), None)
}

fn compl_with(extra: serde_json::Value) -> Result<ValidCompletion> {
    let mut body = json!({"model": "m", "prompt": "hi"});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    completion(&compl_req(body), &FakeEngine::new(64))
}

/// Asserts the error, and that its param is named and its message names the field.
fn refused(r: Result<impl std::fmt::Debug>, want: ValidationError, param: &str) {
    let e = r.expect_err("must be refused");
    assert_eq!(e, want);
    assert_eq!(e.param().as_deref(), Some(param));
    let msg = e.to_string();
    let named = msg.contains(param) || param == "messages" || param == "prompt";
    assert!(named, "message {msg:?} does not name {param}");
}

#[test]
fn defaults_come_from_the_engine_and_max_tokens_fills_the_context() {
    let v = chat_with(json!({})).expect("valid");
    assert_eq!(v.requests.len(), 1);
    let r = &v.requests[0];
    // "<s>user: hi\nassistant:" is 22 tokens with the fake tokenizer; no second BOS is added.
    assert_eq!(r.prompt_token_ids.len(), 22);
    assert_eq!(r.prompt_token_ids.iter().filter(|&&t| t == TokenId(0)).count(), 0, "the template wrote the BOS text");
    assert_eq!(v.prompt_tokens, 22);
    assert_eq!(r.stop.max_tokens, 64 - 22);
    assert_eq!(r.sampling.temperature, 0.7);
    assert_eq!(r.sampling.top_p, 0.9);
    assert!(r.stop.skip_special_tokens);
    assert!(!v.stream && !v.include_usage && v.logprobs.is_none());
}

#[test]
fn max_new_tokens_of_the_generation_config_is_the_default_and_an_override_caps_every_request() {
    let body = |extra: serde_json::Value| {
        let mut b = json!({"model": "m", "prompt": "hi"});
        if let (Some(b), Some(e)) = (b.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        compl_req(b)
    };
    let max_tokens =
        |engine: &FakeEngine, extra| completion(&body(extra), engine).expect("valid").requests[0].stop.max_tokens;
    let prompt = completion(&body(json!({})), &FakeEngine::new(64)).expect("valid").requests[0].prompt_token_ids.len();
    // The model's generation_config.json `max_new_tokens`: the default only, never more than the room left.
    let mut engine = FakeEngine::new(64);
    engine.info.default_max_tokens = Some(7);
    assert_eq!(max_tokens(&engine, json!({})), 7);
    assert_eq!(max_tokens(&engine, json!({"max_tokens": 20})), 20);
    engine.info.default_max_tokens = Some(1000);
    assert_eq!(max_tokens(&engine, json!({})), 64 - prompt);
    // `--override-generation-config`'s `max_new_tokens` (vLLM's `override_max_tokens`): a cap on every request.
    engine.info.max_tokens_cap = Some(5);
    assert_eq!(max_tokens(&engine, json!({})), 5);
    assert_eq!(max_tokens(&engine, json!({"max_tokens": 20})), 5);
    assert_eq!(max_tokens(&engine, json!({"max_tokens": 3})), 3);
}

#[test]
fn request_fields_reach_the_engine_request() {
    let v = chat_with(json!({
        "max_completion_tokens": 5, "max_tokens": 9, "temperature": 0, "top_p": 0.5, "top_k": 3, "min_p": 0.1,
        "presence_penalty": 1.0, "frequency_penalty": -1.0, "repetition_penalty": 1.2, "seed": 42,
        "logit_bias": {"7": 5.0, "3": -100}, "stop": ["x", "yz"], "stop_token_ids": [5], "ignore_eos": true,
        "min_tokens": 2, "n": 3, "logprobs": true, "top_logprobs": 4, "stream": true,
        "stream_options": {"include_usage": true}, "skip_special_tokens": false, "user": "u"
    }))
    .expect("valid");
    assert_eq!(v.requests.len(), 3);
    let r = &v.requests[0];
    assert_eq!(r.stop.max_tokens, 5, "max_completion_tokens wins over max_tokens");
    assert_eq!(r.sampling.temperature, 0.0);
    assert_eq!(r.sampling.top_p, 0.5);
    assert_eq!(r.sampling.top_k, 3);
    assert!((r.sampling.min_p - 0.1).abs() < 1e-6);
    assert_eq!(r.sampling.presence_penalty, 1.0);
    assert_eq!(r.sampling.frequency_penalty, -1.0);
    assert!((r.sampling.repetition_penalty - 1.2).abs() < 1e-6);
    assert_eq!(r.sampling.logit_bias, vec![(TokenId(3), -100.0), (TokenId(7), 5.0)]);
    assert_eq!(r.stop.stop, vec!["x".to_string(), "yz".to_string()]);
    assert_eq!(r.stop.stop_token_ids, ids(&[5]));
    assert!(r.stop.ignore_eos);
    assert_eq!(r.stop.min_tokens, 2);
    assert!(!r.stop.skip_special_tokens);
    assert_eq!(r.sampling.logprobs, Some(4));
    assert_eq!(v.logprobs, Some(4));
    assert!(v.stream && v.include_usage);
    let seeds: Vec<_> = v.requests.iter().map(|r| r.sampling.seed).collect();
    assert_eq!(seeds, vec![Some(42), Some(43), Some(44)], "each choice gets its own derived seed");
}

#[test]
fn top_k_minus_one_disables() {
    assert_eq!(chat_with(json!({"top_k": -1})).expect("valid").requests[0].sampling.top_k, 0);
}

#[test]
fn content_parts_are_joined() {
    let engine = FakeEngine::new(64);
    let req = chat_req(json!({"messages": [
        {"role": "system", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": null}
    ]}));
    let v = chat(&req, &engine, &Default::default(), None).expect("valid");
    let text = engine.decode(&v.requests[0].prompt_token_ids, false).expect("decodes");
    assert_eq!(text, "<s>system: a\nb\nuser: c\nassistant: \nassistant:");
}

#[test]
fn rule_temperature() {
    refused(chat_with(json!({"temperature": 2.5})), ValidationError::TemperatureOutOfRange(2.5), "temperature");
    refused(chat_with(json!({"temperature": -0.1})), ValidationError::TemperatureOutOfRange(-0.1), "temperature");
}

#[test]
fn rule_top_p() {
    refused(chat_with(json!({"top_p": 0})), ValidationError::TopPOutOfRange(0.0), "top_p");
    refused(chat_with(json!({"top_p": 1.01})), ValidationError::TopPOutOfRange(1.01), "top_p");
}

#[test]
fn rule_top_k() {
    refused(chat_with(json!({"top_k": -2})), ValidationError::TopKOutOfRange(-2), "top_k");
}

#[test]
fn rule_min_p() {
    refused(chat_with(json!({"min_p": 1.5})), ValidationError::MinPOutOfRange(1.5), "min_p");
}

#[test]
fn rule_penalties() {
    use ValidationError as V;
    for (body, want, param) in [
        (json!({"presence_penalty": 3}), V::PresencePenaltyOutOfRange(3.0), "presence_penalty"),
        (json!({"frequency_penalty": -2.5}), V::FrequencyPenaltyOutOfRange(-2.5), "frequency_penalty"),
        (json!({"repetition_penalty": 0}), V::RepetitionPenaltyOutOfRange(0.0), "repetition_penalty"),
    ] {
        refused(chat_with(body), want, param);
    }
}

#[test]
fn rule_n() {
    refused(chat_with(json!({"n": 0})), ValidationError::NOutOfRange(0), "n");
    refused(chat_with(json!({"n": 129})), ValidationError::NOutOfRange(129), "n");
}

#[test]
fn rule_max_tokens() {
    for (field, value) in [("max_tokens", 0), ("max_completion_tokens", -3)] {
        refused(chat_with(json!({ field: value })), ValidationError::MaxTokensTooSmall { field, value }, field);
    }
}

#[test]
fn rule_min_tokens() {
    refused(chat_with(json!({"min_tokens": -1})), ValidationError::MinTokensNegative(-1), "min_tokens");
    refused(
        chat_with(json!({"min_tokens": 5, "max_tokens": 4})),
        ValidationError::MinTokensAboveMaxTokens { min_tokens: 5, max_tokens: 4 },
        "min_tokens",
    );
    // Without max_tokens, min_tokens is capped to the room left in the context.
    let v = chat_with(json!({"min_tokens": 1000})).expect("valid");
    assert_eq!(v.requests[0].stop.min_tokens, v.requests[0].stop.max_tokens);
}

#[test]
fn rule_logit_bias() {
    use ValidationError as V;
    let max_id = VOCAB - 1;
    for (bias, want) in [
        (json!({"abc": 1}), V::LogitBiasKeyInvalid { key: "abc".into(), max_id }),
        (json!({"259": 1}), V::LogitBiasKeyInvalid { key: "259".into(), max_id }),
        (json!({"5": 101}), V::LogitBiasValueOutOfRange { key: "5".into(), value: 101.0 }),
    ] {
        refused(chat_with(json!({ "logit_bias": bias })), want, "logit_bias");
    }
}

#[test]
fn rule_logprobs() {
    refused(
        chat_with(json!({"logprobs": true, "top_logprobs": 21})),
        ValidationError::TopLogprobsOutOfRange(21, 20),
        "top_logprobs",
    );
    refused(chat_with(json!({"top_logprobs": 2})), ValidationError::TopLogprobsWithoutLogprobs, "top_logprobs");
    assert_eq!(chat_with(json!({"logprobs": true})).expect("valid").logprobs, Some(0));
    assert_eq!(chat_with(json!({"logprobs": false, "top_logprobs": 0})).expect("valid").logprobs, None);
    refused(compl_with(json!({"logprobs": 21})), ValidationError::LogprobsOutOfRange(21, 20), "logprobs");
    refused(compl_with(json!({"logprobs": -1})), ValidationError::LogprobsOutOfRange(-1, 20), "logprobs");
    assert_eq!(compl_with(json!({"logprobs": 3})).expect("valid").requests[0].sampling.logprobs, Some(3));
}

#[test]
fn rule_token_ids_in_vocabulary() {
    let max_id = VOCAB - 1;
    refused(
        chat_with(json!({"stop_token_ids": [259]})),
        ValidationError::TokenIdOutOfRange { param: "stop_token_ids", value: 259, max_id },
        "stop_token_ids",
    );
    refused(
        compl_with(json!({"prompt": [1, -4]})),
        ValidationError::TokenIdOutOfRange { param: "prompt", value: -4, max_id },
        "prompt",
    );
    refused(
        compl_with(json!({"prompt": [[1], [1, 1000]]})),
        ValidationError::TokenIdOutOfRange { param: "prompt", value: 1000, max_id },
        "prompt",
    );
}

#[test]
fn rule_stop_strings() {
    refused(chat_with(json!({"stop": ""})), ValidationError::StopStringEmpty, "stop");
    let many: Vec<String> = (0..65).map(|i| format!("s{i}")).collect();
    refused(chat_with(json!({"stop": many})), ValidationError::TooManyStopStrings(65), "stop");
    assert_eq!(chat_with(json!({"stop": "END"})).expect("valid").requests[0].stop.stop, vec!["END".to_string()]);
}

#[test]
fn rule_stream_options() {
    refused(
        chat_with(json!({"stream_options": {"include_usage": true}})),
        ValidationError::StreamOptionsWithoutStream,
        "stream_options",
    );
}

#[test]
fn rule_best_of() {
    refused(compl_with(json!({"n": 2, "best_of": 1})), ValidationError::BestOfBelowN { best_of: 1, n: 2 }, "best_of");
    refused(
        compl_with(json!({"best_of": 3})),
        ValidationError::Unsupported { field: "best_of".into(), what: "best_of greater than n".into() },
        "best_of",
    );
    assert!(compl_with(json!({"n": 2, "best_of": 2})).is_ok());
}

#[test]
fn rule_too_many_choices() {
    let prompts: Vec<&str> = vec!["a"; 3];
    refused(compl_with(json!({"prompt": prompts, "n": 100})), ValidationError::TooManyChoices(300), "n");
}

#[test]
fn rule_messages() {
    refused(
        chat(&chat_req(json!({"messages": []})), &FakeEngine::new(64), &Default::default(), None),
        ValidationError::MessagesEmpty,
        "messages",
    );
    refused(
        chat_with(
            json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}),
        ),
        ValidationError::ContentPartUnsupported { index: 0, kind: "image_url".into() },
        "messages",
    );
    refused(
        chat_with(json!({"messages": [{"role": "user", "content": [{"type": "text"}]}]})),
        ValidationError::ContentPartMissingText { index: 0 },
        "messages",
    );
    let mut engine = FakeEngine::new(64);
    engine.has_template = false;
    let req = chat_req(json!({"messages": [{"role": "user", "content": "hi"}]}));
    refused(chat(&req, &engine, &Default::default(), None), ValidationError::NoChatTemplate, "messages");
    refused(
        chat_with(json!({"messages": [{"role": "bogus", "content": "x"}]})),
        ValidationError::ChatTemplate("chat template: unknown role bogus".into()),
        "messages",
    );
}

#[test]
fn rule_prompt_empty() {
    refused(compl_with(json!({"prompt": []})), ValidationError::PromptEmpty("prompt"), "prompt");
    refused(compl_with(json!({"prompt": [[]]})), ValidationError::PromptEmpty("prompt"), "prompt");
    refused(
        compl_with(json!({"prompt": "", "add_special_tokens": false})),
        ValidationError::PromptEmpty("prompt"),
        "prompt",
    );
}

#[test]
fn rule_context_length() {
    // "hi" is 3 tokens with BOS; the context is 64.
    let e = compl_with(json!({"max_tokens": 62})).expect_err("too long");
    assert_eq!(
        e,
        ValidationError::ContextLengthExceeded { param: "prompt", prompt_tokens: 3, max_tokens: 62, max_model_len: 64 }
    );
    let msg = e.to_string();
    assert!(
        msg.contains("64")
            && msg.contains("65")
            && msg.contains("62")
            && msg.contains("(3 in the input, 62 in the completion)"),
        "{msg}"
    );
    assert_eq!(compl_with(json!({"max_tokens": 61})).expect("fits").requests[0].stop.max_tokens, 61);

    let long = "x".repeat(63);
    let e = compl_with(json!({"prompt": long})).expect_err("no room");
    assert_eq!(e, ValidationError::PromptTooLong { param: "prompt", prompt_tokens: 64, max_model_len: 64 });
    let e = chat_with(json!({"messages": [{"role": "user", "content": "y".repeat(100)}]})).expect_err("too long");
    assert_eq!(e.param().as_deref(), Some("messages"));
}

#[test]
fn rule_unsupported_fields() {
    let cases = [
        (json!({"functions": [{"name": "f"}]}), "functions"),
        (json!({"function_call": "auto"}), "function_call"),
        (json!({"chat_template": "{{ messages }}"}), "chat_template"),
    ];
    for (body, param) in cases {
        let e = chat_with(body.clone()).expect_err("unsupported");
        assert!(matches!(e, ValidationError::Unsupported { .. }), "{body}: {e:?}");
        assert_eq!(e.param().as_deref(), Some(param));
        assert!(e.to_string().contains("not supported"), "{e}");
    }
    // Empty or "none" values are no request for the feature.
    assert!(chat_with(json!({"tools": [], "tool_choice": "none", "response_format": {"type": "text"}})).is_ok());
    // Without --enable-auto-tool-choice, tools alone are no tool choice; "auto" is refused by name.
    assert!(chat_with(json!({"tools": [{"type": "function", "function": {"name": "f"}}]})).is_ok());
    let e = chat_with(json!({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto"}));
    assert_eq!(e.expect_err("auto without a parser").param().as_deref(), Some("tool_choice"));
    let e = compl_with(json!({"suffix": "x"})).expect_err("unsupported");
    assert_eq!(e.param().as_deref(), Some("suffix"));
    // echo with logprobs scores the prompt (vLLM's prompt_logprobs), as lm-evaluation-harness asks.
    let ok = compl_with(json!({"echo": true, "logprobs": 1, "max_tokens": 0})).expect("echo with logprobs");
    assert_eq!(ok.requests[0].sampling.prompt_logprobs, Some(1));
    assert!(ok.prompt_only);
    assert_eq!(ok.requests[0].stop.max_tokens, 1);
    let e = compl_with(json!({"max_tokens": 0})).expect_err("max_tokens 0 without echo");
    assert_eq!(e.param().as_deref(), Some("max_tokens"));
}

#[test]
fn prompt_logprobs_are_checked_on_both_routes() {
    assert!(compl_with(json!({"prompt_logprobs": 0})).is_ok());
    assert_eq!(chat_with(json!({"prompt_logprobs": 2})).unwrap().requests[0].sampling.prompt_logprobs, Some(2));
    for bad in [json!({"prompt_logprobs": -2}), json!({"prompt_logprobs": "1"}), json!({"prompt_logprobs": 100000})] {
        for e in [chat_with(bad.clone()).expect_err("chat"), compl_with(bad.clone()).expect_err("completion")] {
            assert_eq!(e.param().as_deref(), Some("prompt_logprobs"), "{bad}");
        }
    }
}

#[test]
fn rule_vllm_output_options_are_refused_not_ignored() {
    let cases = [json!({"use_beam_search": true}), json!({"logits_processors": ["p"]})];
    for body in cases {
        let field = body.as_object().unwrap().keys().next().unwrap().clone();
        for e in [chat_with(body.clone()).expect_err("chat"), compl_with(body.clone()).expect_err("completion")] {
            assert!(matches!(e, ValidationError::Unsupported { .. }), "{body}: {e:?}");
            assert_eq!(e.param().as_deref(), Some(field.as_str()), "{body}");
        }
    }
    // The values that ask for nothing are accepted, as the defaults they are.
    let neutral = json!({"guided_json": null, "bad_words": [], "include_stop_str_in_output": false,
        "use_beam_search": false, "response_format": {"type": "text"}});
    assert!(chat_with(neutral.clone()).is_ok());
    assert!(compl_with(neutral).is_ok());
}

#[test]
fn vllm_output_options_reach_the_engine_request() {
    for v in [
        compl_with(json!({"allowed_token_ids": [7, 3, 7], "bad_words": ["ab"], "include_stop_str_in_output": true,
        "truncate_prompt_tokens": 2, "prompt": "xyz"}))
        .expect("valid")
        .requests,
        chat_with(json!({"allowed_token_ids": [7, 3],
        "bad_words": ["ab"], "include_stop_str_in_output": true, "truncate_prompt_tokens": 2}))
        .expect("valid")
        .requests,
    ] {
        let r = &v[0];
        assert_eq!(r.sampling.allowed_token_ids, Some(ids(&[3, 7])));
        // The fake tokenizer: one token per byte; " ab" is a different sequence of another length, so only "ab".
        assert_eq!(r.sampling.bad_words, vec![ids(&[b'a' as u32 + 3, b'b' as u32 + 3])]);
        assert!(r.stop.include_stop_str_in_output);
        assert_eq!(r.prompt_token_ids.len(), 2, "the last two prompt tokens are kept");
    }
    let field = |body: serde_json::Value| compl_with(body).expect_err("invalid").param().unwrap();
    assert_eq!(field(json!({"allowed_token_ids": []})), "allowed_token_ids");
    assert_eq!(field(json!({"allowed_token_ids": [100000]})), "allowed_token_ids");
    assert_eq!(field(json!({"bad_words": [""]})), "bad_words");
    assert_eq!(field(json!({"bad_words": "x"})), "bad_words");
    assert_eq!(field(json!({"truncate_prompt_tokens": 0})), "truncate_prompt_tokens");
    assert_eq!(field(json!({"truncate_prompt_tokens": 100000})), "truncate_prompt_tokens");
    assert_eq!(field(json!({"include_stop_str_in_output": "yes"})), "include_stop_str_in_output");
}

#[test]
fn chat_template_options_shape_the_prompt() {
    let msgs = json!([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "The answer is"}]);
    let body = json!({"messages": msgs, "add_generation_prompt": false, "continue_final_message": true,
        "chat_template_kwargs": {"enable_thinking": false}, "documents": [{"title": "t"}], "echo": true});
    let v = chat(&chat_req(body), &FakeEngine::new(4096), &Default::default(), None).expect("valid");
    let text = rendered(&v);
    assert!(text.ends_with("assistant: The answer is"), "cut after the final message: {text:?}");
    assert!(text.contains("enable_thinking=false") && text.contains("documents=[{"), "{text}");
    assert_eq!(v.echo.as_deref(), Some("The answer is"), "the last message has the response's role");
    let e = chat_with(json!({"messages": msgs, "continue_final_message": true})).expect_err("with a generation prompt");
    assert_eq!(e.param().as_deref(), Some("continue_final_message"));
    let v = chat_with(json!({"messages": msgs, "echo": true, "add_generation_prompt": true})).expect("valid");
    assert_eq!(v.echo.as_deref(), Some("The answer is"));
    let v = chat_with(json!({"messages": [{"role": "user", "content": "hi"}], "echo": true})).expect("valid");
    assert_eq!(v.echo.as_deref(), Some(""), "a user message is not the response's role");
    assert_eq!(
        chat_with(json!({"chat_template_kwargs": [1]})).unwrap_err().param().as_deref(),
        Some("chat_template_kwargs")
    );
}

#[test]
fn rule_structured_outputs_reach_the_grammar_engine() {
    // The fake engine compiles no grammar, so each form that asks for a constraint comes back as the compile error,
    // named by its field: none is dropped on the way.
    let cases = [
        (json!({"guided_json": {"type": "object"}}), "guided_json"),
        (json!({"guided_regex": "[0-9]+"}), "guided_regex"),
        (json!({"guided_choice": ["yes", "no"]}), "guided_choice"),
        (json!({"guided_grammar": "start: \"a\""}), "guided_grammar"),
        (json!({"structured_outputs": {"choice": ["a", "b"]}}), "structured_outputs"),
        (json!({"response_format": {"type": "json_object"}}), "response_format"),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}),
            "response_format",
        ),
    ];
    for (body, field) in cases {
        for e in [chat_with(body.clone()).expect_err("chat"), compl_with(body.clone()).expect_err("completion")] {
            assert!(matches!(e, ValidationError::StructuredOutput { .. }), "{body}: {e:?}");
            assert_eq!(e.param().as_deref(), Some(field), "{body}");
            assert!(e.to_string().contains("compiles no grammar"), "{e}");
        }
    }
}

#[test]
fn completion_prompts_fan_out_prompt_major() {
    let v = compl_with(json!({"prompt": ["ab", "c"], "n": 2, "echo": true, "seed": 5})).expect("valid");
    assert_eq!(v.requests.len(), 4);
    assert_eq!(
        v.prompts,
        vec![
            ValidPrompt { token_count: 3, echo: Some("ab".into()) },
            ValidPrompt { token_count: 2, echo: Some("c".into()) },
        ]
    );
    assert_eq!(v.requests[0].prompt_token_ids, ids(&[0, b'a' as u32 + 3, b'b' as u32 + 3]));
    assert_eq!(v.requests[1].prompt_token_ids, v.requests[0].prompt_token_ids);
    assert_eq!(v.requests[2].prompt_token_ids, ids(&[0, b'c' as u32 + 3]));
    let seeds: Vec<_> = v.requests.iter().map(|r| r.sampling.seed).collect();
    assert_eq!(seeds, vec![Some(5), Some(6), Some(5), Some(6)]);

    let v = compl_with(json!({"prompt": [[5, 6], [7]], "echo": true})).expect("valid");
    assert_eq!(v.requests[1].prompt_token_ids, ids(&[7]));
    assert_eq!(v.prompts[0].echo.as_deref(), Some("\u{2}\u{3}"));
    let v = compl_with(json!({"prompt": "hi", "add_special_tokens": false})).expect("valid");
    assert_eq!(v.requests[0].prompt_token_ids.len(), 2);
}

#[test]
fn detokenize_ids_are_checked() {
    let info = crate::testing::info(64);
    assert_eq!(token_ids("tokens", &[1, 2], &info), Ok(ids(&[1, 2])));
    refused(
        token_ids("tokens", &[1, 300], &info),
        ValidationError::TokenIdOutOfRange { param: "tokens", value: 300, max_id: VOCAB - 1 },
        "tokens",
    );
}

/// The fake engine's render of a chat request's prompt.
fn rendered(v: &ValidChat) -> String {
    FakeEngine::new(64).decode(&v.requests[0].prompt_token_ids, false).unwrap()
}

fn tool_conversation() -> serde_json::Value {
    json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
            {"id": "c2", "type": "function", "function": {"name": "get_time", "arguments": "oops"}}
        ]},
        {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": [{"type": "text", "text": "18 C"}]},
        {"role": "tool", "content": "noon"},
        {"role": "assistant", "content": "Sunny.", "tool_calls": []}
    ])
}

#[test]
fn tool_calls_and_tool_results_reach_the_template() {
    let v =
        chat(&chat_req(json!({"messages": tool_conversation()})), &FakeEngine::new(4096), &Default::default(), None)
            .expect("valid");
    let want = "<s>user: Weather in Paris?\nassistant:  [call c1 get_weather({\"city\":\"Paris\"})] \
                [call c2 get_time({})]\ntool[c1]: 18 C\ntool: noon\nassistant: Sunny.\nassistant:";
    assert_eq!(rendered(&v), want);

    let req = chat_req(json!({"messages": tool_conversation()}));
    let turns = chat_turns(&req.messages).expect("valid");
    assert_eq!(turns[2].name.as_deref(), Some("get_weather"));
    assert_eq!(turns[2].tool_call_id.as_deref(), Some("c1"));
    assert_eq!(turns[4].tool_calls, None, "an empty list is no tool calls");
    let tools = [json!({"type": "function", "function": {"name": "get_weather"}})];
    let ids = chat_prompt_with_tools(&FakeEngine::new(4096), &turns, Some(&tools), true).expect("renders");
    let text = FakeEngine::new(64).decode(&ids, false).unwrap();
    assert!(text.starts_with("<s>tools: get_weather\nuser: "), "{text}");
}

#[test]
fn rule_tool_call_shapes() {
    let cases = [
        (json!("x"), "messages[1].tool_calls"),
        (json!([1]), "messages[1].tool_calls[0]"),
        (json!([{"type": "function", "function": {"name": "f", "arguments": "{}"}}]), "messages[1].tool_calls[0].id"),
        (json!([{"id": "c", "function": {"name": "f", "arguments": "{}"}}]), "messages[1].tool_calls[0].type"),
        (json!([{"id": "c", "type": "custom", "custom": {}}]), "messages[1].tool_calls[0].type"),
        (json!([{"id": "c", "type": "function"}]), "messages[1].tool_calls[0].function"),
        (
            json!([{"id": "c", "type": "function", "function": {"arguments": "{}"}}]),
            "messages[1].tool_calls[0].function.name",
        ),
        (
            json!([{"id": "c", "type": "function", "function": {"name": "f"}}]),
            "messages[1].tool_calls[0].function.arguments",
        ),
        (
            json!([{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                   {"id": "d", "type": "function", "function": {"name": "g", "arguments": {"a": 1}}}]),
            "messages[1].tool_calls[1].function.arguments",
        ),
    ];
    for (calls, field) in cases {
        let messages = json!([{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": calls}]);
        let e = chat_with(json!({ "messages": messages })).expect_err("bad tool call");
        assert!(matches!(e, ValidationError::ToolCallShape { .. }), "{calls}: {e:?}");
        assert_eq!(e.param().as_deref(), Some(field), "{calls}");
        assert!(e.to_string().starts_with(&format!("{field} must be ")), "{e}");
    }
}
