//! Tool calling as chat templates see it, shaped the way vLLM hands it to `apply_chat_template`
//! (`vllm/renderers/chat_utils/chat_message.py`, `vllm/renderers/online_renderer.py`):
//! - an assistant message's `tool_calls` are `{"id", "function": {"arguments", "name"}, "type"}` (the key order of
//!   the OpenAI `TypedDict`s that pydantic validates them into, extra keys dropped), with `arguments` parsed from its
//!   JSON string into an object; an empty, malformed or non-object `arguments` becomes `{}` (vLLM's
//!   `_postprocess_messages`, which keeps a broken turn in the history renderable);
//! - the request's `tools` are `tool.model_dump()` of vLLM's `ChatCompletionToolsParam`:
//!   `{"type", "function": {"name", "description", "parameters"}}`, `description` and `parameters` null when not
//!   given, `strict` / `defer_loading` only when set, other keys dropped.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// One call of a function by the assistant (`message.tool_calls[i]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub function: FunctionCall,
    #[serde(rename = "type")]
    pub kind: String,
}

/// The function of a [`ToolCall`]: `arguments` is always a JSON object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub arguments: Value,
    pub name: String,
}

impl ToolCall {
    /// A function call as vLLM passes it to templates; `arguments` as the client sent it (see [`template_arguments`]).
    pub fn function(id: impl Into<String>, name: impl Into<String>, arguments: Option<&Value>) -> Self {
        Self {
            id: id.into(),
            function: FunctionCall { arguments: template_arguments(arguments), name: name.into() },
            kind: "function".into(),
        }
    }
}

/// A call's `arguments` as templates get them: a JSON string is parsed; an object is kept; anything else (absent,
/// null, "", malformed JSON, JSON that is not an object) is `{}`.
pub fn template_arguments(arguments: Option<&Value>) -> Value {
    let parsed = match arguments {
        Some(Value::String(s)) if !s.is_empty() => serde_json::from_str::<Value>(s).ok(),
        Some(Value::Object(o)) if !o.is_empty() => Some(Value::Object(o.clone())),
        _ => None,
    };
    match parsed {
        Some(v @ Value::Object(_)) => v,
        _ => Value::Object(Map::new()),
    }
}

/// One entry of the request's `tools` as templates get it (vLLM's `ChatCompletionToolsParam.model_dump()`). An entry
/// without a `function` object is returned unchanged: validating the request is the caller's job.
pub fn template_tool(tool: &Value) -> Value {
    let Some(function) = tool.get("function").and_then(Value::as_object) else { return tool.clone() };
    let set = |v: Option<&Value>| v.filter(|v| !v.is_null()).cloned();
    let defer_loading = set(tool.get("defer_loading"));
    let mut f = Map::new();
    f.insert("name".into(), function.get("name").cloned().unwrap_or(Value::Null));
    f.insert("description".into(), function.get("description").cloned().unwrap_or(Value::Null));
    f.insert("parameters".into(), function.get("parameters").cloned().unwrap_or(Value::Null));
    if let Some(strict) = set(function.get("strict")) {
        f.insert("strict".into(), strict);
    }
    // vLLM copies the tool's `defer_loading` into its function when the function has none.
    if let Some(defer) = set(function.get("defer_loading")).or_else(|| defer_loading.clone()) {
        f.insert("defer_loading".into(), defer);
    }
    let mut out = Map::new();
    out.insert("type".into(), tool.get("type").cloned().unwrap_or_else(|| "function".into()));
    out.insert("function".into(), Value::Object(f));
    if let Some(defer) = defer_loading {
        out.insert("defer_loading".into(), defer);
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn arguments_become_objects_as_vllm_makes_them() {
        assert_eq!(template_arguments(Some(&json!("{\"b\": 1, \"a\": [2]}"))), json!({"b": 1, "a": [2]}));
        assert_eq!(template_arguments(Some(&json!({"x": 1}))), json!({"x": 1}));
        for broken in [json!(""), json!("not json"), json!("[1]"), json!("42"), json!(null), json!(7)] {
            assert_eq!(template_arguments(Some(&broken)), json!({}), "{broken}");
        }
        assert_eq!(template_arguments(None), json!({}));
        // Key order is kept: templates print arguments with tojson.
        let keys: Vec<String> =
            template_arguments(Some(&json!("{\"z\": 1, \"a\": 2}"))).as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys, ["z", "a"]);
    }

    #[test]
    fn tools_take_the_shape_of_vllms_model_dump() {
        let tool = json!({"function": {"name": "f", "extra": 1}, "type": "function", "other": 2});
        let want = json!({"type": "function", "function": {"name": "f", "description": null, "parameters": null}});
        assert_eq!(template_tool(&tool), want);
        let out = template_tool(&tool);
        let keys: Vec<&str> = out.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys, ["type", "function"]);
        let tool = json!({"type": "function", "defer_loading": true,
            "function": {"parameters": {"type": "object"}, "strict": true, "name": "g", "description": "d"}});
        let want = json!({"type": "function", "defer_loading": true, "function":
            {"name": "g", "description": "d", "parameters": {"type": "object"}, "strict": true, "defer_loading": true}});
        assert_eq!(template_tool(&tool), want);
    }
}
