//! Tool calling on chat completions, as vLLM serves it: `tools`, `tool_choice` (`none`, `auto`, `required`, a named
//! function) and `parallel_tool_calls`.
//! - `required` and a named function are enforced by the grammar engine: the output is a JSON list of
//!   `{"name", "parameters"}` objects (vLLM's schema, `maxItems: 1` without parallel calls) or the named function's
//!   arguments, so every call is well-formed and matches its parameters' schema;
//! - `auto` needs `--enable-auto-tool-choice` and `--tool-call-parser`; the model writes freely and the parser reads
//!   its calls;
//! - `none` (and no tools) leaves the output alone. The tools reach the chat template in every case, as vLLM's do.

use rserve_engine::structured::GrammarSpec;
use serde_json::{json, Value};

use super::tool_parsers::{call_from_object, FunctionCall, Parsed, ToolParser};
use super::types::ChatCompletionRequest;
use super::validate::ValidationError;

type Result<T> = std::result::Result<T, ValidationError>;

/// The server's tool-calling settings (`--enable-auto-tool-choice`, `--tool-call-parser`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ToolSettings {
    pub auto_tool_choice: bool,
    pub parser: Option<ToolParser>,
}

/// How a request's output is read for tool calls.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ToolMode {
    /// Plain text.
    #[default]
    Off,
    /// A JSON list of calls (`tool_choice: "required"`).
    Required,
    /// The arguments of this function (a named `tool_choice`).
    Named(String),
    /// Free text read by a parser (`tool_choice: "auto"`).
    Auto(ToolParser),
}

/// A checked tools request: what the chat template gets and how the output is read.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolPlan {
    /// The `tools` list as the request gave it (`None` when there are none).
    pub tools: Option<Vec<Value>>,
    pub mode: ToolMode,
    /// The constraint `required` and named choices put on the output.
    pub grammar: Option<GrammarSpec>,
    /// `parallel_tool_calls: false` keeps only the first call.
    pub parallel: bool,
}

fn invalid(field: &str, message: impl Into<String>) -> ValidationError {
    ValidationError::Tools { field: field.to_owned(), message: message.into() }
}

/// `(name, parameters schema)` of each function tool, checked.
fn functions(tools: &[Value]) -> Result<Vec<(String, Value)>> {
    tools
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let field = format!("tools[{i}]");
            if t.get("type").and_then(Value::as_str) != Some("function") {
                return Err(invalid(&field, "only tools of type 'function' are supported"));
            }
            let f = t
                .get("function")
                .and_then(Value::as_object)
                .ok_or_else(|| invalid(&field, "needs a 'function' object"))?;
            let name = f
                .get("name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .ok_or_else(|| invalid(&format!("{field}.function.name"), "must be a non-empty string"))?;
            let params = match f.get("parameters") {
                None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
                Some(p @ Value::Object(_)) => p.clone(),
                Some(_) => {
                    return Err(invalid(&format!("{field}.function.parameters"), "must be a JSON schema object"))
                }
            };
            Ok((name.to_owned(), params))
        })
        .collect()
}

