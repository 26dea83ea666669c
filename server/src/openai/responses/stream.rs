//! `stream: true`: the chat stream renderer runs as for chat, and each chunk it writes is read back and re-told as
//! Responses events in OpenAI's order (`response.created`, `response.in_progress`, then per output item
//! `output_item.added`, its part's `added`, deltas, `done`s, `output_item.done`, and `response.completed` with
//! usage), each numbered by `sequence_number`. Reading chat's chunks rather than the engine's events keeps one
//! implementation of reasoning splitting and tool-call parsing for both APIs.

use std::convert::Infallible;
use std::sync::Arc;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use rserve_engine::api::RequestEvent;
use serde_json::{json, Value};

use crate::fanout::Merged;
use crate::openai::render::ChatStream;
use crate::openai::types::ChatMessageIn;
use crate::sse::{self, StreamRenderer};

use super::render::{answer_message, status_of, Draft};
use super::store::{ResponseStore, Stored};
use super::types::{ItemId, ItemStatus, OutputItem, OutputText, ReasoningText, ResponseStatus, ResponseUsage};

/// One thing a chat stream chunk says.
#[derive(Debug, Clone, PartialEq)]
pub enum ChatPiece {
    Reasoning(String),
    Content(String),
    /// A call's first delta: its chat index, id, name and first arguments.
    CallStart {
        index: u64,
        id: String,
        name: String,
        arguments: String,
    },
    /// More arguments of the call at chat index `index`.
    CallArgs {
        index: u64,
        arguments: String,
    },
    Finish(String),
    Usage {
        prompt: usize,
        completion: usize,
        cached: usize,
    },
    /// An engine failure (chat's error body).
    Error(Value),
}

/// Reads one chat chunk (a `data:` payload of `ChatStream`) back into pieces.
pub fn read_chunk(payload: &str) -> Vec<ChatPiece> {
    let Ok(chunk) = serde_json::from_str::<Value>(payload) else { return Vec::new() };
    if let Some(error) = chunk.get("error") {
        return vec![ChatPiece::Error(error.clone())];
    }
    let text = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or("").to_owned();
    let mut out = Vec::new();
    for choice in chunk.get("choices").and_then(Value::as_array).into_iter().flatten() {
        let delta = choice.get("delta");
        let field = |k: &str| delta.and_then(|d| d.get(k)).and_then(Value::as_str).filter(|s| !s.is_empty());
        if let Some(r) = field("reasoning") {
            out.push(ChatPiece::Reasoning(r.to_owned()));
        }
        if let Some(c) = field("content") {
            out.push(ChatPiece::Content(c.to_owned()));
        }
        let calls = delta.and_then(|d| d.get("tool_calls")).and_then(Value::as_array);
        for call in calls.into_iter().flatten() {
            let index = call.get("index").and_then(Value::as_u64).unwrap_or(0);
            let function = call.get("function");
            let arguments = text(function.and_then(|f| f.get("arguments")));
            match call.get("id").and_then(Value::as_str) {
                Some(id) => out.push(ChatPiece::CallStart {
                    index,
                    id: id.to_owned(),
                    name: text(function.and_then(|f| f.get("name"))),
                    arguments,
                }),
                None => out.push(ChatPiece::CallArgs { index, arguments }),
            }
        }
        if let Some(f) = choice.get("finish_reason").and_then(Value::as_str) {
            out.push(ChatPiece::Finish(f.to_owned()));
        }
    }
    if let Some(u) = chunk.get("usage").filter(|u| u.is_object()) {
        let n = |v: Option<&Value>| v.and_then(Value::as_u64).unwrap_or(0) as usize;
        out.push(ChatPiece::Usage {
            prompt: n(u.get("prompt_tokens")),
            completion: n(u.get("completion_tokens")),
            cached: n(u.get("prompt_tokens_details").and_then(|d| d.get("cached_tokens"))),
        });
    }
    out
}

