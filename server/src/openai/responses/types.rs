//! Responses API wire types: the request body as clients send it (lenient like chat's: unknown fields are ignored,
//! values are checked in `convert`), and the response object, its output items and usage exactly as OpenAI shapes
//! them. Ids are newtypes so that a response id can never be mistaken for an item or call id.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::openai::types::StopField;

/// A response's id: `resp_` and 32 hex digits, as vLLM makes them.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct ResponseId(String);

impl ResponseId {
    pub fn fresh() -> Self {
        Self(format!("resp_{:032x}", rand::random::<u128>()))
    }

    /// An id as a client sent it (it may name no stored response).
    pub fn from_client(id: &str) -> Self {
        Self(id.to_owned())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// An output item's id (`msg_`, `rs_`, `fc_` and 32 hex digits).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct ItemId(String);

impl ItemId {
    pub fn fresh(prefix: &str) -> Self {
        Self(format!("{prefix}_{:032x}", rand::random::<u128>()))
    }
}

/// `POST /v1/responses`. Sampling fields are the ones chat accepts (vLLM's extensions included); the fields after
/// `// refused` are options vLLM acts on that this server does not implement, refused when set (never ignored).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ResponsesRequest {
    pub model: Option<String>,
    /// A string, or a list of items (kept as JSON: `convert` reads it so that each error names its item).
    pub input: Option<Value>,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub seed: Option<i64>,
    pub stop: Option<StopField>,
    pub stop_token_ids: Option<Vec<i64>>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub logit_bias: Option<std::collections::HashMap<String, f64>>,
    pub ignore_eos: Option<bool>,
    pub min_tokens: Option<i64>,
    pub skip_special_tokens: Option<bool>,
    pub structured_outputs: Option<Value>,
    pub include_stop_str_in_output: Option<Value>,
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    pub text: Option<Value>,
    pub reasoning: Option<Value>,
    pub store: Option<bool>,
    pub previous_response_id: Option<String>,
    pub stream: Option<bool>,
    pub metadata: Option<Value>,
    pub user: Option<String>,
    pub service_tier: Option<String>,
    pub truncation: Option<String>,
    // refused
    pub background: Option<Value>,
    pub include: Option<Value>,
    pub prompt: Option<Value>,
    pub max_tool_calls: Option<Value>,
    pub previous_response: Option<Value>,
    pub previous_input_messages: Option<Value>,
    pub enable_response_messages: Option<Value>,
    pub request_id: Option<Value>,
    pub vllm_xargs: Option<Value>,
    pub mm_processor_kwargs: Option<Value>,
    pub priority: Option<Value>,
    pub cache_salt: Option<Value>,
    pub conversation: Option<Value>,
}

/// `usage` of a response.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ResponseUsage {
    pub input_tokens: usize,
    pub input_tokens_details: InputTokensDetails,
    pub output_tokens: usize,
    pub output_tokens_details: OutputTokensDetails,
    pub total_tokens: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InputTokensDetails {
    pub cached_tokens: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OutputTokensDetails {
    pub reasoning_tokens: usize,
}

impl ResponseUsage {
    pub fn new(input: usize, output: usize, cached: usize, reasoning: usize) -> Self {
        Self {
            input_tokens: input,
            input_tokens_details: InputTokensDetails { cached_tokens: cached },
            output_tokens: output,
            output_tokens_details: OutputTokensDetails { reasoning_tokens: reasoning },
            total_tokens: input + output,
        }
    }
}

/// `output_text` content of a message item.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OutputText {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub text: String,
    pub annotations: Vec<Value>,
    pub logprobs: Vec<Value>,
}

impl OutputText {
    pub fn new(text: String) -> Self {
        Self { kind: "output_text", text, annotations: Vec::new(), logprobs: Vec::new() }
    }
}

/// `reasoning_text` content of a reasoning item.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReasoningText {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub text: String,
}

impl ReasoningText {
    pub fn new(text: String) -> Self {
        Self { kind: "reasoning_text", text }
    }
}

/// `in_progress` while streaming, `completed` once whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemStatus {
    InProgress,
    Completed,
}

/// One item of a response's `output`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputItem {
    Reasoning { id: ItemId, summary: Vec<Value>, content: Vec<ReasoningText>, status: ItemStatus },
    Message { id: ItemId, role: &'static str, status: ItemStatus, content: Vec<OutputText> },
    FunctionCall { id: ItemId, call_id: String, name: String, arguments: String, status: ItemStatus },
}

/// A response's `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ResponseStatus {
    InProgress,
    Completed,
    Incomplete,
}

/// `incomplete_details` of a response cut at `max_output_tokens`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IncompleteDetails {
    pub reason: &'static str,
}

/// The request's settings a response object repeats (OpenAI's response echoes them), fixed when it is created.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Echo {
    pub instructions: Option<String>,
    pub max_output_tokens: usize,
    pub metadata: Option<Value>,
    pub parallel_tool_calls: bool,
    pub previous_response_id: Option<String>,
    pub reasoning: Option<Value>,
    pub service_tier: String,
    pub store: bool,
    pub temperature: f64,
    pub text: Value,
    pub tool_choice: Value,
    pub tools: Vec<Value>,
    pub top_p: f64,
    pub truncation: &'static str,
    pub user: Option<String>,
}

/// A response object (`"object": "response"`), as create, retrieve and the stream's lifecycle events carry it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ResponseObject {
    pub id: ResponseId,
    pub object: &'static str,
    pub created_at: u64,
    pub model: String,
    pub status: ResponseStatus,
    pub background: bool,
    pub error: Option<Value>,
    pub incomplete_details: Option<IncompleteDetails>,
    pub output: Vec<OutputItem>,
    pub usage: Option<ResponseUsage>,
    #[serde(flatten)]
    pub echo: Echo,
}
