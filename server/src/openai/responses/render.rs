//! Chat output as Responses objects: a finished chat answer becomes output items (reasoning, then the message,
//! then function calls, the order vLLM writes them) inside a response object that repeats the request's settings;
//! and an answer becomes the assistant message a follow-up turn continues from.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::openai::types::{ChatCompletionResponse, ChatMessageIn, MessageContent};
use crate::openai::validate::ValidChat;

use super::convert::Converted;
use super::types::{
    Echo, IncompleteDetails, ItemId, ItemStatus, OutputItem, OutputText, ReasoningText, ResponseId, ResponseObject,
    ResponseStatus, ResponseUsage, ResponsesRequest,
};

/// A response before its output: id, time, model and the settings it repeats.
#[derive(Debug, Clone, PartialEq)]
pub struct Draft {
    pub id: ResponseId,
    pub created_at: u64,
    pub model: String,
    pub echo: Echo,
}

impl Draft {
    pub fn new(model: String, echo: Echo) -> Self {
        let created_at = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        Self { id: ResponseId::fresh(), created_at, model, echo }
    }

    /// The response object in `status` with `output` (and `usage` once finished).
    pub fn object(
        &self,
        status: ResponseStatus,
        output: Vec<OutputItem>,
        usage: Option<ResponseUsage>,
    ) -> ResponseObject {
        ResponseObject {
            id: self.id.clone(),
            object: "response",
            created_at: self.created_at,
            model: self.model.clone(),
            status,
            background: false,
            error: None,
            incomplete_details: (status == ResponseStatus::Incomplete)
                .then_some(IncompleteDetails { reason: "max_output_tokens" }),
            output,
            usage,
            echo: self.echo.clone(),
        }
    }
}

/// What a response repeats of its request; the sampling values are the ones the engine runs with (defaults filled
/// in), as vLLM reports them.
pub fn echo(req: &ResponsesRequest, conv: &Converted, valid: &ValidChat) -> Echo {
    let first = valid.requests.first();
    Echo {
        instructions: req.instructions.clone(),
        max_output_tokens: first.map_or(0, |r| r.stop.max_tokens),
        metadata: req.metadata.clone(),
        parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
        previous_response_id: req.previous_response_id.clone(),
        reasoning: req.reasoning.clone().filter(|r| !r.is_null()),
        service_tier: req.service_tier.clone().unwrap_or_else(|| "auto".into()),
        store: conv.store,
        temperature: first.map_or(1.0, |r| shortest(r.sampling.temperature)),
        text: conv.text.clone(),
        tool_choice: conv.tool_choice.clone(),
        tools: conv.tools.clone(),
        top_p: first.map_or(1.0, |r| shortest(r.sampling.top_p)),
        truncation: "disabled",
        user: req.user.clone(),
    }
}

/// An `f32` setting as the decimal it was written as (0.7, not 0.699999988 as a plain widening gives).
fn shortest(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(f64::from(x))
}

/// `length` cut the answer at `max_output_tokens`: the response is incomplete.
pub fn status_of(finish_reason: Option<&str>) -> ResponseStatus {
    match finish_reason {
        Some("length") => ResponseStatus::Incomplete,
        _ => ResponseStatus::Completed,
    }
}

/// A function call as an output item (`call_id` is the chat call's id).
pub fn function_call(call_id: String, name: String, arguments: String, status: ItemStatus) -> OutputItem {
    OutputItem::FunctionCall { id: ItemId::fresh("fc"), call_id, name, arguments, status }
}

pub fn reasoning_item(text: String, status: ItemStatus) -> OutputItem {
    OutputItem::Reasoning {
        id: ItemId::fresh("rs"),
        summary: Vec::new(),
        content: vec![ReasoningText::new(text)],
        status,
    }
}

pub fn message_item(text: String, status: ItemStatus) -> OutputItem {
    OutputItem::Message { id: ItemId::fresh("msg"), role: "assistant", status, content: vec![OutputText::new(text)] }
}

/// The whole response to a non-streaming request (its one chat choice); `count_tokens` measures the reasoning for
/// `usage.output_tokens_details`.
pub fn from_chat(draft: &Draft, chat: ChatCompletionResponse, count_tokens: &dyn Fn(&str) -> usize) -> ResponseObject {
    let mut output = Vec::new();
    let mut reasoning_tokens = 0;
    let mut status = ResponseStatus::Completed;
    if let Some(choice) = chat.choices.into_iter().next() {
        status = status_of(choice.finish_reason);
        let m = choice.message;
        if let Some(r) = m.reasoning.filter(|r| !r.is_empty()) {
            reasoning_tokens = count_tokens(&r);
            output.push(reasoning_item(r, ItemStatus::Completed));
        }
        if let Some(c) = m.content.filter(|c| !c.is_empty()) {
            output.push(message_item(c, ItemStatus::Completed));
        }
        for call in m.tool_calls {
            output.push(function_call(call.id, call.function.name, call.function.arguments, ItemStatus::Completed));
        }
    }
    let u = &chat.usage;
    let usage = ResponseUsage::new(
        u.prompt_tokens,
        u.completion_tokens,
        u.prompt_tokens_details.cached_tokens,
        reasoning_tokens,
    );
    draft.object(status, output, Some(usage))
}

/// The answer as the assistant message a follow-up (`previous_response_id`) continues from: its text and calls
/// (reasoning is left out, as chat turns carry none).
pub fn answer_message(output: &[OutputItem]) -> ChatMessageIn {
    let mut text = String::new();
    let mut calls = Vec::new();
    for item in output {
        match item {
            OutputItem::Message { content, .. } => content.iter().for_each(|c| text.push_str(&c.text)),
            OutputItem::FunctionCall { call_id, name, arguments, .. } => calls
                .push(json!({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})),
            OutputItem::Reasoning { .. } => {}
        }
    }
    ChatMessageIn {
        role: "assistant".into(),
        content: Some(MessageContent::Text(text)),
        tool_calls: (!calls.is_empty()).then_some(Value::Array(calls)),
        tool_call_id: None,
        name: None,
    }
}