/// The output item being streamed.
#[derive(Debug, Clone)]
enum Open {
    Reasoning { id: ItemId, text: String },
    Message { id: ItemId, text: String },
    Call { id: ItemId, index: u64, call_id: String, name: String, arguments: String },
}

/// Turns chat pieces into Responses events (JSON objects), keeping the output for the final response.
pub struct EventWriter {
    draft: Draft,
    seq: u64,
    output: Vec<OutputItem>,
    open: Option<Open>,
    status: ResponseStatus,
    usage: Option<ResponseUsage>,
    reasoning: String,
    failed: bool,
}

impl EventWriter {
    pub fn new(draft: Draft) -> Self {
        Self {
            draft,
            seq: 0,
            output: Vec::new(),
            open: None,
            status: ResponseStatus::Completed,
            usage: None,
            reasoning: String::new(),
            failed: false,
        }
    }

    /// `event` with its `type` and the next `sequence_number`.
    fn event(&mut self, kind: &str, mut event: Value) -> Value {
        if let Value::Object(o) = &mut event {
            o.insert("type".into(), json!(kind));
            o.insert("sequence_number".into(), json!(self.seq));
        }
        self.seq += 1;
        event
    }

    pub fn start(&mut self) -> Vec<Value> {
        let response = self.draft.object(ResponseStatus::InProgress, Vec::new(), None);
        vec![
            self.event("response.created", json!({"response": response})),
            self.event("response.in_progress", json!({"response": response})),
        ]
    }

    /// The events of one piece.
    pub fn piece(&mut self, piece: ChatPiece) -> Vec<Value> {
        let mut out = Vec::new();
        match piece {
            ChatPiece::Reasoning(delta) => {
                if !matches!(self.open, Some(Open::Reasoning { .. })) {
                    self.close(&mut out);
                    self.open_reasoning(&mut out);
                }
                self.reasoning.push_str(&delta);
                let (at, item_id) = self.open_at();
                if let Some(Open::Reasoning { text, .. }) = &mut self.open {
                    text.push_str(&delta);
                }
                let e = json!({"item_id": item_id, "output_index": at, "content_index": 0, "delta": delta});
                out.push(self.event("response.reasoning_text.delta", e));
            }
            ChatPiece::Content(delta) => {
                if !matches!(self.open, Some(Open::Message { .. })) {
                    self.close(&mut out);
                    self.open_message(&mut out);
                }
                let (at, item_id) = self.open_at();
                if let Some(Open::Message { text, .. }) = &mut self.open {
                    text.push_str(&delta);
                }
                let e = json!({"item_id": item_id, "output_index": at, "content_index": 0, "delta": delta,
                    "logprobs": []});
                out.push(self.event("response.output_text.delta", e));
            }
            ChatPiece::CallStart { index, id: call_id, name, arguments } => {
                self.close(&mut out);
                let id = ItemId::fresh("fc");
                let item = OutputItem::FunctionCall {
                    id: id.clone(),
                    call_id: call_id.clone(),
                    name: name.clone(),
                    arguments: String::new(),
                    status: ItemStatus::InProgress,
                };
                let at = self.output.len();
                out.push(self.event("response.output_item.added", json!({"output_index": at, "item": item})));
                self.open = Some(Open::Call { id, index, call_id, name, arguments: String::new() });
                self.call_args(index, arguments, &mut out);
            }
            ChatPiece::CallArgs { index, arguments } => self.call_args(index, arguments, &mut out),
            ChatPiece::Finish(reason) => {
                self.close(&mut out);
                self.status = status_of(Some(&reason));
            }
            ChatPiece::Usage { prompt, completion, cached } => {
                self.usage = Some(ResponseUsage::new(prompt, completion, cached, 0));
            }
            ChatPiece::Error(e) => {
                self.failed = true;
                let field = |k: &str| e.get(k).cloned().unwrap_or(Value::Null);
                let body = json!({"code": field("code"), "message": field("message"), "param": field("param")});
                out.push(self.event("error", body));
            }
        }
        out
    }

