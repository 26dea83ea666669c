//! Unit tests of the Responses conversion (request → chat request), the store, the rendering of chat output and
//! the stream event writer.

use serde_json::{json, Value};

use super::convert::{rename_error, to_chat};
use super::render::{answer_message, status_of, Draft};
use super::store::{ResponseStore, Stored};
use super::stream::{read_chunk, ChatPiece, EventWriter};
use super::types::{Echo, ResponseStatus, ResponsesRequest};
use crate::error::ApiError;
use crate::openai::types::MessageContent;
use crate::openai::validate::ValidationError;

fn request(v: Value) -> ResponsesRequest {
    serde_json::from_value(v).expect("request")
}

fn text(m: &crate::openai::types::ChatMessageIn) -> &str {
    match &m.content {
        Some(MessageContent::Text(t)) => t,
        _ => "",
    }
}

fn param(e: ApiError) -> Option<String> {
    e.body().error.param
}

fn echo() -> Echo {
    Echo {
        instructions: None,
        max_output_tokens: 16,
        metadata: None,
        parallel_tool_calls: true,
        previous_response_id: None,
        reasoning: None,
        service_tier: "auto".into(),
        store: true,
        temperature: 1.0,
        text: json!({"format": {"type": "text"}}),
        tool_choice: json!("auto"),
        tools: Vec::new(),
        top_p: 1.0,
        truncation: "disabled",
        user: None,
    }
}

#[test]
fn a_string_input_is_one_user_message_behind_the_instructions() {
    let c = to_chat(&request(json!({"input": "hi", "instructions": "be brief", "max_output_tokens": 5})), None)
        .expect("ok");
    let roles: Vec<_> = c.chat.messages.iter().map(|m| (m.role.as_str(), text(m))).collect();
    assert_eq!(roles, [("system", "be brief"), ("user", "hi")]);
    assert_eq!(c.chat.sampling.max_completion_tokens, Some(5));
    assert_eq!(c.conversation.len(), 1, "instructions are not part of the stored conversation");
    assert!(c.store && !c.stream);
}

#[test]
fn items_become_chat_turns_with_calls_joined_to_their_assistant_message() {
    let input = json!([
        {"role": "developer", "content": "rules"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"},
                                                          {"type": "input_text", "text": "b"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "let me see"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{\"x\":1}"},
        {"type": "function_call_output", "call_id": "c1", "output": "42"},
    ]);
    let c = to_chat(&request(json!({"input": input})), None).expect("ok");
    let m = &c.chat.messages;
    assert_eq!(m.iter().map(|m| m.role.as_str()).collect::<Vec<_>>(), ["developer", "user", "assistant", "tool"]);
    assert_eq!(text(&m[1]), "a\nb");
    assert_eq!(text(&m[2]), "let me see");
    let calls = m[2].tool_calls.as_ref().and_then(Value::as_array).expect("calls");
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[1], json!({"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{\"x\":1}"}}));
    assert_eq!(m[3].tool_call_id.as_deref(), Some("c1"));
    assert_eq!(text(&m[3]), "42");
}

#[test]
fn a_function_call_without_an_assistant_message_before_it_opens_one() {
    let input = json!([{"role": "user", "content": "q"},
                       {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}]);
    let c = to_chat(&request(json!({"input": input})), None).expect("ok");
    assert_eq!(c.chat.messages[1].role, "assistant");
    assert_eq!(text(&c.chat.messages[1]), "");
    assert!(c.chat.messages[1].tool_calls.is_some());
}

