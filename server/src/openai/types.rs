//! OpenAI (and vLLM-extension) wire types: request bodies as clients send them (lenient: unknown fields are ignored,
//! values are checked later in `validate`; the sampling fields chat and completions share are one `SamplingFields`),
//! and response bodies / stream chunks exactly as OpenAI shapes them.

use std::collections::HashMap;

use rserve_engine::api::StopReason;
use serde::{Deserialize, Serialize};
use serde_json::Value;

// ---------------------------------------------------------------------------------------------------------------
// Requests
// ---------------------------------------------------------------------------------------------------------------

/// `stop`: one string or a list of strings.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

/// One part of an array-valued message `content`.
#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

/// A message's `content`: a string or a list of parts.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessageIn {
    pub role: String,
    #[serde(default)]
    pub content: Option<MessageContent>,
    /// An assistant's calls (checked in `validate::chat_turns`).
    #[serde(default)]
    pub tool_calls: Option<Value>,
    /// A `tool` message: the call it answers.
    #[serde(default)]
    pub tool_call_id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
}

/// A completions `prompt`: a string, strings, token ids, or lists of token ids.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PromptField {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<i64>),
    TokenLists(Vec<Vec<i64>>),
}

/// Declares `SamplingFields` and the request bodies that embed it. Each request type gets the fields listed for it plus
/// `sampling: SamplingFields`, and a `Deserialize` that reads one flat JSON object (the shared fields sit at the top
/// level, as in OpenAI's API) through a derived wire struct holding all of them.
///
/// Not `#[serde(flatten)]`: a flattened struct is deserialized from serde's buffered `Content`, out of
/// serde_path_to_error's sight, so a bad value (`"temperature": "hot"`) would be reported at path `.` and the 400's
/// `param` would no longer name the field. The wire struct here is an ordinary derived struct, named like the request
/// type, so paths and serde's messages (even "expected struct ChatCompletionRequest") are exactly those of one struct
/// with every field. Fields of a request may carry doc comments and then `#[serde(...)]` attributes; shared fields
/// doc comments only.
macro_rules! requests_with_sampling_fields {
    (
        $(#[$meta:meta])*
        pub struct SamplingFields { $($shared:tt)* }
        $($requests:tt)*
    ) => {
        $(#[$meta])*
        pub struct SamplingFields { $($shared)* }
        requests_with_sampling_fields!(@requests [$($shared)*] $($requests)*);
    };
    (@requests [$($shared:tt)*]) => {};
    (
        @requests [$($shared:tt)*]
        $(#[$meta:meta])*
        pub struct $name:ident { $($own:tt)* }
        $($rest:tt)*
    ) => {
        requests_with_sampling_fields!(@request [$($shared)*] $(#[$meta])* $name { $($own)* });
        requests_with_sampling_fields!(@requests [$($shared)*] $($rest)*);
    };
    (
        @request [$($(#[doc = $sdoc:literal])* pub $sfield:ident: $sty:ty,)*]
        $(#[$meta:meta])*
        $name:ident { $($(#[doc = $doc:literal])* $(#[serde($($serde:tt)*)])* pub $field:ident: $ty:ty,)* }
    ) => {
        $(#[$meta])*
        pub struct $name {
            $($(#[doc = $doc])* pub $field: $ty,)*
            /// The shared sampling and stopping fields (top-level fields on the wire).
            pub sampling: SamplingFields,
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                // The wire form, named like the request type so that serde's messages are unchanged.
                #[derive(serde::Deserialize)]
                struct $name {
                    $($(#[serde($($serde)*)])* $field: $ty,)*
                    $($sfield: $sty,)*
                }
                let wire = <$name as serde::Deserialize>::deserialize(deserializer)?;
                Ok(Self { $($field: wire.$field,)* sampling: SamplingFields { $($sfield: wire.$sfield,)* } })
            }
        }
    };
}

requests_with_sampling_fields! {
    /// The sampling and stopping fields that chat and completions share (and `rserve generate` fills from its flags);
    /// `validate::common` checks them all.
    #[derive(Debug, Clone, Default)]
    pub struct SamplingFields {
        pub max_tokens: Option<i64>,
        /// Wins over `max_tokens` when both are set.
        pub max_completion_tokens: Option<i64>,
        pub temperature: Option<f64>,
        pub top_p: Option<f64>,
        pub top_k: Option<i64>,
        pub min_p: Option<f64>,
        pub n: Option<i64>,
        pub stop: Option<StopField>,
        pub stop_token_ids: Option<Vec<i64>>,
        pub seed: Option<i64>,
        pub presence_penalty: Option<f64>,
        pub frequency_penalty: Option<f64>,
        pub repetition_penalty: Option<f64>,
        pub logit_bias: Option<HashMap<String, f64>>,
        pub ignore_eos: Option<bool>,
        pub min_tokens: Option<i64>,
        pub stream: Option<bool>,
        pub stream_options: Option<StreamOptions>,
        /// vLLM extension (default true).
        pub skip_special_tokens: Option<bool>,
        // Structured outputs, read by `structured::requested` (kept as JSON values there so that every error names
        // its field).
        pub response_format: Option<Value>,
        pub structured_outputs: Option<Value>,
        pub guided_json: Option<Value>,
        pub guided_regex: Option<Value>,
        pub guided_choice: Option<Value>,
        pub guided_grammar: Option<Value>,
        pub guided_whitespace_pattern: Option<Value>,
        // vLLM fields that change the output and are not implemented here: refused with 400 when set to anything
        // that changes something (`validate::refuse_unimplemented`), never ignored.
        pub allowed_token_ids: Option<Value>,
        pub bad_words: Option<Value>,
        pub truncate_prompt_tokens: Option<Value>,
        pub prompt_logprobs: Option<Value>,
        pub include_stop_str_in_output: Option<Value>,
        pub use_beam_search: Option<Value>,
        pub logits_processors: Option<Value>,
    }

    /// `POST /v1/chat/completions`.
    /// (`user` and other fields not listed are accepted and ignored, as OpenAI does.)
    #[derive(Debug, Clone, Default)]
    pub struct ChatCompletionRequest {
        pub model: Option<String>,
        #[serde(default)]
        pub messages: Vec<ChatMessageIn>,
        pub logprobs: Option<bool>,
        pub top_logprobs: Option<i64>,
        /// vLLM extension (default true).
        pub add_generation_prompt: Option<bool>,
        /// Tool calling (`tools::plan`).
        pub tools: Option<Value>,
        pub tool_choice: Option<Value>,
        pub parallel_tool_calls: Option<bool>,
        /// With a `--reasoning-parser`: false leaves the reasoning out of the answer (default true).
        pub include_reasoning: Option<bool>,
        /// One of vLLM's efforts (`validate::reasoning_effort`), handed to the chat template.
        pub reasoning_effort: Option<Value>,
        // Known but not supported (refused when set).
        pub functions: Option<Value>,
        pub function_call: Option<Value>,
        pub continue_final_message: Option<Value>,
        pub chat_template: Option<Value>,
        pub chat_template_kwargs: Option<Value>,
        pub documents: Option<Value>,
        pub echo: Option<Value>,
    }

    /// `POST /v1/completions`.
    #[derive(Debug, Clone)]
    pub struct CompletionRequest {
        pub model: Option<String>,
        pub prompt: PromptField,
        pub best_of: Option<i64>,
        pub logprobs: Option<i64>,
        pub echo: Option<bool>,
        pub suffix: Option<String>,
        /// vLLM extension.
        pub add_special_tokens: Option<bool>,
    }
}

/// `POST /tokenize` (vLLM): either `prompt` or `messages`.
#[derive(Debug, Clone, Deserialize)]
pub struct TokenizeRequest {
    pub model: Option<String>,
    pub prompt: Option<String>,
    pub messages: Option<Vec<ChatMessageIn>>,
    pub add_special_tokens: Option<bool>,
    pub add_generation_prompt: Option<bool>,
    #[serde(default)]
    pub return_token_strs: bool,
}

/// `POST /detokenize` (vLLM).
#[derive(Debug, Clone, Deserialize)]
pub struct DetokenizeRequest {
    pub model: Option<String>,
    pub tokens: Vec<i64>,
}

// ---------------------------------------------------------------------------------------------------------------
// Responses
// ---------------------------------------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PromptTokensDetails {
    pub cached_tokens: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UsageOut {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
}

impl UsageOut {
    pub fn new(prompt_tokens: usize, completion_tokens: usize, cached_tokens: usize) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: PromptTokensDetails { cached_tokens },
        }
    }
}

/// One alternative token in chat log-probs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TopLogprobOut {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

/// One sampled token in chat log-probs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatTokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprobOut>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatLogprobs {
    pub content: Vec<ChatTokenLogprob>,
}

/// A JSON object whose keys keep their order (top alternatives, best first).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct OrderedLogprobs(pub Vec<(String, f32)>);

impl Serialize for OrderedLogprobs {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

/// Legacy completions log-probs (parallel arrays).
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<Option<f32>>,
    pub top_logprobs: Vec<Option<OrderedLogprobs>>,
    pub text_offset: Vec<usize>,
}

/// The fields every generation response and stream chunk starts with; `object` names its kind (`chat.completion`,
/// `chat.completion.chunk`, `text_completion`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ResponseHead {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AssistantMessage {
    pub role: &'static str,
    /// Null when a choice answered with tool calls only.
    pub content: Option<String>,
    /// Always present (empty without calls), as vLLM writes it.
    pub tool_calls: Vec<ToolCallOut>,
    /// vLLM's reasoning field (`--reasoning-parser`): null when there is none.
    pub reasoning: Option<String>,
}

/// A function call in a response: `{"id", "type": "function", "function": {"name", "arguments"}}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolCallOut {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionOut,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FunctionOut {
    pub name: String,
    pub arguments: String,
}

/// A streamed piece of a call: the first carries id, type and name (arguments ""), later ones argument text only.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolCallDelta {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: FunctionDelta,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FunctionDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub arguments: String,
}

/// `stop_reason` on the wire: the stop token id as a number, or the stop string.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum StopReasonOut {
    Token(u32),
    Text(String),
}

impl From<StopReason> for StopReasonOut {
    fn from(r: StopReason) -> Self {
        match r {
            StopReason::Token(t) => Self::Token(t.0),
            StopReason::Text(s) => Self::Text(s),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatChoice {
    pub index: usize,
    pub message: AssistantMessage,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
    /// vLLM extension: the stop token id or stop string that ended the choice (null for EOS or length).
    pub stop_reason: Option<StopReasonOut>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatCompletionResponse {
    #[serde(flatten)]
    pub head: ResponseHead,
    pub choices: Vec<ChatChoice>,
    pub usage: UsageOut,
    /// vLLM's `prompt_logprobs` (asked for by the request's field of that name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<PromptLogprobsOut>,
}

/// vLLM's prompt log-probs: null for the first prompt token, then per token `{"<id>": {"logprob", "rank",
/// "decoded_token"}}` holding the prompt token and the top alternatives.
pub type PromptLogprobsOut = Vec<Option<serde_json::Map<String, Value>>>;

#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct ChatDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Reasoning text (`--reasoning-parser`), named as vLLM names it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatChunkChoice {
    pub index: usize,
    pub delta: ChatDelta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
    /// As in `ChatChoice`; set in the choice's last chunk.
    pub stop_reason: Option<StopReasonOut>,
}

/// `usage` in a stream chunk: absent unless `stream_options.include_usage`; then null except in the last chunk.
pub type ChunkUsage = Option<Option<UsageOut>>;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatCompletionChunk {
    #[serde(flatten)]
    pub head: ResponseHead,
    pub choices: Vec<ChatChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: ChunkUsage,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    /// vLLM's `prompt_logprobs` (asked for by the request's field of that name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<PromptLogprobsOut>,
    pub finish_reason: Option<&'static str>,
    /// vLLM extension: the stop token id or stop string that ended the choice (null for EOS or length).
    pub stop_reason: Option<StopReasonOut>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CompletionResponse {
    #[serde(flatten)]
    pub head: ResponseHead,
    pub choices: Vec<CompletionChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: ChunkUsage,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelCard {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
    pub root: String,
    pub parent: Option<String>,
    pub max_model_len: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelCard>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TokenizeResponse {
    pub count: usize,
    pub max_model_len: usize,
    pub tokens: Vec<u32>,
    pub token_strs: Option<Vec<String>>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DetokenizeResponse {
    pub prompt: String,
}
