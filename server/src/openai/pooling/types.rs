//! The pooling routes' wire types, in vLLM's shapes: request bodies as clients send them (lenient: unknown fields
//! are ignored, values are checked in `validate`), and the response bodies of `/v1/embeddings`, `/pooling`,
//! `/classify`, `/score` and `/rerank`. Fields no server acts on (`user`, `priority`, ...) are accepted by being
//! ignored, as serde ignores any unknown field; the output options vLLM acts on are read and checked.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::openai::types::{ChatMessageIn, PromptField};

// ---------------------------------------------------------------------------------------------------------------
// Requests
// ---------------------------------------------------------------------------------------------------------------

/// `/v1/embeddings`, `/pooling` and `/classify`: inputs as a completions prompt (`input`) or a conversation
/// (`messages`, vLLM's chat form), and the settings the three share.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct EncodeRequest {
    pub model: Option<String>,
    /// A string, strings, token ids, or lists of token ids.
    pub input: Option<PromptField>,
    /// The chat form: one input, the conversation rendered with the chat template.
    pub messages: Option<Vec<ChatMessageIn>>,
    /// `float` (the default) or `base64` (little-endian f32 bytes).
    pub encoding_format: Option<String>,
    /// Matryoshka: keep this many values of each embedding.
    pub dimensions: Option<i64>,
    /// -1: the context length; k: keep each input's last k tokens.
    pub truncate_prompt_tokens: Option<i64>,
    /// Embed: L2-normalise (default: the model's pooler config).
    pub normalize: Option<bool>,
    /// Classify: the model's activation on the logits; embed: as `normalize` (vLLM's newer name for both).
    pub use_activation: Option<bool>,
    /// Older spellings of `use_activation`.
    pub activation: Option<bool>,
    pub softmax: Option<bool>,
    /// Default: true for `input`, false for `messages` (the template writes the special tokens).
    pub add_special_tokens: Option<bool>,
    /// The chat form: open the assistant's turn (default false).
    pub add_generation_prompt: Option<bool>,
    /// The chat form: leave the last message open.
    pub continue_final_message: Option<bool>,
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// `/pooling`: `embed` or `classify` (default: the model's first task).
    pub task: Option<String>,
    /// vLLM's output type of a base64 vector; only `float32` is served (`validate::served_options`).
    pub embed_dtype: Option<String>,
    /// vLLM's byte order of a base64 vector; `native` and `little` are served.
    pub endianness: Option<String>,
    /// vLLM's side `truncate_prompt_tokens` cuts; `left` (keep the last tokens) is served.
    pub truncation_side: Option<String>,
}

impl EncodeRequest {
    /// `use_activation`, or its older spellings.
    pub fn activation(&self) -> Option<bool> {
        self.use_activation.or(self.activation).or(self.softmax)
    }
}

/// One side of a score request: a string or a list of strings.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ScoreInputs {
    One(String),
    Many(Vec<String>),
}

impl ScoreInputs {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            ScoreInputs::One(s) => vec![s],
            ScoreInputs::Many(v) => v,
        }
    }
}

/// `/score`: two sides as `text_1` / `text_2`, or vLLM's newer spellings `queries` with `documents` or `items`,
/// and `data_1` / `data_2`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ScoreRequest {
    pub model: Option<String>,
    pub text_1: Option<ScoreInputs>,
    pub text_2: Option<ScoreInputs>,
    pub queries: Option<ScoreInputs>,
    pub documents: Option<ScoreInputs>,
    pub items: Option<ScoreInputs>,
    pub data_1: Option<ScoreInputs>,
    pub data_2: Option<ScoreInputs>,
    pub truncate_prompt_tokens: Option<i64>,
    pub use_activation: Option<bool>,
    pub activation: Option<bool>,
    pub softmax: Option<bool>,
}

impl ScoreRequest {
    /// The two sides with the names the request gave them, in vLLM's order of preference.
    pub fn sides(self) -> Option<(&'static str, ScoreInputs, &'static str, ScoreInputs)> {
        match self {
            Self { queries: Some(q), documents: Some(d), .. } => Some(("queries", q, "documents", d)),
            Self { queries: Some(q), items: Some(i), .. } => Some(("queries", q, "items", i)),
            Self { data_1: Some(a), data_2: Some(b), .. } => Some(("data_1", a, "data_2", b)),
            Self { text_1: Some(a), text_2: Some(b), .. } => Some(("text_1", a, "text_2", b)),
            _ => None,
        }
    }

    pub fn activation(&self) -> Option<bool> {
        self.use_activation.or(self.activation).or(self.softmax)
    }
}

/// `/rerank`, `/v1/rerank` (Jina's shape) and `/v2/rerank` (Cohere's): one query against documents.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct RerankRequest {
    pub model: Option<String>,
    pub query: String,
    pub documents: Vec<String>,
    /// The best `top_n` results; 0 or absent: all.
    pub top_n: Option<i64>,
    /// Whether each result carries its document's text (default true).
    pub return_documents: Option<bool>,
    pub truncate_prompt_tokens: Option<i64>,
    pub use_activation: Option<bool>,
    pub activation: Option<bool>,
    pub softmax: Option<bool>,
}

impl RerankRequest {
    pub fn activation(&self) -> Option<bool> {
        self.use_activation.or(self.activation).or(self.softmax)
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Responses
// ---------------------------------------------------------------------------------------------------------------

/// vLLM's `UsageInfo` of a pooling response: prompt tokens only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PoolingUsage {
    pub prompt_tokens: usize,
    pub total_tokens: usize,
    pub completion_tokens: usize,
    pub prompt_tokens_details: Option<()>,
}

impl PoolingUsage {
    pub fn new(prompt_tokens: usize) -> Self {
        Self { prompt_tokens, total_tokens: prompt_tokens, completion_tokens: 0, prompt_tokens_details: None }
    }
}

/// A vector as `encoding_format` asks: numbers, or base64 of little-endian f32 bytes.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Vector {
    Floats(Vec<f32>),
    Base64(String),
}

#[derive(Debug, Clone, Serialize)]
pub struct EmbeddingData {
    pub index: usize,
    pub object: &'static str,
    pub embedding: Vector,
}

#[derive(Debug, Clone, Serialize)]
pub struct PoolingData {
    pub index: usize,
    pub object: &'static str,
    pub data: Vector,
}

#[derive(Debug, Clone, Serialize)]
pub struct ClassifyData {
    pub index: usize,
    /// The best-scoring label's name.
    pub label: String,
    pub probs: Vec<f32>,
    pub num_classes: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct ScoreData {
    pub index: usize,
    pub object: &'static str,
    pub score: f32,
}

/// The body of `/v1/embeddings`, `/pooling`, `/classify` and `/score`: `{id, object: "list", created, model, data,
/// usage}`.
#[derive(Debug, Clone, Serialize)]
pub struct ListResponse<T> {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub data: Vec<T>,
    pub usage: PoolingUsage,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RerankDocument {
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RerankResult {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub document: Option<RerankDocument>,
    pub relevance_score: f32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RerankUsage {
    pub prompt_tokens: usize,
    pub total_tokens: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct RerankResponse {
    pub id: String,
    pub model: String,
    pub usage: RerankUsage,
    pub results: Vec<RerankResult>,
}
