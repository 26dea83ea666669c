//! `ChatTemplate`: renders a conversation into the prompt text a model was trained on, with the model's own Jinja
//! template, the way Hugging Face's `apply_chat_template` does (minijinja configured like transformers' Jinja
//! environment: `trim_blocks`, `lstrip_blocks`, loop controls, `raise_exception`, Python's `json.dumps` as `tojson`,
//! `strftime_now`, Python string/dict methods, values printed as Python's `str()`; variables `messages`, `add_generation_prompt`, `tools`, `documents`,
//! `bos_token`, `eos_token`, `unk_token`, `pad_token`).
//!
//! Where a template comes from is decided in `sources.rs`; a model without one has none (`None`), never a guess.
//!
//! Tokenizing the result: templates usually write BOS themselves, so encoding the text with `add_special_tokens =
//! true` could give two BOS tokens. Use `Tokenizer::encode_chat_prompt`, which adds special tokens only when the
//! text does not already start with the BOS string (the text is encoded with `add_special_tokens = false` whenever
//! the template wrote BOS, as vLLM does).

mod clock;
mod pyjson;
mod pyrepr;
mod sources;
mod tools;

use minijinja::value::Value;
use minijinja::{Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};

pub use sources::{TemplateOrigin, TemplateSources};
pub use tools::{template_arguments, template_tool, FunctionCall, ToolCall};

use crate::error::{ModelError, Result};
use crate::tokenizer::Tokenizer;
use clock::Clock;

const TEMPLATE_NAME: &str = "chat_template";

/// One message of a conversation, as templates see it: `message.role`, `message.content`, and where the message has
/// them an assistant's `tool_calls`, a tool result's `tool_call_id`, a participant's `name` (the keys vLLM passes, in
/// its order; an absent one stays undefined, so `'tool_calls' in message` and `is defined` behave as under vLLM).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self { role: role.into(), content: content.into(), ..Self::default() }
    }

    /// Reads an OpenAI-style message object the way vLLM does: `content` is a string, `null` (read as ""), or a list
    /// of `{"type": "text", "text": ...}` parts, whose texts are joined with "\n"; other part types are refused by
    /// name. An assistant's `tool_calls` (`[{"id", "type": "function", "function": {"name", "arguments"}}]`; an empty
    /// list counts as none) get their `arguments` parsed into an object; a `tool` message keeps its `tool_call_id`;
    /// any message keeps a string `name`.
    pub fn from_json(value: &serde_json::Value) -> Result<Self> {
        let invalid = |m: &str| ModelError::InvalidArgument(m.to_owned());
        let role = value
            .get("role")
            .and_then(serde_json::Value::as_str)
            .ok_or_else(|| invalid("message has no string 'role'"))?;
        let content = match value.get("content") {
            None | Some(serde_json::Value::Null) => String::new(),
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Array(parts)) => {
                let mut texts = Vec::with_capacity(parts.len());
                for part in parts {
                    let kind = part.get("type").and_then(serde_json::Value::as_str).unwrap_or("");
                    if kind != "text" {
                        return Err(ModelError::InvalidArgument(format!(
                            "message content part of type '{kind}' is not supported (only 'text')"
                        )));
                    }
                    let text = part
                        .get("text")
                        .and_then(serde_json::Value::as_str)
                        .ok_or_else(|| invalid("text content part has no string 'text'"))?;
                    texts.push(text);
                }
                texts.join("\n")
            }
            Some(_) => return Err(invalid("message 'content' must be a string, null, or a list of text parts")),
        };
        let mut message = Self::new(role, content);
        if role == "assistant" {
            if let Some(calls) = value.get("tool_calls").filter(|v| !v.is_null()) {
                let calls = calls.as_array().ok_or_else(|| invalid("message 'tool_calls' must be a list"))?;
                let calls = calls.iter().map(tool_call_from_json).collect::<Result<Vec<ToolCall>>>()?;
                message.tool_calls = Some(calls).filter(|c| !c.is_empty());
            }
        }
        if role == "tool" {
            message.tool_call_id = value.get("tool_call_id").and_then(serde_json::Value::as_str).map(str::to_owned);
        }
        message.name = value.get("name").and_then(serde_json::Value::as_str).map(str::to_owned);
        Ok(message)
    }
}