/// Checks `tools`, `tool_choice` and `parallel_tool_calls` against the server's settings.
pub fn plan(req: &ChatCompletionRequest, settings: &ToolSettings) -> Result<ToolPlan> {
    let tools: Option<Vec<Value>> = match &req.tools {
        None | Some(Value::Null) => None,
        Some(Value::Array(a)) => Some(a.clone()),
        Some(_) => return Err(invalid("tools", "must be a list of tools")),
    };
    let fns = functions(tools.as_deref().unwrap_or(&[]))?;
    let parallel = !matches!(req.parallel_tool_calls, Some(false));
    let choice = req.tool_choice.as_ref().filter(|v| !v.is_null());
    let has_tools = !fns.is_empty();
    let mode = match choice {
        // No choice given: "auto" with tools (when the server can parse), else "none".
        None if has_tools && settings.auto_tool_choice => settings.parser.map_or(ToolMode::Off, ToolMode::Auto),
        None => ToolMode::Off,
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolMode::Off,
            // An empty tools list turns "auto" and "required" into "none", as vLLM does.
            "auto" | "required" if tools.as_ref().is_some_and(Vec::is_empty) => ToolMode::Off,
            _ if tools.is_none() => {
                return Err(invalid("tool_choice", "when tool_choice is set, tools must be set too"))
            }
            "required" => ToolMode::Required,
            "auto" => match (settings.auto_tool_choice, settings.parser) {
                (true, Some(p)) => ToolMode::Auto(p),
                _ => {
                    return Err(invalid(
                        "tool_choice",
                        "\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set",
                    ))
                }
            },
            other => {
                return Err(invalid(
                    "tool_choice",
                    format!("'{other}' is not a tool choice (expected 'none', 'auto', 'required' or a named function)"),
                ))
            }
        },
        Some(obj @ Value::Object(_)) => {
            let name = obj
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| invalid("tool_choice.function.name", "a named tool choice needs function.name"))?;
            if !fns.iter().any(|(n, _)| n == name) {
                return Err(invalid("tool_choice", format!("the tool '{name}' in tool_choice is not in tools")));
            }
            ToolMode::Named(name.to_owned())
        }
        Some(_) => return Err(invalid("tool_choice", "must be a string or a named function object")),
    };
    let grammar = match &mode {
        ToolMode::Required => Some(GrammarSpec::JsonSchema(required_schema(&fns, parallel))),
        ToolMode::Named(name) => fns.iter().find(|(n, _)| n == name).map(|(_, p)| GrammarSpec::JsonSchema(p.clone())),
        _ => None,
    };
    Ok(ToolPlan { tools, mode, grammar, parallel })
}

/// vLLM's schema for `tool_choice: "required"`: a non-empty list of calls of the given functions.
fn required_schema(fns: &[(String, Value)], parallel: bool) -> Value {
    let mut defs = serde_json::Map::new();
    let any_of: Vec<Value> = fns
        .iter()
        .map(|(name, params)| {
            let mut params = params.clone();
            // Definitions move to the top, where the parameters' `$ref`s (`#/$defs/...`) find them.
            if let Some(Value::Object(d)) = params.as_object_mut().and_then(|p| p.remove("$defs")) {
                defs.extend(d);
            }
            // Unlike vLLM's schema, a call object has no keys beyond these two: anything else would be dropped.
            json!({"properties": {"name": {"type": "string", "enum": [name]}, "parameters": params},
                   "required": ["name", "parameters"], "additionalProperties": false})
        })
        .collect();
    let mut schema = json!({"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": any_of}});
    if !parallel {
        schema["maxItems"] = json!(1);
    }
    if !defs.is_empty() {
        schema["$defs"] = Value::Object(defs);
    }
    schema
}

/// How the choices of a response are read: the mode and whether more than one call is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolReading {
    pub mode: ToolMode,
    pub parallel: bool,
}

impl Default for ToolReading {
    fn default() -> Self {
        Self { mode: ToolMode::Off, parallel: true }
    }
}

/// One call as the response carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub call: FunctionCall,
}

/// A fresh call id, as vLLM makes them.
pub fn call_id() -> String {
    format!("chatcmpl-tool-{:032x}", rand::random::<u128>())
}