#[test]
fn tools_choice_format_and_effort_become_chat_fields() {
    let req = request(json!({
        "input": "x",
        "tools": [{"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"},
                   "strict": null}],
        "tool_choice": {"type": "function", "name": "f"},
        "text": {"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}, "strict": true}},
        "reasoning": {"effort": "low"},
        "temperature": 0.5, "top_p": 0.9, "seed": 3, "stop": ["\n"], "stream": true,
    }));
    let c = to_chat(&req, None).expect("ok");
    assert_eq!(
        c.chat.tools,
        Some(json!([{"type": "function",
                     "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}]))
    );
    assert_eq!(c.chat.tool_choice, Some(json!({"type": "function", "function": {"name": "f"}})));
    assert_eq!(
        c.chat.sampling.response_format,
        Some(json!({"type": "json_schema", "json_schema": {"name": "out", "schema": {"type": "object"}}}))
    );
    assert_eq!(c.chat.reasoning_effort, Some(json!("low")));
    assert_eq!(
        (c.chat.sampling.temperature, c.chat.sampling.top_p, c.chat.sampling.seed),
        (Some(0.5), Some(0.9), Some(3))
    );
    assert_eq!(c.chat.sampling.stream, Some(true));
    assert!(c.stream);
    assert_eq!(c.tools.len(), 1, "the response repeats the tools as sent");
}

#[test]
fn json_object_and_text_formats() {
    let c = to_chat(&request(json!({"input": "x", "text": {"format": {"type": "json_object"}}})), None).expect("ok");
    assert_eq!(c.chat.sampling.response_format, Some(json!({"type": "json_object"})));
    let c = to_chat(&request(json!({"input": "x", "text": {"format": {"type": "text"}}})), None).expect("ok");
    assert_eq!(c.chat.sampling.response_format, None);
}

#[test]
fn tool_choice_none_hides_the_tools_from_the_template() {
    let req = request(json!({"input": "x", "tool_choice": "none",
                             "tools": [{"type": "function", "name": "f"}]}));
    let c = to_chat(&req, None).expect("ok");
    assert_eq!((c.chat.tools, c.chat.tool_choice), (None, None));
    assert_eq!(c.tool_choice, json!("none"));
}

#[test]
fn a_partial_assistant_message_is_continued() {
    let input = json!([{"role": "user", "content": "q"},
                       {"type": "message", "role": "assistant", "status": "incomplete",
                        "content": [{"type": "output_text", "text": "The answer is"}]}]);
    let c = to_chat(&request(json!({"input": input})), None).expect("ok");
    assert_eq!(c.chat.continue_final_message, Some(json!(true)));
    assert_eq!(c.chat.add_generation_prompt, Some(false));
    let c = to_chat(&request(json!({"input": "q"})), None).expect("ok");
    assert_eq!((c.chat.continue_final_message, c.chat.add_generation_prompt), (None, Some(true)));
}

#[test]
fn a_previous_response_comes_before_the_new_input() {
    let store = ResponseStore::with_capacity(4);
    let first = to_chat(&request(json!({"input": "one", "instructions": "sys"})), None).expect("ok");
    let draft = Draft::new("m".into(), echo());
    let response = draft.object(
        ResponseStatus::Completed,
        vec![super::render::message_item("two".into(), super::types::ItemStatus::Completed)],
        None,
    );
    let mut conversation = first.conversation;
    conversation.push(answer_message(&response.output));
    store.put(Stored { response: response.clone(), conversation });
    let prev = store.get(&response.id).expect("stored");
    let second =
        to_chat(&request(json!({"input": "three", "previous_response_id": response.id.as_str()})), Some(&prev))
            .expect("ok");
    let turns: Vec<_> = second.chat.messages.iter().map(|m| (m.role.as_str(), text(m))).collect();
    assert_eq!(turns, [("user", "one"), ("assistant", "two"), ("user", "three")], "instructions are not inherited");
}

#[test]
fn bad_requests_name_the_responses_field() {
    let cases = [
        (json!({}), "input"),
        (json!({"input": []}), "input"),
        (json!({"input": 3}), "input"),
        (json!({"input": [{"role": "robot", "content": "x"}]}), "input[0].role"),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]}),
            "input[0].content[0].type",
        ),
        (json!({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}), "input[0].call_id"),
        (json!({"input": [{"type": "item_reference", "id": "x"}]}), "input[0].type"),
        (json!({"input": "x", "max_output_tokens": 0}), "max_output_tokens"),
        (json!({"input": "x", "tools": [{"type": "web_search"}]}), "tools[0].type"),
        (json!({"input": "x", "tool_choice": {"type": "file_search"}}), "tool_choice"),
        (json!({"input": "x", "text": {"format": {"type": "json_schema", "name": "n"}}}), "text.format.schema"),
        (json!({"input": "x", "text": {"format": {"type": "yaml"}}}), "text.format.type"),
        (json!({"input": "x", "background": true}), "background"),
        (json!({"input": "x", "include": ["message.output_text.logprobs"]}), "include"),
        (json!({"input": "x", "truncation": "auto"}), "truncation"),
        (json!({"input": "x", "priority": 3}), "priority"),
        (
            json!({"input": "x", "text": {"format": {"type": "json_object"}}, "structured_outputs": {"regex": "a"}}),
            "text.format",
        ),
    ];
    for (body, field) in cases {
        let e = to_chat(&request(body.clone()), None).expect_err(&body.to_string());
        assert_eq!(e.status(), 400, "{body}");
        assert_eq!(param(e).as_deref(), Some(field), "{body}");
    }
    let ok = to_chat(&request(json!({"input": "x", "priority": 0, "background": false, "include": []})), None);
    assert!(ok.is_ok(), "values that change nothing are accepted");
}