    fn call_args(&mut self, index: u64, delta: String, out: &mut Vec<Value>) {
        if delta.is_empty() {
            return;
        }
        let (at, item_id) = self.open_at();
        match &mut self.open {
            Some(Open::Call { index: open, arguments, .. }) if *open == index => arguments.push_str(&delta),
            // Arguments of a call that is not the open one cannot be placed: chat sends each call's arguments right
            // after its start, so this does not happen.
            _ => return,
        }
        out.push(self.event(
            "response.function_call_arguments.delta",
            json!({"item_id": item_id, "output_index": at,
            "delta": delta}),
        ));
    }

    /// The open item's output index and id.
    fn open_at(&self) -> (usize, Value) {
        let id = match &self.open {
            Some(Open::Reasoning { id, .. } | Open::Message { id, .. } | Open::Call { id, .. }) => json!(id),
            None => Value::Null,
        };
        (self.output.len(), id)
    }

    fn open_reasoning(&mut self, out: &mut Vec<Value>) {
        let id = ItemId::fresh("rs");
        let at = self.output.len();
        let item = OutputItem::Reasoning {
            id: id.clone(),
            summary: Vec::new(),
            content: Vec::new(),
            status: ItemStatus::InProgress,
        };
        out.push(self.event("response.output_item.added", json!({"output_index": at, "item": item})));
        let part = ReasoningText::new(String::new());
        out.push(self.event(
            "response.content_part.added",
            json!({"item_id": id, "output_index": at,
            "content_index": 0, "part": part}),
        ));
        self.open = Some(Open::Reasoning { id, text: String::new() });
    }

    fn open_message(&mut self, out: &mut Vec<Value>) {
        let id = ItemId::fresh("msg");
        let at = self.output.len();
        let item = OutputItem::Message {
            id: id.clone(),
            role: "assistant",
            status: ItemStatus::InProgress,
            content: Vec::new(),
        };
        out.push(self.event("response.output_item.added", json!({"output_index": at, "item": item})));
        let part = OutputText::new(String::new());
        out.push(self.event(
            "response.content_part.added",
            json!({"item_id": id, "output_index": at,
            "content_index": 0, "part": part}),
        ));
        self.open = Some(Open::Message { id, text: String::new() });
    }

    /// Ends the open item: its `done` events, and it joins the output.
    fn close(&mut self, out: &mut Vec<Value>) {
        let Some(open) = self.open.take() else { return };
        let at = self.output.len();
        let item = match open {
            Open::Reasoning { id, text } => {
                let e = json!({"item_id": id, "output_index": at, "content_index": 0, "text": text});
                out.push(self.event("response.reasoning_text.done", e));
                let part = ReasoningText::new(text);
                out.push(self.event(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": at,
                    "content_index": 0, "part": part}),
                ));
                OutputItem::Reasoning { id, summary: Vec::new(), content: vec![part], status: ItemStatus::Completed }
            }
            Open::Message { id, text } => {
                let e = json!({"item_id": id, "output_index": at, "content_index": 0, "text": text, "logprobs": []});
                out.push(self.event("response.output_text.done", e));
                let part = OutputText::new(text);
                out.push(self.event(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": at,
                    "content_index": 0, "part": part}),
                ));
                OutputItem::Message { id, role: "assistant", status: ItemStatus::Completed, content: vec![part] }
            }
            Open::Call { id, call_id, name, arguments, .. } => {
                let e = json!({"item_id": id, "output_index": at, "name": name, "arguments": arguments});
                out.push(self.event("response.function_call_arguments.done", e));
                OutputItem::FunctionCall { id, call_id, name, arguments, status: ItemStatus::Completed }
            }
        };
        out.push(self.event("response.output_item.done", json!({"output_index": at, "item": item})));
        self.output.push(item);
    }

    /// The end of the stream: what is still open closes, then `response.completed` carries the whole response
    /// (returned too, for the store). Nothing after an engine error, whose `error` event ended the stream.
    pub fn complete(&mut self, reasoning_tokens: usize) -> (Vec<Value>, Option<super::types::ResponseObject>) {
        if self.failed {
            return (Vec::new(), None);
        }
        let mut out = Vec::new();
        self.close(&mut out);
        let mut usage = self.usage.clone().unwrap_or_else(|| ResponseUsage::new(0, 0, 0, 0));
        usage.output_tokens_details.reasoning_tokens = reasoning_tokens;
        let response = self.draft.object(self.status, self.output.clone(), Some(usage));
        out.push(self.event("response.completed", json!({"response": response})));
        (out, Some(response))
    }

    /// All reasoning text streamed so far.
    pub fn reasoning(&self) -> &str {
        &self.reasoning
    }
}