/// A finished choice's text read as `mode` says: (content, calls). Forced modes answer with empty content, as vLLM.
pub fn read_output(mode: &ToolMode, parallel: bool, text: &str) -> (Option<String>, Vec<ToolCall>) {
    let parsed = match mode {
        ToolMode::Off => return (Some(text.to_owned()), Vec::new()),
        ToolMode::Required => {
            // A whole list, or (the output cut by max_tokens inside it) the complete calls before the cut.
            let items = match serde_json::from_str::<Value>(text) {
                Ok(Value::Array(items)) => Some(items),
                Ok(_) => None,
                Err(_) => complete_items(text),
            };
            match items.filter(|i| !i.is_empty()).and_then(|i| i.iter().map(call_from_object).collect()) {
                Some(calls) => Parsed { content: String::new(), calls },
                None => Parsed { content: text.to_owned(), calls: vec![] },
            }
        }
        ToolMode::Named(name) => Parsed {
            content: String::new(),
            calls: vec![FunctionCall { name: name.clone(), arguments: text.to_owned() }],
        },
        ToolMode::Auto(p) => p.parse(text),
    };
    let mut calls: Vec<ToolCall> = parsed.calls.into_iter().map(|call| ToolCall { id: call_id(), call }).collect();
    if !parallel {
        calls.truncate(1);
    }
    let content = match mode {
        ToolMode::Auto(_) if !calls.is_empty() && parsed.content.is_empty() => None,
        _ => Some(parsed.content),
    };
    (content, calls)
}

/// The complete items of a JSON list cut short (`[{...}, {...}, {"na`): each item that parses whole, up to the
/// first that does not; None when `text` is not the start of a list.
fn complete_items(text: &str) -> Option<Vec<Value>> {
    let mut rest = text.trim_start().strip_prefix('[')?;
    let mut items = Vec::new();
    loop {
        let mut stream = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let Some(Ok(item)) = stream.next() else { return Some(items) };
        items.push(item);
        rest = rest[stream.byte_offset()..].trim_start();
        match rest.strip_prefix(',') {
            Some(r) => rest = r,
            None => return Some(items),
        }
    }
}