fn tool_call_from_json(call: &serde_json::Value) -> Result<ToolCall> {
    let invalid = |m: &str| ModelError::InvalidArgument(format!("tool call: {m}"));
    let id = call.get("id").and_then(serde_json::Value::as_str).ok_or_else(|| invalid("no string 'id'"))?;
    if call.get("type").and_then(serde_json::Value::as_str) != Some("function") {
        return Err(invalid("'type' must be 'function'"));
    }
    let function = call.get("function").ok_or_else(|| invalid("no 'function'"))?;
    let name = function.get("name").and_then(serde_json::Value::as_str).ok_or_else(|| invalid("no string 'name'"))?;
    Ok(ToolCall::function(id, name, function.get("arguments")))
}

/// A compiled chat template plus the special-token strings it may print.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    origin: TemplateOrigin,
    special_tokens: Vec<(&'static str, String)>,
    clock: Clock,
}

impl ChatTemplate {
    /// Compiles `source`. `bos_token`/`eos_token` are the strings the template sees under those names.
    pub fn new(source: impl Into<String>, bos_token: Option<String>, eos_token: Option<String>) -> Result<Self> {
        let specials = [("bos_token", bos_token), ("eos_token", eos_token)];
        Self::compile(source.into(), TemplateOrigin::Given, specials.into_iter())
    }

    /// Compiles `source` with the tokenizer's BOS/EOS/UNK/PAD strings as template variables.
    pub fn for_tokenizer(source: impl Into<String>, tokenizer: &Tokenizer) -> Result<Self> {
        Self::with_origin(source.into(), TemplateOrigin::Given, tokenizer)
    }

    /// Finds the template of a model (see [`TemplateSources`] for the order); `Ok(None)` when it has none.
    pub fn from_sources(sources: &TemplateSources<'_>, tokenizer: &Tokenizer) -> Result<Option<Self>> {
        match sources.find()? {
            Some((source, origin)) => Self::with_origin(source, origin, tokenizer).map(Some),
            None => Ok(None),
        }
    }

    fn with_origin(source: String, origin: TemplateOrigin, tokenizer: &Tokenizer) -> Result<Self> {
        let specials = [
            ("bos_token", tokenizer.bos_token()),
            ("eos_token", tokenizer.eos_token()),
            ("unk_token", tokenizer.unk_token()),
            ("pad_token", tokenizer.pad_token()),
        ];
        Self::compile(source, origin, specials.into_iter())
    }

