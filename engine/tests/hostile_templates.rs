//! Hostile chat input (issue #28 item 4): the real Llama 3.1 and Qwen2.5 chat templates rendering conversations,
//! tools and template variables built from hostile values (wrong types, nesting, control characters, template
//! syntax in content). Every render gives text or an error: never a panic. Seconds in CI.

mod tokenizer_support;

use proptest::prelude::*;
use rserve_engine::chat_template::{ChatMessage, ChatTemplate};
use serde_json::{json, Value};
use tokenizer_support::fixture_path;

fn hostile_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        Just(json!(0)),
        Just(json!(-1)),
        Just(json!(u64::MAX)),
        Just(json!(1e308)),
        Just(json!("")),
        Just(json!("{{ raise_exception('x') }}{% for m in messages %}")),
        Just(json!("<|eot_id|><|im_end|>\u{0}")),
        "[a-z_ {}%<|>\\[\\]\"']{0,16}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::hash_map(
                prop::sample::select(vec![
                    "role",
                    "content",
                    "name",
                    "type",
                    "function",
                    "arguments",
                    "tool_calls",
                    "id",
                    "parameters",
                    "description",
                    "text"
                ]),
                inner,
                0..4
            )
            .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())),
        ]
    })
}

fn message() -> impl Strategy<Value = Value> {
    let role = prop_oneof![
        Just(json!("user")),
        Just(json!("system")),
        Just(json!("assistant")),
        Just(json!("tool")),
        Just(json!("ipython")),
        hostile_value()
    ];
    let content = prop_oneof![3 => "[a-z {}%<|>\\[\\]\"'\n]{0,24}".prop_map(Value::from), 1 => hostile_value()];
    let tool_call = (hostile_value(), "[a-z_]{0,8}", hostile_value()).prop_map(
        |(id, name, args)| json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}}),
    );
    let tool_calls = prop_oneof![prop::collection::vec(tool_call, 0..3).prop_map(Value::Array), hostile_value()];
    (role, content, prop::option::weighted(0.3, tool_calls), prop::option::weighted(0.2, hostile_value())).prop_map(
        |(role, content, tool_calls, name)| {
            let mut m = json!({"role": role, "content": content});
            if let Some(tc) = tool_calls {
                m["tool_calls"] = tc;
            }
            if let Some(n) = name {
                m["name"] = n;
            }
            m
        },
    )
}

fn templates() -> Vec<ChatTemplate> {
    ["llama3_1_instruct.jinja", "qwen2_5_instruct.jinja"]
        .iter()
        .map(|name| {
            let source = std::fs::read_to_string(fixture_path(name)).unwrap();
            ChatTemplate::new(source, Some("<|begin_of_text|>".into()), Some("<|eot_id|>".into()))
                .unwrap()
                .with_fixed_time(1_721_997_296)
        })
        .collect()
}

thread_local!(static RENDERED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) });

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn hostile_conversations_render_or_fail_cleanly(
        msgs in prop::collection::vec(message(), 0..5),
        tools in prop::option::of(prop::collection::vec(hostile_value(), 0..3)),
        vars in prop::collection::hash_map("[a-z_]{1,12}", hostile_value(), 0..3),
        agp in any::<bool>(),
    ) {
        thread_local!(static TEMPLATES: Vec<ChatTemplate> = templates());
        // Messages the server would refuse are dropped; the rest reach the template as the server hands them over.
        let messages: Vec<ChatMessage> = msgs.iter().filter_map(|m| ChatMessage::from_json(m).ok()).collect();
        let vars: serde_json::Map<String, Value> = vars.into_iter().collect();
        let rendered = TEMPLATES.with(|ts| {
            ts.iter()
                .map(|t| {
                    let a = t.render_with_tools(&messages, tools.as_deref(), agp).is_ok();
                    let b = t.render_request(&messages, tools.as_deref(), agp, &vars).is_ok();
                    usize::from(a) + usize::from(b)
                })
                .sum::<usize>()
        });
        RENDERED.with(|r| r.set(r.get() + rendered));
    }
}

/// The properties above must reach the templates' bodies, not only their argument checks: a fixed conversation of the
/// same shapes renders.
#[test]
fn plain_conversations_render() {
    let msgs = [json!({"role": "system", "content": "be brief"}), json!({"role": "user", "content": "{{ x }}"})];
    let messages: Vec<ChatMessage> = msgs.iter().map(|m| ChatMessage::from_json(m).unwrap()).collect();
    for t in templates() {
        let text = t.render(&messages, true).unwrap();
        assert!(text.contains("{{ x }}"), "content is data, never template code: {text}");
    }
}
