//! A Responses request becomes the chat request it stands for, so that one pipeline (chat template, tools and their
//! parsers, structured outputs, reasoning parsers, sampling checks) serves both APIs: `input` items become chat
//! messages behind `instructions` and the stored conversation of `previous_response_id`, flat function tools
//! become chat's nested ones, `text.format` becomes `response_format`, `reasoning.effort` becomes
//! `reasoning_effort`. Chat's validation errors are renamed to the Responses fields the client sent.

use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::openai::types::{ChatCompletionRequest, ChatMessageIn, MessageContent, SamplingFields};
use crate::openai::validate::{self, ValidationError};

use super::store::Stored;
use super::types::ResponsesRequest;

/// A Responses request as chat sees it, and what the response repeats of it.
#[derive(Debug, Clone)]
pub struct Converted {
    pub chat: ChatCompletionRequest,
    /// The conversation without `instructions`: the previous response's, then this `input` (kept with the
    /// answer when the response is stored).
    pub conversation: Vec<ChatMessageIn>,
    pub stream: bool,
    pub store: bool,
    /// `tools` as the client sent them (the response repeats them).
    pub tools: Vec<Value>,
    pub tool_choice: Value,
    pub text: Value,
}

fn bad(param: impl Into<String>, message: impl Into<String>) -> ApiError {
    ApiError::BadRequest { message: message.into(), param: Some(param.into()) }
}

/// Chat's field names in a validation error, as the Responses request names them: the `param`, and the message
/// where it names the field (a `messages[i]` index counts chat messages, not input items, so it is left as is).
pub fn rename_error(e: ValidationError) -> ApiError {
    let mut message = e.to_string();
    let chat_param = e.param();
    let param = chat_param.as_deref().map(rename_param);
    if let (Some(old), Some(new)) = (chat_param.as_deref(), param.as_deref()) {
        if old != new && !old.starts_with("messages") {
            message = message.replacen(old, new, 1);
        }
    }
    ApiError::BadRequest { message, param }
}

fn rename_param(p: &str) -> String {
    if p.starts_with("messages") {
        return "input".into();
    }
    if let Some(rest) = p.strip_prefix("response_format") {
        return format!("text.format{}", rest.strip_prefix(".json_schema").unwrap_or(rest));
    }
    match p {
        "max_tokens" | "max_completion_tokens" => "max_output_tokens".into(),
        "reasoning_effort" => "reasoning.effort".into(),
        _ => p.replacen(".function.", ".", 1),
    }
}

/// Options vLLM acts on that this server does not implement: refused when set to anything that changes something.
fn refuse_unimplemented(req: &ResponsesRequest) -> Result<(), ApiError> {
    let priority = req.priority.as_ref().filter(|p| p.as_i64() != Some(0));
    let fields: [(&str, &Option<Value>); 12] = [
        ("background", &req.background),
        ("include", &req.include),
        ("prompt", &req.prompt),
        ("max_tool_calls", &req.max_tool_calls),
        ("previous_response", &req.previous_response),
        ("previous_input_messages", &req.previous_input_messages),
        ("enable_response_messages", &req.enable_response_messages),
        ("request_id", &req.request_id),
        ("vllm_xargs", &req.vllm_xargs),
        ("mm_processor_kwargs", &req.mm_processor_kwargs),
        ("cache_salt", &req.cache_salt),
        ("conversation", &req.conversation),
    ];
    validate::refuse_unimplemented(&fields).map_err(rename_error)?;
    if priority.is_some() {
        return Err(bad("priority", "priority: request priorities are not supported by this server"));
    }
    match req.truncation.as_deref() {
        None | Some("disabled") => Ok(()),
        Some("auto") => {
            Err(bad("truncation", "truncation: 'auto' (dropping input to fit) is not supported by this server"))
        }
        Some(other) => Err(bad("truncation", format!("truncation must be 'auto' or 'disabled', got '{other}'"))),
    }
}