/// Where a streamed response goes once complete (`store: true`).
pub struct StoreTo {
    pub store: Arc<ResponseStore>,
    pub conversation: Vec<ChatMessageIn>,
}

/// The `StreamRenderer` of a Responses stream: chat's renderer inside, its chunks re-told by an `EventWriter`.
pub struct ResponsesStream {
    chat: ChatStream,
    writer: EventWriter,
    store: Option<StoreTo>,
    count_tokens: Box<dyn Fn(&str) -> usize + Send>,
}

impl ResponsesStream {
    /// `chat` must include usage (its last chunk carries the counts `response.completed` reports).
    pub fn new(
        chat: ChatStream,
        draft: Draft,
        store: Option<StoreTo>,
        count_tokens: Box<dyn Fn(&str) -> usize + Send>,
    ) -> Self {
        Self { chat, writer: EventWriter::new(draft), store, count_tokens }
    }

    fn retell(&mut self, payloads: Vec<String>) -> Vec<String> {
        let mut out = Vec::new();
        for payload in payloads {
            for piece in read_chunk(&payload) {
                out.extend(self.writer.piece(piece).iter().map(Value::to_string));
            }
        }
        out
    }
}

impl StreamRenderer for ResponsesStream {
    fn start(&mut self) -> Vec<String> {
        // Chat's opening role chunks carry no text: nothing to re-tell.
        let _ = self.chat.start();
        self.writer.start().iter().map(Value::to_string).collect()
    }

    fn on_event(&mut self, index: usize, event: RequestEvent) -> Vec<String> {
        let payloads = self.chat.on_event(index, event);
        self.retell(payloads)
    }

    fn finish(&mut self) -> Vec<String> {
        let payloads = self.chat.finish();
        let mut out = self.retell(payloads);
        let reasoning_tokens = match self.writer.reasoning() {
            "" => 0,
            r => (self.count_tokens)(r),
        };
        let (events, response) = self.writer.complete(reasoning_tokens);
        out.extend(events.iter().map(Value::to_string));
        if let (Some(to), Some(response)) = (self.store.take(), response) {
            let mut conversation = to.conversation;
            conversation.push(answer_message(&response.output));
            to.store.put(Stored { response, conversation });
        }
        out
    }

    fn failed(&self) -> bool {
        self.chat.failed()
    }
}

/// The SSE response: each event as `event: <type>` and `data: <json>`, as vLLM frames them (no `[DONE]`).
pub fn response(renderer: ResponsesStream, merged: Merged) -> Response {
    #[derive(serde::Deserialize)]
    struct Kind {
        #[serde(rename = "type")]
        kind: String,
    }
    let events = sse::payloads(renderer, merged).filter_map(|payload| async move {
        if payload == sse::DONE {
            return None;
        }
        let kind = serde_json::from_str::<Kind>(&payload).map(|k| k.kind).unwrap_or_else(|_| "error".into());
        Some(Ok::<Event, Infallible>(Event::default().event(kind).data(payload)))
    });
    Sse::new(events).keep_alive(KeepAlive::default()).into_response()
}