/// `finish_reason` of a choice: "tool_calls" when it made calls and stopped on its own, except for a named choice
/// (OpenAI reports "stop" there); a length cut stays "length".
pub fn finish_reason(mode: &ToolMode, engine_reason: &'static str, made_calls: bool) -> &'static str {
    if made_calls && engine_reason == "stop" && !matches!(mode, ToolMode::Named(_)) {
        "tool_calls"
    } else {
        engine_reason
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(body: Value) -> ChatCompletionRequest {
        let mut b = json!({"messages": [{"role": "user", "content": "hi"}]});
        b.as_object_mut().unwrap().extend(body.as_object().unwrap().clone());
        serde_json::from_value(b).expect("request")
    }

    fn weather() -> Value {
        json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
            "properties": {"city": {"type": "string"}}, "required": ["city"]}}}, {"type": "function", "function": {"name": "now"}}])
    }

    const AUTO: ToolSettings = ToolSettings { auto_tool_choice: true, parser: Some(ToolParser::Hermes) };

    #[test]
    fn modes_follow_vllm() {
        let p = |body: Value, s: &ToolSettings| plan(&req(body), s).map(|p| p.mode);
        assert_eq!(p(json!({}), &AUTO).unwrap(), ToolMode::Off);
        assert_eq!(p(json!({"tools": weather()}), &AUTO).unwrap(), ToolMode::Auto(ToolParser::Hermes));
        assert_eq!(p(json!({"tools": weather()}), &ToolSettings::default()).unwrap(), ToolMode::Off);
        assert_eq!(p(json!({"tools": weather(), "tool_choice": "none"}), &AUTO).unwrap(), ToolMode::Off);
        assert_eq!(p(json!({"tools": [], "tool_choice": "required"}), &AUTO).unwrap(), ToolMode::Off);
        assert_eq!(
            p(json!({"tools": weather(), "tool_choice": "required"}), &ToolSettings::default()).unwrap(),
            ToolMode::Required
        );
        let named = json!({"tools": weather(), "tool_choice": {"type": "function", "function": {"name": "now"}}});
        assert_eq!(p(named.clone(), &ToolSettings::default()).unwrap(), ToolMode::Named("now".into()));
        let g = plan(&req(named), &AUTO).unwrap().grammar;
        assert_eq!(g, Some(GrammarSpec::JsonSchema(json!({"type": "object", "properties": {}}))));
    }

    #[test]
    fn bad_requests_name_their_field() {
        let field = |body: Value, s: &ToolSettings| plan(&req(body), s).unwrap_err().param().unwrap();
        assert_eq!(field(json!({"tools": weather(), "tool_choice": "auto"}), &ToolSettings::default()), "tool_choice");
        assert_eq!(field(json!({"tool_choice": "required"}), &AUTO), "tool_choice");
        assert_eq!(field(json!({"tools": weather(), "tool_choice": "sometimes"}), &AUTO), "tool_choice");
        assert_eq!(
            field(json!({"tools": weather(), "tool_choice": {"type": "function", "function": {"name": "x"}}}), &AUTO),
            "tool_choice"
        );
        assert_eq!(field(json!({"tools": [{"type": "function", "function": {}}]}), &AUTO), "tools[0].function.name");
        assert_eq!(field(json!({"tools": [{"type": "retrieval"}]}), &AUTO), "tools[0]");
        assert_eq!(field(json!({"tools": {"a": 1}}), &AUTO), "tools");
    }

    #[test]
    fn required_schema_lists_the_functions_and_limits_parallel_calls() {
        let p = plan(&req(json!({"tools": weather(), "tool_choice": "required", "parallel_tool_calls": false})), &AUTO)
            .unwrap();
        let Some(GrammarSpec::JsonSchema(s)) = p.grammar else { panic!("{:?}", p.grammar) };
        assert_eq!(s["maxItems"], 1);
        assert_eq!(s["items"]["anyOf"][0]["properties"]["name"]["enum"][0], "get_weather");
        assert_eq!(s["items"]["anyOf"][1]["properties"]["parameters"], json!({"type": "object", "properties": {}}));
    }

    #[test]
    fn outputs_become_calls() {
        let (content, calls) = read_output(
            &ToolMode::Required,
            true,
            r#"[{"name": "now", "parameters": {}}, {"name": "get_weather", "parameters": {"city": "Oslo"}}]"#,
        );
        assert_eq!(content.as_deref(), Some(""));
        assert_eq!(calls.iter().map(|c| c.call.name.as_str()).collect::<Vec<_>>(), ["now", "get_weather"]);
        assert_eq!(calls[1].call.arguments, r#"{"city":"Oslo"}"#);
        assert!(calls[0].id.starts_with("chatcmpl-tool-") && calls[0].id != calls[1].id);
        let (_, calls) = read_output(&ToolMode::Named("get_weather".into()), true, r#"{"city": "Rome"}"#);
        assert_eq!(calls[0].call.arguments, r#"{"city": "Rome"}"#);
        // A list cut by max_tokens: its complete calls are the answer, not raw JSON in `content`.
        let cut = r#"[{"name": "now", "parameters": {}}, {"name": "get_weather", "parameters": {"city": "Oslo"}}, {"name": "now", "param"#;
        let (content, calls) = read_output(&ToolMode::Required, true, cut);
        assert_eq!(content.as_deref(), Some(""));
        assert_eq!(calls.iter().map(|c| c.call.name.as_str()).collect::<Vec<_>>(), ["now", "get_weather"]);
        let (_, calls) = read_output(&ToolMode::Required, false, cut);
        assert_eq!(calls.len(), 1);
        // Nothing complete yet, or not a list: the text stays content.
        for text in [r#"[{"name": "no"#, "[", r#"{"name": "now"}"#, "[]"] {
            let (content, calls) = read_output(&ToolMode::Required, true, text);
            assert_eq!((content.as_deref(), calls.len()), (Some(text), 0), "{text}");
        }
        let (content, calls) = read_output(&ToolMode::Auto(ToolParser::Hermes), false,
            "<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>");
        assert_eq!((content, calls.len()), (None, 1));
        assert_eq!(finish_reason(&ToolMode::Required, "stop", true), "tool_calls");
        assert_eq!(finish_reason(&ToolMode::Named("now".into()), "stop", true), "stop");
        assert_eq!(finish_reason(&ToolMode::Required, "length", false), "length");
    }
}