/// Checks `req` and builds the chat request; `previous` is the stored response of `previous_response_id`.
pub fn to_chat(req: &ResponsesRequest, previous: Option<&Stored>) -> Result<Converted, ApiError> {
    refuse_unimplemented(req)?;
    if let Some(m) = req.max_output_tokens.filter(|&m| m < 1) {
        return Err(ValidationError::MaxTokensTooSmall { field: "max_output_tokens", value: m }.into());
    }
    let mut conversation = previous.map(|p| p.conversation.clone()).unwrap_or_default();
    let input = input_messages(req.input.as_ref())?;
    if input.is_empty() && conversation.is_empty() {
        return Err(bad("input", "input must hold at least one item"));
    }
    conversation.extend(input);
    let mut messages = Vec::with_capacity(conversation.len() + 1);
    if let Some(instructions) = req.instructions.as_ref().filter(|i| !i.is_empty()) {
        messages.push(message("system", instructions.clone()));
    }
    messages.extend(conversation.iter().cloned());

    let (mut chat_tools, tools) = tools(req.tools.as_ref())?;
    let tool_choice = req.tool_choice.clone().filter(|c| !c.is_null()).unwrap_or_else(|| json!("auto"));
    let mut chat_choice = if req.tool_choice.as_ref().is_some_and(|c| !c.is_null()) {
        Some(chat_tool_choice(&tool_choice)?)
    } else {
        None
    };
    // vLLM hands the template no tools under `tool_choice: "none"` here (chat still shows them).
    if tool_choice == "none" {
        chat_tools = None;
        chat_choice = None;
    }
    let continue_final = continues_final_message(req.input.as_ref());
    let text = req.text.clone().filter(|t| !t.is_null()).unwrap_or_else(|| json!({"format": {"type": "text"}}));
    let response_format = response_format(&text)?;
    if response_format.is_some() && req.structured_outputs.as_ref().is_some_and(|s| !s.is_null()) {
        return Err(bad("text.format", "Cannot specify both structured_outputs and text.format"));
    }
    let reasoning_effort = match req.reasoning.as_ref().filter(|r| !r.is_null()) {
        None => None,
        Some(Value::Object(r)) => r.get("effort").filter(|e| !e.is_null()).cloned(),
        Some(_) => return Err(bad("reasoning", "reasoning must be an object")),
    };
    let stream = req.stream.unwrap_or(false);
    let sampling = SamplingFields {
        max_completion_tokens: req.max_output_tokens,
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        min_p: req.min_p,
        stop: req.stop.clone(),
        stop_token_ids: req.stop_token_ids.clone(),
        seed: req.seed,
        presence_penalty: req.presence_penalty,
        frequency_penalty: req.frequency_penalty,
        repetition_penalty: req.repetition_penalty,
        logit_bias: req.logit_bias.clone(),
        ignore_eos: req.ignore_eos,
        min_tokens: req.min_tokens,
        stream: Some(stream),
        skip_special_tokens: req.skip_special_tokens,
        response_format,
        structured_outputs: req.structured_outputs.clone(),
        include_stop_str_in_output: req.include_stop_str_in_output.clone(),
        ..SamplingFields::default()
    };
    let chat = ChatCompletionRequest {
        model: req.model.clone(),
        messages,
        tools: chat_tools,
        tool_choice: chat_choice,
        parallel_tool_calls: req.parallel_tool_calls,
        reasoning_effort,
        add_generation_prompt: Some(!continue_final),
        continue_final_message: continue_final.then_some(Value::Bool(true)),
        sampling,
        ..ChatCompletionRequest::default()
    };
    Ok(Converted { chat, conversation, stream, store: req.store.unwrap_or(true), tools, tool_choice, text })
}

/// vLLM's partial-message rule: a last input item that is a message still `in_progress` or
/// `incomplete` is continued rather than answered.
fn continues_final_message(input: Option<&Value>) -> bool {
    let Some(last) = input.and_then(Value::as_array).and_then(|items| items.last()) else { return false };
    let kind = last.get("type").and_then(Value::as_str).unwrap_or("message");
    let status = last.get("status").and_then(Value::as_str);
    kind == "message" && matches!(status, Some("in_progress" | "incomplete"))
}

fn message(role: &str, content: String) -> ChatMessageIn {
    ChatMessageIn {
        role: role.to_owned(),
        content: Some(MessageContent::Text(content)),
        tool_calls: None,
        tool_call_id: None,
        name: None,
    }
}

/// `input` as chat messages: a string is one user message; a list holds message items (an easy `{role, content}`
/// or `type: "message"`), `function_call` items (joined to the assistant message before them, as one chat turn
/// carries its calls) and `function_call_output` items (tool messages). Reasoning items are left out: chat turns
/// carry no earlier reasoning to the template.
pub fn input_messages(input: Option<&Value>) -> Result<Vec<ChatMessageIn>, ApiError> {
    let items = match input {
        None | Some(Value::Null) => return Err(bad("input", "input is required")),
        Some(Value::String(s)) => return Ok(vec![message("user", s.clone())]),
        Some(Value::Array(items)) => items,
        Some(_) => return Err(bad("input", "input must be a string or a list of items")),
    };
    let mut out: Vec<ChatMessageIn> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let obj = item.as_object().ok_or_else(|| bad(&at, format!("{at} must be an object")))?;
        match obj.get("type").and_then(Value::as_str) {
            None | Some("message") => out.push(message_item(&at, obj)?),
            Some("function_call") => {
                let call_id = string_field(&at, obj, "call_id")?;
                let name = string_field(&at, obj, "name")?;
                let arguments = string_field(&at, obj, "arguments")?;
                let call =
                    json!({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}});
                match out.last_mut().filter(|m| m.role == "assistant") {
                    Some(last) => match &mut last.tool_calls {
                        Some(Value::Array(calls)) => calls.push(call),
                        slot => *slot = Some(Value::Array(vec![call])),
                    },
                    None => out
                        .push(ChatMessageIn { tool_calls: Some(json!([call])), ..message("assistant", String::new()) }),
                }
            }
            Some("function_call_output") => {
                let call_id = string_field(&at, obj, "call_id")?;
                let output = match obj.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(parts)) => parts_text(&format!("{at}.output"), parts)?,
                    _ => return Err(bad(format!("{at}.output"), format!("{at}.output must be a string"))),
                };
                out.push(ChatMessageIn { tool_call_id: Some(call_id), ..message("tool", output) });
            }
            Some("reasoning") => {}
            Some(other) => {
                return Err(bad(
                    format!("{at}.type"),
                    format!("{at}: items of type '{other}' are not supported by this server"),
                ))
            }
        }
    }
    Ok(out)
}

