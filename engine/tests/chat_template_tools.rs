//! Conversations with tool calls and tool results, and the request's `tools`, rendered by rserve against Hugging Face
//! `apply_chat_template(messages, tools=...)` after vLLM's shaping of the request (arguments parsed into objects,
//! tools as vLLM's `model_dump()`): the Meta Llama 3.1 Instruct and Qwen2.5 Instruct templates, byte for byte, and the
//! error Llama 3.1's template raises for parallel calls. Reference: tests/fixtures/tokenizer/tool_templates.json from
//! scripts/reference/tool_template_refs.py (the messages and tools there are as a client sends them).

mod tokenizer_support;

use rserve_engine::chat_template::{ChatMessage, ChatTemplate};
use serde_json::Value;
use tokenizer_support::{fixture, fixture_path};

#[test]
fn tool_conversations_render_like_vllm_and_hugging_face() {
    let reference = fixture("tool_templates.json");
    let bos = reference["bos_token"].as_str().map(str::to_owned);
    let eos = reference["eos_token"].as_str().map(str::to_owned);
    let fixed = reference["fixed_time_unix"].as_i64().unwrap();
    let cases = reference["cases"].as_array().unwrap();
    let mut bad = Vec::new();
    for case in cases {
        let name = case["template"].as_str().unwrap();
        let source = std::fs::read_to_string(fixture_path(name)).unwrap();
        assert_eq!(source, reference["templates"][name].as_str().unwrap(), "fixture template changed: regenerate");
        let template = ChatTemplate::new(source, bos.clone(), eos.clone()).unwrap().with_fixed_time(fixed);
        let messages: Vec<ChatMessage> =
            case["messages"].as_array().unwrap().iter().map(|m| ChatMessage::from_json(m).unwrap()).collect();
        let tools: Option<Vec<Value>> = case["tools"].as_array().cloned();
        let agp = case["add_generation_prompt"].as_bool().unwrap();
        let label =
            format!("{name} / {} / tools={} / add_generation_prompt={agp}", case["conversation"], tools.is_some());
        let extra = case["extra"].as_object().unwrap();
        let result = if extra.is_empty() {
            template.render_with_tools(&messages, tools.as_deref(), agp)
        } else {
            // Extra template variables (chat_template_kwargs) go beside the tools, shaped as render_with_tools does.
            let mut vars = extra.clone();
            let shaped = tools.iter().flatten().map(rserve_engine::chat_template::template_tool).collect();
            vars.insert("tools".into(), Value::Array(shaped));
            template.render_with(&messages, agp, &vars)
        };
        match (&result, case["expected"].as_str(), case["error"].as_str()) {
            (Ok(got), Some(want), _) if got == want => {}
            (Ok(got), Some(want), _) => {
                bad.push(format!("{label}: render differs\n--- got ---\n{got}\n--- want ---\n{want}"))
            }
            (Err(e), None, Some(want)) if e.to_string().contains(want) => {}
            (got, _, _) => {
                bad.push(format!("{label}: got {got:?}, reference {:?} / {:?}", case["expected"], case["error"]))
            }
        }
    }
    assert!(bad.is_empty(), "{} of {} cases differ:\n{}", bad.len(), cases.len(), bad.join("\n\n"));
    eprintln!("{} tool-calling chat template cases match Hugging Face", cases.len());
}

#[test]
fn messages_keep_only_the_keys_vllm_passes() {
    let m = ChatMessage::from_json(&serde_json::json!({
        "role": "assistant", "content": null, "name": "bot",
        "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]
    }))
    .unwrap();
    let seen = serde_json::to_value(&m).unwrap();
    let want = serde_json::json!({"role": "assistant", "content": "", "name": "bot",
        "tool_calls": [{"id": "c", "function": {"arguments": {"a": 1}, "name": "f"}, "type": "function"}]});
    assert_eq!(seen, want);
    // An empty list is no tool calls; tool_call_id belongs to tool messages only.
    let m =
        ChatMessage::from_json(&serde_json::json!({"role": "assistant", "content": "x", "tool_calls": []})).unwrap();
    assert_eq!(m, ChatMessage::new("assistant", "x"));
    let m = ChatMessage::from_json(&serde_json::json!({"role": "user", "content": "x", "tool_call_id": "c"})).unwrap();
    assert_eq!(m, ChatMessage::new("user", "x"));
    let m = ChatMessage::from_json(&serde_json::json!({"role": "tool", "content": "r", "tool_call_id": "c"})).unwrap();
    assert_eq!(m.tool_call_id.as_deref(), Some("c"));
    // Templates test for keys: an absent one is undefined.
    let t = ChatTemplate::new(
        "{% for m in messages %}{{ 'tool_calls' in m }} {{ m.tool_call_id is defined }} {{ m.name is defined }};{% endfor %}",
        None,
        None,
    )
    .unwrap();
    let msgs = [ChatMessage::new("user", "x"), m];
    assert_eq!(t.render(&msgs, false).unwrap(), "False False False;False True False;");
}
