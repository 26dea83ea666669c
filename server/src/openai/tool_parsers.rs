//! The `--tool-call-parser`s: how a model writes tool calls in free text (`tool_choice: "auto"`), as vLLM's parsers of
//! the same names read them.
//! - `llama3_json`: the whole answer is `{"name": ..., "parameters": {...}}` (or `"arguments"`), optionally after
//!   `<|python_tag|>`, several calls separated by `;`;
//! - `hermes` (Qwen2.5 / Qwen3, Hermes): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks after any
//!   content;
//! - `mistral`: `[TOOL_CALLS]` followed by a JSON list of `{"name": ..., "arguments": {...}}` after any content.

use serde_json::Value;

/// A parser by its vLLM name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ToolParser {
    #[value(name = "llama3_json")]
    Llama3Json,
    Hermes,
    Mistral,
}

/// One function call read from the output; `arguments` is JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: String,
}

/// An answer split into its content (text before the calls) and calls.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Parsed {
    pub content: String,
    pub calls: Vec<FunctionCall>,
}

const PYTHON_TAG: &str = "<|python_tag|>";
const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";
const MISTRAL_TAG: &str = "[TOOL_CALLS]";

impl ToolParser {
    /// Whether the model's special tokens must stay in the text for this parser to see its markers (vLLM turns
    /// `skip_special_tokens` off for these).
    pub fn needs_special_tokens(self) -> bool {
        matches!(self, ToolParser::Hermes | ToolParser::Mistral)
    }

    /// Where the tool-call part of `text` starts, if it has one: everything before it is content.
    pub fn call_start(self, text: &str) -> Option<usize> {
        match self {
            ToolParser::Llama3Json => {
                let lead = text.len() - text.trim_start().len();
                let rest = &text[lead..];
                (rest.starts_with(PYTHON_TAG) || rest.starts_with('{')).then_some(0)
            }
            ToolParser::Hermes => text.find(HERMES_OPEN),
            ToolParser::Mistral => text.find(MISTRAL_TAG),
        }
    }

    /// The longest end of `text` that could be the start of this parser's marker (held back while streaming).
    pub fn marker_prefix_len(self, text: &str) -> usize {
        let marker = match self {
            ToolParser::Llama3Json => {
                // Only the start of the answer can open a call; a whitespace-only answer so far may still.
                return if text.trim().is_empty() || PYTHON_TAG.starts_with(text.trim_start()) {
                    text.len()
                } else {
                    0
                };
            }
            ToolParser::Hermes => HERMES_OPEN,
            ToolParser::Mistral => MISTRAL_TAG,
        };
        (1..marker.len().min(text.len() + 1))
            .rev()
            .find(|&k| text.is_char_boundary(text.len() - k) && marker.starts_with(&text[text.len() - k..]))
            .unwrap_or(0)
    }

    /// Splits a complete answer into content and calls; an answer whose call part does not parse is all content.
    pub fn parse(self, text: &str) -> Parsed {
        let Some(start) = self.call_start(text) else { return Parsed { content: text.to_owned(), calls: vec![] } };
        let (content, part) = text.split_at(start);
        let calls = match self {
            ToolParser::Llama3Json => llama3_calls(part.trim_start().trim_start_matches(PYTHON_TAG)),
            ToolParser::Hermes => hermes_calls(part),
            ToolParser::Mistral => mistral_calls(&part[MISTRAL_TAG.len()..]),
        };
        match calls {
            Some(calls) if !calls.is_empty() => Parsed { content: content.trim_end().to_owned(), calls },
            _ => Parsed { content: text.to_owned(), calls: vec![] },
        }
    }
}

/// A call object's name and arguments (`arguments` or, for Llama, `parameters`), the arguments as JSON text.
pub fn call_from_object(v: &Value) -> Option<FunctionCall> {
    let name = v.get("name")?.as_str()?.to_owned();
    let args = v.get("arguments").or_else(|| v.get("parameters")).cloned().unwrap_or(Value::Object(Default::default()));
    let arguments = match args {
        Value::String(s) => s,
        other => other.to_string(),
    };
    Some(FunctionCall { name, arguments })
}