#[test]
fn chat_errors_are_renamed_to_responses_fields() {
    let rename = |e: ValidationError| param(rename_error(e));
    assert_eq!(rename(ValidationError::MessagesEmpty).as_deref(), Some("input"));
    assert_eq!(
        rename(ValidationError::MaxTokensTooSmall { field: "max_completion_tokens", value: 0 }).as_deref(),
        Some("max_output_tokens")
    );
    let e =
        ValidationError::StructuredOutput { field: "response_format.json_schema.schema".into(), message: "x".into() };
    assert_eq!(rename(e).as_deref(), Some("text.format.schema"));
    let e = ValidationError::StructuredOutput { field: "response_format".into(), message: "bad".into() };
    assert_eq!(rename_error(e).to_string(), "text.format: bad", "the message names the field as sent");
    let e = ValidationError::InvalidField { field: "reasoning_effort".into(), message: "x".into() };
    assert_eq!(rename(e).as_deref(), Some("reasoning.effort"));
    let e = ValidationError::Tools { field: "tools[1].function.parameters".into(), message: "x".into() };
    assert_eq!(rename(e).as_deref(), Some("tools[1].parameters"));
    assert_eq!(rename(ValidationError::TemperatureOutOfRange(3.0)).as_deref(), Some("temperature"));
}

#[test]
fn the_store_keeps_the_most_recently_used() {
    let store = ResponseStore::with_capacity(2);
    let put = |store: &ResponseStore| {
        let r = Draft::new("m".into(), echo()).object(ResponseStatus::Completed, Vec::new(), None);
        store.put(Stored { response: r.clone(), conversation: Vec::new() });
        r.id
    };
    let (a, b) = (put(&store), put(&store));
    assert!(store.get(&a).is_some(), "touching a makes b the oldest");
    let c = put(&store);
    assert_eq!(store.len(), 2);
    assert!(store.get(&b).is_none());
    assert!(store.get(&a).is_some() && store.get(&c).is_some());
}

#[test]
fn length_makes_a_response_incomplete() {
    assert_eq!(status_of(Some("length")), ResponseStatus::Incomplete);
    assert_eq!(status_of(Some("stop")), ResponseStatus::Completed);
    assert_eq!(status_of(Some("tool_calls")), ResponseStatus::Completed);
    let r = Draft::new("m".into(), echo()).object(ResponseStatus::Incomplete, Vec::new(), None);
    let v = serde_json::to_value(&r).expect("json");
    assert_eq!(v["incomplete_details"], json!({"reason": "max_output_tokens"}));
    assert_eq!(v["object"], "response");
    assert!(v["id"].as_str().is_some_and(|id| id.starts_with("resp_")));
}

#[test]
fn chat_chunks_are_read_back_into_pieces() {
    let chunk = json!({"choices": [{"index": 0, "delta": {"reasoning": "r", "content": "c",
        "tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}},
                       {"index": 0, "function": {"arguments": "{}"}}]}, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 1}}});
    assert_eq!(
        read_chunk(&chunk.to_string()),
        [
            ChatPiece::Reasoning("r".into()),
            ChatPiece::Content("c".into()),
            ChatPiece::CallStart { index: 0, id: "call_1".into(), name: "f".into(), arguments: String::new() },
            ChatPiece::CallArgs { index: 0, arguments: "{}".into() },
            ChatPiece::Finish("tool_calls".into()),
            ChatPiece::Usage { prompt: 3, completion: 4, cached: 1 },
        ]
    );
    let role = json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}], "usage": null});
    assert!(read_chunk(&role.to_string()).is_empty(), "the opening role chunk says nothing");
    let err = json!({"error": {"message": "boom", "code": 500}});
    assert!(matches!(read_chunk(&err.to_string()).as_slice(), [ChatPiece::Error(_)]));
}

