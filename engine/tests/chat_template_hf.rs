//! Chat templates rendered by rserve against Hugging Face `apply_chat_template` (jinja2): SmolLM2's template read
//! from its GGUF, a Llama-3-style template (BOS, strftime_now, tools via tojson(indent), raise_exception, loop.last),
//! and a template exercising namespaces, loop controls, Python methods, tojson options and Python-style printing.
//! Also the token ids of each render, the strftime conversions, where templates are looked up, and message parsing.
//! References: tests/fixtures/tokenizer/{chat_templates,strftime}.json from scripts/reference/tokenizer_refs.py.

mod tokenizer_support;

use std::sync::Arc;

use rserve_engine::chat_template::{ChatMessage, ChatTemplate, TemplateOrigin, TemplateSources};
use rserve_engine::tokenizer::Tokenizer;
use rserve_engine::TokenId;
use serde_json::Value;
use tokenizer_support::*;

fn messages(v: &Value) -> Vec<ChatMessage> {
    v.as_array().unwrap().iter().map(|m| ChatMessage::from_json(m).unwrap()).collect()
}

fn template_for(reference: &Value, case: &Value) -> (ChatTemplate, Arc<Tokenizer>) {
    let name = case["template"].as_str().unwrap();
    let tokenizer = match case["tokenizer"].as_str().unwrap() {
        "smollm2" => smollm2(),
        "llama3" => llama3(),
        other => panic!("unknown tokenizer {other}"),
    };
    let template = if name == "smollm2_gguf" {
        let sources = TemplateSources { gguf: Some(smollm2_gguf_content()), ..Default::default() };
        let t = ChatTemplate::from_sources(&sources, &tokenizer).unwrap().expect("SmolLM2 GGUF has a template");
        assert_eq!(t.origin(), &TemplateOrigin::Gguf);
        assert_eq!(t.source(), reference["templates"][name].as_str().unwrap());
        t
    } else {
        let source = std::fs::read_to_string(fixture_path(name)).unwrap();
        assert_eq!(source, reference["templates"][name].as_str().unwrap(), "fixture template changed: regenerate");
        ChatTemplate::for_tokenizer(source, &tokenizer).unwrap()
    };
    let fixed = reference["fixed_time_unix"].as_i64().unwrap();
    (template.with_fixed_time(fixed), tokenizer)
}

#[test]
fn renders_match_hugging_face_apply_chat_template() {
    let reference = fixture("chat_templates.json");
    let cases = reference["cases"].as_array().unwrap();
    let mut bad = Vec::new();
    for case in cases {
        let (template, tokenizer) = template_for(&reference, case);
        let label = format!(
            "{} / {} / add_generation_prompt={}",
            case["template"], case["conversation"], case["add_generation_prompt"]
        );
        let extra = case["extra"].as_object().unwrap();
        let result =
            template.render_with(&messages(&case["messages"]), case["add_generation_prompt"].as_bool().unwrap(), extra);
        match (&result, case["expected"].as_str(), case["error"].as_str()) {
            (Ok(got), Some(want), _) => {
                if got != want {
                    bad.push(format!("{label}: render differs\n--- got ---\n{got}\n--- want ---\n{want}"));
                    continue;
                }
                // Tokenized as the caller must: BOS written by the template is not added again.
                let ids = tokenizer.encode_chat_prompt(got).unwrap();
                let hf_ids: Vec<TokenId> =
                    case["ids"].as_array().unwrap().iter().map(|x| TokenId(x.as_u64().unwrap() as u32)).collect();
                let bos = tokenizer.bos_token().unwrap_or_default();
                let expected = if got.starts_with(&bos) || !tokenizer.adds_bos_token() {
                    hf_ids
                } else {
                    // HF tokenizes chat renders without special tokens; rserve adds the tokenizer's BOS when the
                    // template wrote none.
                    std::iter::once(tokenizer.bos_token_id().unwrap()).chain(hf_ids).collect()
                };
                if ids != expected {
                    bad.push(format!("{label}: ids {ids:?}, want {expected:?}"));
                }
            }
            (Err(e), None, Some(want)) => {
                if !e.to_string().contains(want) {
                    bad.push(format!("{label}: error {e} does not carry {want:?}"));
                }
            }
            (got, _, _) => {
                bad.push(format!("{label}: got {got:?}, reference {:?} / {:?}", case["expected"], case["error"]))
            }
        }
    }
    assert!(bad.is_empty(), "{} of {} cases differ:\n{}", bad.len(), cases.len(), bad.join("\n\n"));
    eprintln!("{} chat template cases match Hugging Face", cases.len());
}