    fn compile(
        source: String,
        origin: TemplateOrigin,
        specials: impl Iterator<Item = (&'static str, Option<String>)>,
    ) -> Result<Self> {
        let clock = Clock::default();
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |message: String| -> std::result::Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, message))
        });
        let time = clock.clone();
        env.add_function("strftime_now", move |format: String| clock::strftime(&format, time.now()));
        env.add_filter("tojson", pyjson::tojson);
        env.set_formatter(pyrepr::format);
        env.add_template_owned(TEMPLATE_NAME, strip_generation_tags(&source))
            .map_err(|e| ModelError::ChatTemplate(format!("{} does not compile: {}", origin, describe(&e))))?;
        let special_tokens = specials.filter_map(|(name, value)| value.map(|v| (name, v))).collect();
        Ok(Self { env, source, origin, special_tokens, clock })
    }

    /// Makes `strftime_now` see this time (seconds since the Unix epoch, UTC) instead of the clock: reproducible
    /// renders for tests and replays.
    pub fn with_fixed_time(self, unix_seconds: i64) -> Self {
        self.clock.fix(unix_seconds);
        self
    }

    /// The template text as found.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Where the template came from (for the start-up log).
    pub fn origin(&self) -> &TemplateOrigin {
        &self.origin
    }

    /// Renders `messages`; with `add_generation_prompt` the text ends with the assistant turn's opening.
    /// `raise_exception(...)` in the template becomes an `ModelError::ChatTemplate` carrying its message.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.render_with(messages, add_generation_prompt, &serde_json::Map::new())
    }

    /// Renders `messages` with the request's `tools` (OpenAI function tools, handed to the template as the `tools`
    /// variable in the shape vLLM gives them, see [`template_tool`]; `None`: the template sees `tools` as none).
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.render_request(messages, tools, add_generation_prompt, &serde_json::Map::new())
    }

    /// A chat request's render: `tools` as [`render_with_tools`](Self::render_with_tools), plus the request's other
    /// template variables (`documents`, `chat_template_kwargs`), which win over the built-in ones as in vLLM.
    pub fn render_request(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
        variables: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String> {
        let mut extra = serde_json::Map::new();
        if let Some(tools) = tools {
            extra.insert("tools".into(), serde_json::Value::Array(tools.iter().map(template_tool).collect()));
        }
        extra.extend(variables.iter().map(|(k, v)| (k.clone(), v.clone())));
        self.render_with(messages, add_generation_prompt, &extra)
    }

    /// Like [`render`](Self::render), with extra template variables (`tools`, `documents`, or any
    /// `chat_template_kwargs`); an extra variable replaces a built-in one of the same name.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String> {
        let mut ctx: Vec<(String, Value)> = vec![
            ("messages".into(), Value::from_serialize(messages)),
            ("add_generation_prompt".into(), Value::from(add_generation_prompt)),
            ("tools".into(), Value::from(())),
            ("documents".into(), Value::from(())),
        ];
        ctx.extend(self.special_tokens.iter().map(|(k, v)| ((*k).to_owned(), Value::from(v.clone()))));
        for (key, value) in extra {
            ctx.retain(|(k, _)| k != key);
            ctx.push((key.clone(), Value::from_serialize(value)));
        }
        let ctx: Value = ctx.into_iter().collect();
        let template = self.env.get_template(TEMPLATE_NAME).map_err(|e| ModelError::ChatTemplate(describe(&e)))?;
        template.render(ctx).map_err(|e| ModelError::ChatTemplate(describe(&e)))
    }
}

/// The error text with its causes, e.g. "invalid operation: Conversation roles must alternate (in chat_template:1)".
fn describe(error: &Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Hugging Face's `{% generation %}...{% endgeneration %}` marks assistant text for training masks and renders its
/// body unchanged; minijinja has no such tag, so each becomes an always-true `if` block with the same whitespace
/// control markers.
fn strip_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        let Some(end) = tag.find("%}") else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let (open_ctl, body) = split_ctl_prefix(inner);
        let (body, close_ctl) = split_ctl_suffix(body);
        let replacement = match body.trim() {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replacement {
            Some(r) => out.push_str(&format!("{{%{open_ctl} {r} {close_ctl}%}}")),
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

fn split_ctl_prefix(s: &str) -> (&str, &str) {
    match s.chars().next() {
        Some(c @ ('-' | '+')) => s.split_at(c.len_utf8()),
        _ => ("", s),
    }
}

fn split_ctl_suffix(s: &str) -> (&str, &str) {
    match s.chars().last() {
        Some(c @ ('-' | '+')) => s.split_at(s.len() - c.len_utf8()),
        _ => (s, ""),
    }
}

#[cfg(test)]
mod tests {
    use super::strip_generation_tags;

    #[test]
    fn generation_tags_become_plain_blocks() {
        let src = "{%- generation -%}x{% endgeneration %}{% if a %}y{% endif %}";
        assert_eq!(strip_generation_tags(src), "{%- if true -%}x{% endif %}{% if a %}y{% endif %}");
    }
}