fn kinds(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["type"].as_str().unwrap_or("?")).collect()
}

#[test]
fn a_streamed_answer_is_told_in_openai_order() {
    let mut w = EventWriter::new(Draft::new("m".into(), echo()));
    let mut events = w.start();
    for piece in [
        ChatPiece::Reasoning("think".into()),
        ChatPiece::Reasoning("ing".into()),
        ChatPiece::Content("Hel".into()),
        ChatPiece::Content("lo".into()),
        ChatPiece::CallStart { index: 0, id: "call_1".into(), name: "f".into(), arguments: "{\"a\"".into() },
        ChatPiece::CallArgs { index: 0, arguments: ":1}".into() },
        ChatPiece::Finish("stop".into()),
        ChatPiece::Usage { prompt: 5, completion: 7, cached: 0 },
    ] {
        events.extend(w.piece(piece));
    }
    let (done, response) = w.complete(2);
    events.extend(done);
    assert_eq!(
        kinds(&events),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.reasoning_text.delta",
            "response.reasoning_text.delta",
            "response.reasoning_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    let seq: Vec<_> = events.iter().map(|e| e["sequence_number"].as_u64().expect("seq")).collect();
    assert_eq!(seq, (0..events.len() as u64).collect::<Vec<_>>());
    assert_eq!(events[0]["response"]["status"], "in_progress");
    assert_eq!(events[13]["text"], "Hello");
    assert_eq!(events[13]["output_index"], 1);
    assert_eq!(events[19]["arguments"], "{\"a\":1}");
    let last = &events[21]["response"];
    assert_eq!(last["status"], "completed");
    assert_eq!(last["usage"]["input_tokens"], 5);
    assert_eq!(last["usage"]["output_tokens"], 7);
    assert_eq!(last["usage"]["total_tokens"], 12);
    assert_eq!(last["usage"]["output_tokens_details"]["reasoning_tokens"], 2);
    let types: Vec<_> = last["output"].as_array().expect("output").iter().map(|i| i["type"].clone()).collect();
    assert_eq!(types, [json!("reasoning"), json!("message"), json!("function_call")]);
    assert_eq!(last["output"][2]["call_id"], "call_1");
    assert_eq!(response.expect("response").output.len(), 3);
    assert_eq!(w.reasoning(), "thinking");
}

#[test]
fn an_engine_error_ends_the_stream_without_completing() {
    let mut w = EventWriter::new(Draft::new("m".into(), echo()));
    let mut events = w.start();
    events.extend(w.piece(ChatPiece::Content("a".into())));
    events.extend(w.piece(ChatPiece::Error(json!({"message": "boom", "code": 500, "param": null}))));
    let (done, response) = w.complete(0);
    assert!(done.is_empty() && response.is_none());
    let last = events.last().expect("event");
    assert_eq!((last["type"].as_str(), last["message"].as_str()), (Some("error"), Some("boom")));
}

#[test]
fn a_cut_stream_completes_as_incomplete() {
    let mut w = EventWriter::new(Draft::new("m".into(), echo()));
    w.start();
    w.piece(ChatPiece::Content("a".into()));
    w.piece(ChatPiece::Finish("length".into()));
    let (events, response) = w.complete(0);
    assert_eq!(kinds(&events), ["response.completed"], "the message closed at the finish");
    assert_eq!(response.expect("response").status, ResponseStatus::Incomplete);
}

#[test]
fn an_answer_with_calls_is_stored_as_one_assistant_turn() {
    use super::render::{function_call, message_item, reasoning_item};
    use super::types::ItemStatus::Completed;
    let output = [
        reasoning_item("hmm".into(), Completed),
        message_item("Let me check.".into(), Completed),
        function_call("c1".into(), "f".into(), "{}".into(), Completed),
    ];
    let m = answer_message(&output);
    assert_eq!((m.role.as_str(), text(&m)), ("assistant", "Let me check."), "reasoning is left out");
    assert_eq!(
        m.tool_calls,
        Some(json!([{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]))
    );
}