#[test]
fn strftime_now_matches_python_strftime() {
    let reference = fixture("strftime.json");
    let template = ChatTemplate::new("{{ strftime_now(fmt) }}", None, None).unwrap();
    let template = template.with_fixed_time(0);
    let mut bad = Vec::new();
    let cases = reference["cases"].as_array().unwrap();
    for case in cases {
        let t = case["unix"].as_i64().unwrap();
        let fmt = case["format"].as_str().unwrap();
        let template = ChatTemplate::new(template.source(), None, None).unwrap().with_fixed_time(t);
        let mut extra = serde_json::Map::new();
        extra.insert("fmt".into(), fmt.into());
        let got = template.render_with(&[], false, &extra).unwrap();
        let want = case["expected"].as_str().unwrap();
        if got != want {
            bad.push(format!("{t} {fmt:?}: got {got:?}, want {want:?}"));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn strftime_now_reads_the_clock_when_not_fixed() {
    let template = ChatTemplate::new("{{ strftime_now('%Y') }}", None, None).unwrap();
    let year: i64 = template.render(&[], false).unwrap().parse().unwrap();
    assert!((2024..3000).contains(&year), "{year}");
}

fn write(dir: &std::path::Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap();
}

#[test]
fn sources_are_taken_in_order_of_precedence() {
    let tok = smollm2();
    let gguf = smollm2_gguf_content();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let render = |t: &ChatTemplate| t.render(&[ChatMessage::new("user", "x")], false).unwrap();

    // Nothing anywhere: no template, never a guess.
    let none = TemplateSources { model_dir: Some(d), ..Default::default() };
    assert!(ChatTemplate::from_sources(&none, &tok).unwrap().is_none());

    // GGUF metadata is the last resort.
    let sources = TemplateSources { model_dir: Some(d), gguf: Some(gguf), ..Default::default() };
    assert_eq!(ChatTemplate::from_sources(&sources, &tok).unwrap().unwrap().origin(), &TemplateOrigin::Gguf);

    // tokenizer_config.json (list form, "default") beats GGUF.
    write(
        d,
        "tokenizer_config.json",
        r#"{"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D{{ messages[0].content }}"}]}"#,
    );
    let t = ChatTemplate::from_sources(&sources, &tok).unwrap().unwrap();
    assert!(matches!(t.origin(), TemplateOrigin::TokenizerConfig(_)));
    assert_eq!(render(&t), "Dx");

    // String form.
    write(d, "tokenizer_config.json", r#"{"chat_template": "S{{ messages[0].content }}"}"#);
    assert_eq!(render(&ChatTemplate::from_sources(&sources, &tok).unwrap().unwrap()), "Sx");

    // chat_template.jinja beats tokenizer_config.json.
    write(d, "chat_template.jinja", "J{{ messages[0].content }}");
    let t = ChatTemplate::from_sources(&sources, &tok).unwrap().unwrap();
    assert!(matches!(t.origin(), TemplateOrigin::JinjaFile(_)));
    assert_eq!(render(&t), "Jx");

    // An override file beats everything; an inline override too.
    let file = d.join("override.jinja");
    std::fs::write(&file, "F{{ messages[0].content }}").unwrap();
    let path = file.to_str().unwrap();
    let with_file = TemplateSources { override_template: Some(path), ..sources };
    let t = ChatTemplate::from_sources(&with_file, &tok).unwrap().unwrap();
    assert!(matches!(t.origin(), TemplateOrigin::OverrideFile(_)));
    assert_eq!(render(&t), "Fx");
    let inline = TemplateSources { override_template: Some("I{{ messages[0].content }}"), ..sources };
    let t = ChatTemplate::from_sources(&inline, &tok).unwrap().unwrap();
    assert_eq!(t.origin(), &TemplateOrigin::OverrideInline);
    assert_eq!(render(&t), "Ix");

    // An override that is neither a file nor a template is an error naming it.
    let missing = TemplateSources { override_template: Some("/no/such/template.jinja"), ..sources };
    let err = ChatTemplate::from_sources(&missing, &tok).unwrap_err().to_string();
    assert!(err.contains("/no/such/template.jinja"), "{err}");
}

#[test]
fn named_templates_without_default_are_an_error() {
    let tok = smollm2();
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "tokenizer_config.json", r#"{"chat_template": [{"name": "rag", "template": "R"}]}"#);
    let sources = TemplateSources { model_dir: Some(dir.path()), ..Default::default() };
    let err = ChatTemplate::from_sources(&sources, &tok).unwrap_err().to_string();
    assert!(err.contains("rag") && err.contains("default"), "{err}");
}

#[test]
fn broken_templates_fail_to_compile_with_a_message() {
    let err = ChatTemplate::new("{% for m in messages %}", None, None).unwrap_err().to_string();
    assert!(err.contains("chat template"), "{err}");
}

#[test]
fn message_content_parts_are_joined() {
    let m = ChatMessage::from_json(&serde_json::json!({
        "role": "user",
        "content": [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]
    }))
    .unwrap();
    assert_eq!(m, ChatMessage::new("user", "first\nsecond"));
    let m = ChatMessage::from_json(&serde_json::json!({"role": "assistant", "content": null})).unwrap();
    assert_eq!(m.content, "");
    let err = ChatMessage::from_json(&serde_json::json!({
        "role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]
    }))
    .unwrap_err()
    .to_string();
    assert!(err.contains("image_url"), "{err}");
    assert!(ChatMessage::from_json(&serde_json::json!({"content": "no role"})).is_err());
}