fn llama3_calls(part: &str) -> Option<Vec<FunctionCall>> {
    // Several calls are separated by ';' (vLLM's llama3_json reads them with a streaming JSON decoder).
    let mut calls = Vec::new();
    let mut rest = part.trim();
    while !rest.is_empty() {
        let mut stream = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let v = stream.next()?.ok()?;
        calls.push(call_from_object(&v)?);
        rest = rest[stream.byte_offset()..].trim_start();
        rest = rest.strip_prefix(';').unwrap_or(rest).trim_start();
    }
    Some(calls)
}

fn hermes_calls(part: &str) -> Option<Vec<FunctionCall>> {
    let mut calls = Vec::new();
    let mut rest = part;
    while let Some(open) = rest.find(HERMES_OPEN) {
        let body = &rest[open + HERMES_OPEN.len()..];
        let (json, after) = match body.find(HERMES_CLOSE) {
            Some(close) => (&body[..close], &body[close + HERMES_CLOSE.len()..]),
            None => (body, ""),
        };
        let v: Value = serde_json::from_str(json.trim()).ok()?;
        calls.push(call_from_object(&v)?);
        rest = after;
    }
    Some(calls)
}

fn mistral_calls(part: &str) -> Option<Vec<FunctionCall>> {
    let v: Value = serde_json::Deserializer::from_str(part.trim()).into_iter::<Value>().next()?.ok()?;
    match v {
        Value::Array(items) => items.iter().map(call_from_object).collect(),
        obj @ Value::Object(_) => Some(vec![call_from_object(&obj)?]),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, arguments: &str) -> FunctionCall {
        FunctionCall { name: name.into(), arguments: arguments.into() }
    }

    #[test]
    fn llama3_json_reads_one_or_several_calls() {
        let p = ToolParser::Llama3Json;
        assert_eq!(
            p.parse(r#" {"name": "get_weather", "parameters": {"city": "Paris"}}"#).calls,
            vec![call("get_weather", r#"{"city":"Paris"}"#)]
        );
        let got = p.parse(r#"<|python_tag|>{"name": "a", "arguments": {}}; {"name": "b", "parameters": {"x": 1}}"#);
        assert_eq!(got, Parsed { content: String::new(), calls: vec![call("a", "{}"), call("b", r#"{"x":1}"#)] });
        assert_eq!(p.parse("Paris is sunny.").calls, vec![]);
        assert_eq!(p.parse("{not json").content, "{not json");
    }

    #[test]
    fn hermes_and_mistral_keep_content_before_the_calls() {
        let got = ToolParser::Hermes.parse(
            "Let me check.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>\n<tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call>",
        );
        assert_eq!(
            got,
            Parsed { content: "Let me check.".into(), calls: vec![call("f", r#"{"a":1}"#), call("g", "{}")] }
        );
        let got = ToolParser::Mistral.parse(r#"ok [TOOL_CALLS] [{"name": "f", "arguments": {"q": "x"}}]"#);
        assert_eq!(got, Parsed { content: "ok".into(), calls: vec![call("f", r#"{"q":"x"}"#)] });
    }

    #[test]
    fn marker_prefixes_are_held_back_while_streaming() {
        assert_eq!(ToolParser::Hermes.marker_prefix_len("text <tool_"), 6);
        assert_eq!(ToolParser::Hermes.marker_prefix_len("text"), 0);
        assert_eq!(ToolParser::Mistral.marker_prefix_len("a [TOOL"), 5);
        assert_eq!(ToolParser::Llama3Json.marker_prefix_len("  "), 2);
        assert_eq!(ToolParser::Llama3Json.marker_prefix_len("<|python"), 8);
        assert_eq!(ToolParser::Llama3Json.marker_prefix_len("Hello"), 0);
    }
}