fn string_field(at: &str, obj: &Map<String, Value>, key: &str) -> Result<String, ApiError> {
    obj.get(key)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| bad(format!("{at}.{key}"), format!("{at}.{key} must be a string")))
}

fn message_item(at: &str, obj: &Map<String, Value>) -> Result<ChatMessageIn, ApiError> {
    let role = string_field(at, obj, "role")?;
    if !["user", "assistant", "system", "developer"].contains(&role.as_str()) {
        return Err(bad(
            format!("{at}.role"),
            format!("{at}.role must be 'user', 'assistant', 'system' or 'developer', got '{role}'"),
        ));
    }
    let content = match obj.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts_text(&format!("{at}.content"), parts)?,
        _ => return Err(bad(format!("{at}.content"), format!("{at}.content must be a string or a list of parts"))),
    };
    Ok(message(&role, content))
}

/// Text parts joined with newlines (as chat joins its parts); any other kind of part is refused.
fn parts_text(at: &str, parts: &[Value]) -> Result<String, ApiError> {
    let mut texts = Vec::with_capacity(parts.len());
    for (j, p) in parts.iter().enumerate() {
        let kind = p.get("type").and_then(Value::as_str).unwrap_or("");
        if !["input_text", "output_text", "text"].contains(&kind) {
            return Err(bad(
                format!("{at}[{j}].type"),
                format!("{at}[{j}]: parts of type '{kind}' are not supported (only 'input_text' and 'output_text')"),
            ));
        }
        let text = p.get("text").and_then(Value::as_str);
        texts.push(text.ok_or_else(|| bad(format!("{at}[{j}].text"), format!("{at}[{j}].text must be a string")))?);
    }
    Ok(texts.join("\n"))
}

/// Responses' flat function tools as chat's nested ones (`None` for none), and the list as sent.
fn tools(tools: Option<&Value>) -> Result<(Option<Value>, Vec<Value>), ApiError> {
    let list = match tools {
        None | Some(Value::Null) => return Ok((None, Vec::new())),
        Some(Value::Array(list)) => list,
        Some(_) => return Err(bad("tools", "tools must be a list")),
    };
    let mut chat = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let kind = t.get("type").and_then(Value::as_str).unwrap_or("");
        if kind != "function" {
            return Err(bad(
                format!("tools[{i}].type"),
                format!("tools[{i}]: tools of type '{kind}' are not supported by this server (only 'function')"),
            ));
        }
        let mut function = Map::new();
        for key in ["name", "description", "parameters", "strict"] {
            if let Some(v) = t.get(key).filter(|v| !v.is_null()) {
                function.insert(key.to_owned(), v.clone());
            }
        }
        chat.push(json!({"type": "function", "function": function}));
    }
    Ok(((!chat.is_empty()).then_some(Value::Array(chat)), list.clone()))
}

/// `tool_choice` as chat takes it: the modes unchanged, `{"type": "function", "name"}` nested.
fn chat_tool_choice(choice: &Value) -> Result<Value, ApiError> {
    match choice {
        Value::String(_) => Ok(choice.clone()),
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
            let name = o.get("name").and_then(Value::as_str);
            let name = name.ok_or_else(|| bad("tool_choice.name", "tool_choice.name must be a string"))?;
            Ok(json!({"type": "function", "function": {"name": name}}))
        }
        _ => Err(bad(
            "tool_choice",
            "tool_choice must be 'none', 'auto', 'required' or {\"type\": \"function\", \"name\": ...}",
        )),
    }
}

/// `text.format` as chat's `response_format` (`None` for plain text).
fn response_format(text: &Value) -> Result<Option<Value>, ApiError> {
    let Some(text) = text.as_object() else { return Err(bad("text", "text must be an object")) };
    let Some(format) = text.get("format").filter(|f| !f.is_null()) else { return Ok(None) };
    let kind = format.get("type").and_then(Value::as_str);
    match kind {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let schema = format.get("schema").filter(|s| !s.is_null());
            let schema = schema
                .ok_or_else(|| bad("text.format.schema", "text.format of type 'json_schema' needs a 'schema'"))?;
            let name = format.get("name").cloned().unwrap_or_else(|| json!("response"));
            Ok(Some(json!({"type": "json_schema", "json_schema": {"name": name, "schema": schema}})))
        }
        _ => Err(bad("text.format.type", "text.format.type must be 'text', 'json_object' or 'json_schema'")),
    }
}
