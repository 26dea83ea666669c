//! Validation at the edge: an OpenAI request body becomes engine `GenerateRequest`s (one per choice) or a
//! `ValidationError`. One variant per rule; each message names the field and the allowed range. After this, nothing
//! re-reads the JSON.

use rserve_engine::api::{EngineInfo, GenerateRequest, SamplingParams, StopParams};
use rserve_engine::chat_template::ToolCall;
use rserve_engine::structured::Grammar;
use rserve_engine::TokenId;

use crate::openai::reasoning::{ReasoningParser, ReasoningReading};
use crate::openai::request_extras;
use crate::openai::structured;
use crate::openai::tools::{self, ToolMode, ToolReading, ToolSettings};
use crate::openai::types::{
    ChatCompletionRequest, ChatMessageIn, CompletionRequest, MessageContent, PromptField, SamplingFields, StopField,
};
use crate::port::{ChatRender, ChatTurn, Engine};

/// Most choices (`n`) per prompt.
pub const MAX_N: i64 = 128;
/// Most choices per request (prompts × n).
pub const MAX_CHOICES: usize = 256;
/// Most log-prob alternatives per token (`top_logprobs`, completions `logprobs`).
/// Most stop strings per request.
pub const MAX_STOP_STRINGS: usize = 64;

/// A broken rule. `param()` names the field; `code()` is OpenAI's error code where it has one.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ValidationError {
    #[error("temperature must be between 0 and 2, got {0}")]
    TemperatureOutOfRange(f64),
    #[error("top_p must be greater than 0 and at most 1, got {0}")]
    TopPOutOfRange(f64),
    #[error("top_k must be -1 or 0 (disabled) or a positive integer, got {0}")]
    TopKOutOfRange(i64),
    #[error("min_p must be between 0 and 1, got {0}")]
    MinPOutOfRange(f64),
    #[error("presence_penalty must be between -2 and 2, got {0}")]
    PresencePenaltyOutOfRange(f64),
    #[error("frequency_penalty must be between -2 and 2, got {0}")]
    FrequencyPenaltyOutOfRange(f64),
    #[error("repetition_penalty must be greater than 0 and at most 2, got {0}")]
    RepetitionPenaltyOutOfRange(f64),
    #[error("n must be between 1 and {MAX_N}, got {0}")]
    NOutOfRange(i64),
    #[error("{field} must be at least 1, got {value}")]
    MaxTokensTooSmall { field: &'static str, value: i64 },
    #[error("min_tokens must be at least 0, got {0}")]
    MinTokensNegative(i64),
    #[error("min_tokens ({min_tokens}) must be at most max_tokens ({max_tokens})")]
    MinTokensAboveMaxTokens { min_tokens: usize, max_tokens: usize },
    #[error("logit_bias keys must be token ids between 0 and {max_id}, got \"{key}\"")]
    LogitBiasKeyInvalid { key: String, max_id: usize },
    #[error("logit_bias values must be between -100 and 100, got {value} for token {key}")]
    LogitBiasValueOutOfRange { key: String, value: f64 },
    /// The bound is `--max-logprobs`.
    #[error("top_logprobs must be between 0 and {1}, got {0}")]
    TopLogprobsOutOfRange(i64, usize),
    #[error("top_logprobs requires logprobs to be true")]
    TopLogprobsWithoutLogprobs,
    #[error("logprobs must be between 0 and {1}, got {0}")]
    LogprobsOutOfRange(i64, usize),
    #[error("{param} must hold token ids between 0 and {max_id}, got {value}")]
    TokenIdOutOfRange { param: &'static str, value: i64, max_id: usize },
    #[error("stop strings must not be empty")]
    StopStringEmpty,
    #[error("at most {MAX_STOP_STRINGS} stop strings are allowed, got {0}")]
    TooManyStopStrings(usize),
    #[error("stream_options can only be set when stream is true")]
    StreamOptionsWithoutStream,
    #[error("best_of ({best_of}) must be at least n ({n})")]
    BestOfBelowN { best_of: i64, n: i64 },
    #[error("a request may produce at most {MAX_CHOICES} choices (prompts x n), got {0}")]
    TooManyChoices(usize),
    #[error("messages must hold at least one message")]
    MessagesEmpty,
    #[error("messages[{index}].content: parts of type '{kind}' are not supported (only 'text')")]
    ContentPartUnsupported { index: usize, kind: String },
    #[error("messages[{index}].content: a part of type 'text' needs a 'text' field")]
    ContentPartMissingText { index: usize },
    #[error("{field} must be {expected}")]
    ToolCallShape { field: String, expected: &'static str },
    #[error("this model has no chat template; start the server with --chat-template or use /v1/completions")]
    NoChatTemplate,
    #[error("the chat template failed on these messages: {0}")]
    ChatTemplate(String),
    #[error("the prompt could not be tokenized: {0}")]
    Tokenization(String),
    #[error("{0} must not be empty")]
    PromptEmpty(&'static str),
    #[error(
        "This model's maximum context length is {max_model_len} tokens. However, your request has {prompt_tokens} \
         input tokens, which leaves no room for output. Please reduce the length of the input."
    )]
    PromptTooLong { param: &'static str, prompt_tokens: usize, max_model_len: usize },
    #[error(
        "This model's maximum context length is {max_model_len} tokens. However, you requested {} tokens \
         ({prompt_tokens} in the input, {max_tokens} in the completion). Please reduce the length of the input or \
         of the completion.", prompt_tokens + max_tokens
    )]
    ContextLengthExceeded { param: &'static str, prompt_tokens: usize, max_tokens: usize, max_model_len: usize },
    #[error("either prompt or messages is required")]
    TokenizeInputMissing,
    #[error("{field}: {what} is not supported by this server")]
    Unsupported { field: String, what: String },
    #[error("{field}: {message}")]
    StructuredOutput { field: String, message: String },
    #[error("{field}: {message}")]
    Tools { field: String, message: String },
    #[error("{field}: {message}")]
    InvalidField { field: String, message: String },
}

impl ValidationError {
    /// The request field the error is about.
    pub fn param(&self) -> Option<String> {
        use ValidationError as V;
        let p: &str = match self {
            V::TemperatureOutOfRange(_) => "temperature",
            V::TopPOutOfRange(_) => "top_p",
            V::TopKOutOfRange(_) => "top_k",
            V::MinPOutOfRange(_) => "min_p",
            V::PresencePenaltyOutOfRange(_) => "presence_penalty",
            V::FrequencyPenaltyOutOfRange(_) => "frequency_penalty",
            V::RepetitionPenaltyOutOfRange(_) => "repetition_penalty",
            V::NOutOfRange(_) | V::TooManyChoices(_) => "n",
            V::MaxTokensTooSmall { field, .. } => field,
            V::MinTokensNegative(_) | V::MinTokensAboveMaxTokens { .. } => "min_tokens",
            V::LogitBiasKeyInvalid { .. } | V::LogitBiasValueOutOfRange { .. } => "logit_bias",
            V::TopLogprobsOutOfRange(..) | V::TopLogprobsWithoutLogprobs => "top_logprobs",
            V::LogprobsOutOfRange(..) => "logprobs",
            V::TokenIdOutOfRange { param, .. } => param,
            V::StopStringEmpty | V::TooManyStopStrings(_) => "stop",
            V::StreamOptionsWithoutStream => "stream_options",
            V::BestOfBelowN { .. } => "best_of",
            V::MessagesEmpty
            | V::ContentPartUnsupported { .. }
            | V::ContentPartMissingText { .. }
            | V::NoChatTemplate
            | V::ChatTemplate(_) => "messages",
            V::Tokenization(_) => return None,
            V::PromptEmpty(p) => p,
            V::PromptTooLong { param, .. } | V::ContextLengthExceeded { param, .. } => param,
            V::TokenizeInputMissing => "prompt",
            V::Unsupported { field, .. }
            | V::StructuredOutput { field, .. }
            | V::Tools { field, .. }
            | V::InvalidField { field, .. }
            | V::ToolCallShape { field, .. } => field,
        };
        Some(p.to_owned())
    }
}

type Result<T> = std::result::Result<T, ValidationError>;

/// The checked shared settings; one `GenerateRequest` per choice is made from them per prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct Common {
    pub sampling: SamplingParams,
    pub n: usize,
    /// As requested; `None` means the rest of the context.
    pub max_tokens: Option<usize>,
    pub stop: StopParams,
    pub stream: bool,
    pub include_usage: bool,
    /// `truncate_prompt_tokens`: keep only this many of the prompt's last tokens.
    pub truncate_prompt_tokens: Option<usize>,
}

fn check_range(v: Option<f64>, lo: f64, hi: f64, err: fn(f64) -> ValidationError) -> Result<Option<f64>> {
    match v {
        Some(x) if !(lo..=hi).contains(&x) => Err(err(x)),
        other => Ok(other),
    }
}

fn token_id(param: &'static str, value: i64, vocab_size: usize) -> Result<TokenId> {
    match u32::try_from(value) {
        Ok(id) if (id as usize) < vocab_size => Ok(TokenId(id)),
        _ => Err(ValidationError::TokenIdOutOfRange { param, value, max_id: vocab_size.saturating_sub(1) }),
    }
}

/// Checks every rule on the shared `SamplingFields`, starting from the engine's sampling defaults.
pub fn common(f: &SamplingFields, info: &EngineInfo, defaults: &SamplingParams) -> Result<Common> {
    use ValidationError as V;
    refuse_unimplemented_sampling(f)?;
    let mut s = defaults.clone();
    s.logprobs = None;
    s.seed = None;
    if let Some(t) = check_range(f.temperature, 0.0, 2.0, V::TemperatureOutOfRange)? {
        s.temperature = t as f32;
    }
    if let Some(p) = f.top_p {
        if !(p > 0.0 && p <= 1.0) {
            return Err(V::TopPOutOfRange(p));
        }
        s.top_p = p as f32;
    }
    if let Some(k) = f.top_k {
        if k < -1 {
            return Err(V::TopKOutOfRange(k));
        }
        s.top_k = usize::try_from(k).unwrap_or(0);
    }
    if let Some(p) = check_range(f.min_p, 0.0, 1.0, V::MinPOutOfRange)? {
        s.min_p = p as f32;
    }
    if let Some(p) = check_range(f.presence_penalty, -2.0, 2.0, V::PresencePenaltyOutOfRange)? {
        s.presence_penalty = p as f32;
    }
    if let Some(p) = check_range(f.frequency_penalty, -2.0, 2.0, V::FrequencyPenaltyOutOfRange)? {
        s.frequency_penalty = p as f32;
    }
    if let Some(p) = f.repetition_penalty {
        if !(p > 0.0 && p <= 2.0) {
            return Err(V::RepetitionPenaltyOutOfRange(p));
        }
        s.repetition_penalty = p as f32;
    }
    // Any 64-bit integer is a valid seed; negative ones keep their bits.
    s.seed = f.seed.map(|x| x as u64);
    if let Some(bias) = &f.logit_bias {
        let max_id = info.vocab_size.saturating_sub(1);
        let mut pairs = Vec::with_capacity(bias.len());
        for (key, &value) in bias {
            let id = key
                .trim()
                .parse::<u32>()
                .ok()
                .filter(|&id| (id as usize) < info.vocab_size)
                .ok_or_else(|| V::LogitBiasKeyInvalid { key: key.clone(), max_id })?;
            if !(-100.0..=100.0).contains(&value) {
                return Err(V::LogitBiasValueOutOfRange { key: key.clone(), value });
            }
            pairs.push((TokenId(id), value as f32));
        }
        pairs.sort_by_key(|p| p.0);
        s.logit_bias = pairs;
    }

    let n = match f.n {
        None => 1,
        Some(n) if (1..=MAX_N).contains(&n) => n as usize,
        Some(n) => return Err(V::NOutOfRange(n)),
    };

    let (max_field, max_value) = match (f.max_completion_tokens, f.max_tokens) {
        (Some(m), _) => ("max_completion_tokens", Some(m)),
        (None, m) => ("max_tokens", m),
    };
    let max_tokens = match max_value {
        None => None,
        Some(m) if m >= 1 => Some(usize::try_from(m).unwrap_or(usize::MAX)),
        Some(m) => return Err(V::MaxTokensTooSmall { field: max_field, value: m }),
    };
    let min_tokens = match f.min_tokens {
        None => 0,
        Some(m) if m < 0 => return Err(V::MinTokensNegative(m)),
        Some(m) => usize::try_from(m).unwrap_or(usize::MAX),
    };
    if let Some(max) = max_tokens {
        if min_tokens > max {
            return Err(V::MinTokensAboveMaxTokens { min_tokens, max_tokens: max });
        }
    }

    let stop: Vec<String> = match &f.stop {
        None => Vec::new(),
        Some(StopField::One(s)) => vec![s.clone()],
        Some(StopField::Many(v)) => v.clone(),
    };
    if stop.len() > MAX_STOP_STRINGS {
        return Err(V::TooManyStopStrings(stop.len()));
    }
    if stop.iter().any(String::is_empty) {
        return Err(V::StopStringEmpty);
    }
    let stop_token_ids = f
        .stop_token_ids
        .as_deref()
        .unwrap_or(&[])
        .iter()
        .map(|&id| token_id("stop_token_ids", id, info.vocab_size))
        .collect::<Result<Vec<TokenId>>>()?;

    let stream = f.stream.unwrap_or(false);
    if f.stream_options.is_some() && !stream {
        return Err(V::StreamOptionsWithoutStream);
    }
    let include_usage = f.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false);

    Ok(Common {
        sampling: s,
        n,
        max_tokens,
        stop: StopParams {
            max_tokens: 0,
            min_tokens,
            stop_token_ids,
            ignore_eos: f.ignore_eos.unwrap_or(false),
            stop,
            skip_special_tokens: f.skip_special_tokens.unwrap_or(true),
            include_stop_str_in_output: false,
        },
        stream,
        include_usage,
        truncate_prompt_tokens: None,
    })
}

/// The `n` engine requests of one prompt: checks the context length, fills `max_tokens`, derives per-choice seeds.
pub fn requests_for_prompt(
    c: &Common,
    prompt: Vec<TokenId>,
    info: &EngineInfo,
    param: &'static str,
) -> Result<Vec<GenerateRequest>> {
    let mut prompt = prompt;
    if let Some(k) = c.truncate_prompt_tokens {
        if prompt.len() > k {
            prompt.drain(..prompt.len() - k);
        }
    }
    let prompt_tokens = prompt.len();
    if prompt_tokens == 0 {
        return Err(ValidationError::PromptEmpty(param));
    }
    let max_model_len = info.max_model_len;
    let max_tokens = match c.max_tokens {
        Some(m) => {
            if prompt_tokens.saturating_add(m) > max_model_len {
                return Err(ValidationError::ContextLengthExceeded {
                    param,
                    prompt_tokens,
                    max_tokens: m,
                    max_model_len,
                });
            }
            m
        }
        None => {
            if prompt_tokens >= max_model_len {
                return Err(ValidationError::PromptTooLong { param, prompt_tokens, max_model_len });
            }
            // vLLM: the generation config's `max_new_tokens` when the client sends none.
            let room = max_model_len - prompt_tokens;
            info.default_max_tokens.map_or(room, |d| d.min(room))
        }
    };
    // vLLM's `override_max_tokens` (`--override-generation-config`'s `max_new_tokens`) caps every request.
    let max_tokens = info.max_tokens_cap.map_or(max_tokens, |cap| max_tokens.min(cap));
    let mut stop = c.stop.clone();
    stop.max_tokens = max_tokens;
    stop.min_tokens = stop.min_tokens.min(max_tokens);
    Ok((0..c.n)
        .map(|i| {
            let mut sampling = c.sampling.clone();
            sampling.seed = c.sampling.seed.map(|s| s.wrapping_add(i as u64));
            GenerateRequest { prompt_token_ids: prompt.clone(), sampling, stop: stop.clone(), pooling: None }
        })
        .collect())
}

/// A checked chat request: one engine request per choice.
#[derive(Debug, Clone)]
pub struct ValidChat {
    pub prompt_tokens: usize,
    pub requests: Vec<GenerateRequest>,
    pub stream: bool,
    pub include_usage: bool,
    /// `Some(k)`: return log-probs with k alternatives.
    pub logprobs: Option<usize>,
    /// How the choices are read for tool calls.
    pub tools: ToolReading,
    /// `echo`: text put in front of every choice's content.
    pub echo: Option<String>,
    /// How the choices split into reasoning and content (`--reasoning-parser`).
    pub reasoning: Option<ReasoningReading>,
}

fn unsupported(field: &str, what: &str) -> ValidationError {
    ValidationError::Unsupported { field: field.to_owned(), what: what.to_owned() }
}

/// `[(name, &value)]` of the named fields of `req`, for `refuse_unimplemented`.
macro_rules! named_fields {
    ($req:expr; $($field:ident),* $(,)?) => { [$((stringify!($field), &$req.$field)),*] };
}

/// Refuses the first field that is set to a value that would change the output (anything but null, false, "",
/// "none", [], {}): these are options vLLM acts on and this server does not implement, so answering without them
/// would return what the client did not ask for.
pub(crate) fn refuse_unimplemented(fields: &[(&str, &Option<serde_json::Value>)]) -> Result<()> {
    match fields.iter().find(|(_, v)| v.as_ref().is_some_and(|v| !is_empty_value(v))) {
        Some((field, _)) => Err(unsupported(field, unimplemented_feature(field))),
        None => Ok(()),
    }
}

/// What a field refused by `refuse_unimplemented` asks for, as the 400 names it.
fn unimplemented_feature(field: &str) -> &'static str {
    match field {
        "functions" | "function_call" => "function calling",
        "chat_template" => "a chat template in the request (vLLM also refuses it unless --trust-request-chat-template)",
        "logits_processors" => "custom logits processors",
        "use_beam_search" => "beam search",
        _ => "this option",
    }
}

/// The shared fields that `refuse_unimplemented` checks.
fn refuse_unimplemented_sampling(f: &SamplingFields) -> Result<()> {
    refuse_unimplemented(&named_fields!(f; use_beam_search, logits_processors))
}

/// The request's structured-output constraint, compiled by the engine's grammar engine (a spec it refuses is a 400
/// naming the field that asked for it).
fn constraint(f: &SamplingFields, engine: &dyn Engine) -> Result<Option<Grammar>> {
    let Some(req) = structured::requested(f)? else { return Ok(None) };
    engine
        .compile_grammar(&req.spec)
        .map(Some)
        .map_err(|e| ValidationError::StructuredOutput { field: req.field.to_owned(), message: e.to_string() })
}

/// True for JSON values that say "nothing": null, false, "", [], {}.
fn is_empty_value(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::Null | serde_json::Value::Bool(false) => true,
        serde_json::Value::String(s) => s.is_empty() || s == "none",
        serde_json::Value::Array(a) => a.is_empty(),
        serde_json::Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

/// Messages as the chat template sees them, shaped as vLLM shapes them: content parts joined with newlines (`null`
/// content is ""), an assistant's `tool_calls` checked (each needs a string `id`, `type` "function", a `function`
/// with a string `name` and string `arguments`, as vLLM's request types require; a 400 names the first field that is
/// wrong) and their `arguments` parsed into objects; an empty `tool_calls` list counts as none. A `tool` message
/// keeps its `tool_call_id` (optional, as under vLLM), any message its `name`.
pub fn chat_turns(messages: &[ChatMessageIn]) -> Result<Vec<ChatTurn>> {
    if messages.is_empty() {
        return Err(ValidationError::MessagesEmpty);
    }
    messages
        .iter()
        .enumerate()
        .map(|(index, m)| {
            let content = match &m.content {
                None => String::new(),
                Some(MessageContent::Text(t)) => t.clone(),
                Some(MessageContent::Parts(parts)) => {
                    let mut texts = Vec::with_capacity(parts.len());
                    for p in parts {
                        if p.kind != "text" {
                            return Err(ValidationError::ContentPartUnsupported { index, kind: p.kind.clone() });
                        }
                        texts.push(p.text.clone().ok_or(ValidationError::ContentPartMissingText { index })?);
                    }
                    texts.join("\n")
                }
            };
            let mut turn = ChatTurn::new(m.role.clone(), content);
            if m.role == "assistant" {
                turn.tool_calls = tool_calls(index, m.tool_calls.as_ref())?;
            }
            if m.role == "tool" {
                turn.tool_call_id = m.tool_call_id.clone();
            }
            turn.name = m.name.clone();
            Ok(turn)
        })
        .collect()
}

/// An assistant message's `tool_calls`, checked; `None` for null or an empty list.
fn tool_calls(index: usize, calls: Option<&serde_json::Value>) -> Result<Option<Vec<ToolCall>>> {
    use serde_json::Value;
    let shape = |field: String, expected| ValidationError::ToolCallShape { field, expected };
    let calls = match calls {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(calls)) if calls.is_empty() => return Ok(None),
        Some(Value::Array(calls)) => calls,
        Some(_) => return Err(shape(format!("messages[{index}].tool_calls"), "a list of tool calls")),
    };
    let mut out = Vec::with_capacity(calls.len());
    for (j, call) in calls.iter().enumerate() {
        let at = format!("messages[{index}].tool_calls[{j}]");
        let call = call.as_object().ok_or_else(|| shape(at.clone(), "an object"))?;
        let id = call.get("id").and_then(Value::as_str).ok_or_else(|| shape(format!("{at}.id"), "a string"))?;
        if call.get("type").and_then(Value::as_str) != Some("function") {
            return Err(shape(format!("{at}.type"), "\"function\""));
        }
        let function = call.get("function").and_then(Value::as_object);
        let function = function.ok_or_else(|| shape(format!("{at}.function"), "an object"))?;
        let name = function.get("name").and_then(Value::as_str);
        let name = name.ok_or_else(|| shape(format!("{at}.function.name"), "a string"))?;
        let arguments = function.get("arguments").filter(|a| a.is_string());
        let arguments = arguments.ok_or_else(|| shape(format!("{at}.function.arguments"), "a string (JSON)"))?;
        out.push(ToolCall::function(id, name, Some(arguments)));
    }
    Ok(Some(out))
}

/// Renders the turns with the chat template and tokenizes the result (no second BOS when the template wrote one).
pub fn chat_prompt(engine: &dyn Engine, turns: &[ChatTurn], add_generation_prompt: bool) -> Result<Vec<TokenId>> {
    chat_prompt_with_tools(engine, turns, None, add_generation_prompt)
}

/// [`chat_prompt`] with the request's `tools` (OpenAI function tools as sent, already checked) handed to the
/// template as vLLM hands them (`None`: the template sees no tools).
pub fn chat_prompt_with_tools(
    engine: &dyn Engine,
    turns: &[ChatTurn],
    tools: Option<&[serde_json::Value]>,
    add_generation_prompt: bool,
) -> Result<Vec<TokenId>> {
    render_prompt(engine, &ChatRender { turns, tools, add_generation_prompt, variables: None }, None)
        .map(|(_, ids)| ids)
}

/// Renders a conversation and tokenizes it (no second BOS when the template wrote one); `continue_final`: the last
/// message's content, after which the rendered text is cut (`continue_final_message`).
/// Returns the rendered text with its ids.
fn render_prompt(
    engine: &dyn Engine,
    render: &ChatRender<'_>,
    continue_final: Option<&str>,
) -> Result<(String, Vec<TokenId>)> {
    let mut text = engine
        .render_chat(render)
        .ok_or(ValidationError::NoChatTemplate)?
        .map_err(|e| ValidationError::ChatTemplate(e.to_string()))?;
    if let Some(last) = continue_final {
        text = request_extras::cut_after_final_message(&text, last)?;
    }
    let starts_with_bos = engine.bos_token().is_some_and(|b| !b.is_empty() && text.starts_with(&b));
    let ids = engine.encode(&text, !starts_with_bos).map_err(|e| ValidationError::Tokenization(e.to_string()))?;
    Ok((text, ids))
}

/// Checks a chat request and turns it into engine requests.
pub fn chat(
    req: &ChatCompletionRequest,
    engine: &dyn Engine,
    tool_settings: &ToolSettings,
    reasoning_parser: Option<ReasoningParser>,
) -> Result<ValidChat> {
    refuse_unimplemented(&named_fields!(req; functions, function_call, chat_template))?;
    let info = engine.info();
    let mut c = common(&req.sampling, info, &engine.default_sampling())?;
    request_extras::apply_sampling_extras(&req.sampling, engine, &mut c)?;
    let add_generation_prompt = req.add_generation_prompt.unwrap_or(true);
    let mut extras = request_extras::chat_extras(req, add_generation_prompt)?;
    request_extras::reasoning_effort(req, &mut extras.variables)?;
    c.sampling.constraint = constraint(&req.sampling, engine)?;
    let plan = tools::plan(req, tool_settings)?;
    if let Some(spec) = &plan.grammar {
        if c.sampling.constraint.is_some() {
            return Err(ValidationError::Tools {
                field: "tool_choice".into(),
                message: "structured outputs and a required or named tool choice cannot be used together".into(),
            });
        }
        let grammar = engine
            .compile_grammar(spec)
            .map_err(|e| ValidationError::Tools { field: "tools".into(), message: e.to_string() })?;
        c.sampling.constraint = Some(grammar);
    }
    if let ToolMode::Auto(parser) = plan.mode {
        // The parser's markers are special tokens for some models: keep them in the text (vLLM does the same).
        if parser.needs_special_tokens() {
            c.stop.skip_special_tokens = false;
        }
    }
    if reasoning_parser.is_some_and(ReasoningParser::needs_special_tokens) {
        // The parser's markers are special tokens: keep them in the text (vLLM does the same).
        c.stop.skip_special_tokens = false;
    }
    let top = match req.top_logprobs {
        Some(k) if k < 0 || k as u64 > info.max_logprobs as u64 => {
            return Err(ValidationError::TopLogprobsOutOfRange(k, info.max_logprobs))
        }
        Some(k) => k as usize,
        None => 0,
    };
    let logprobs = match req.logprobs {
        Some(true) => Some(top),
        _ if top > 0 => return Err(ValidationError::TopLogprobsWithoutLogprobs),
        _ => None,
    };
    c.sampling.logprobs = logprobs;
    let turns = chat_turns(&req.messages)?;
    // The tools reach the template whatever the tool choice, as vLLM passes them.
    let render = ChatRender {
        turns: &turns,
        tools: plan.tools.as_deref(),
        add_generation_prompt,
        variables: Some(&extras.variables),
    };
    let continued = extras.continue_final_message.then(|| turns.last().map(|t| t.content.as_str()).unwrap_or(""));
    let (prompt_text, prompt) = render_prompt(engine, &render, continued)?;
    let include_reasoning = req.include_reasoning.unwrap_or(true);
    let reasoning =
        reasoning_parser.map(|p| ReasoningReading::new(p, include_reasoning, &extras.variables, &prompt_text));
    // vLLM's rule: a grammar (structured outputs, a forced tool call) applies to the text after the reasoning, unless
    // there is none to wait for or the request leaves it out.
    if let Some(r) = reasoning.as_ref().filter(|r| r.include && !r.identity && c.sampling.constraint.is_some()) {
        let marker =
            engine.encode(r.parser.end_marker(), false).map_err(|e| ValidationError::Tokenization(e.to_string()))?;
        c.sampling.constraint_after = Some(marker);
    }
    let requests = requests_for_prompt(&c, prompt, info, "messages")?;
    let prompt_tokens = requests.first().map_or(0, |r| r.prompt_token_ids.len());
    let tools = ToolReading { mode: plan.mode, parallel: plan.parallel };
    Ok(ValidChat {
        prompt_tokens,
        requests,
        stream: c.stream,
        include_usage: c.include_usage,
        logprobs,
        tools,
        echo: extras.echo,
        reasoning,
    })
}

/// One prompt of a completions request.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidPrompt {
    pub token_count: usize,
    /// The prompt text to put in front of the output (`echo`).
    pub echo: Option<String>,
}

/// A checked completions request. `requests[p * n + i]` is choice `i` of prompt `p`.
#[derive(Debug, Clone)]
pub struct ValidCompletion {
    pub prompts: Vec<ValidPrompt>,
    pub n: usize,
    pub requests: Vec<GenerateRequest>,
    pub stream: bool,
    pub include_usage: bool,
    pub logprobs: Option<usize>,
    /// `max_tokens: 0` with `echo` (vLLM's form of scoring a prompt): each choice is its prompt alone; the engine
    /// still generates one token, which is not returned.
    pub prompt_only: bool,
}

enum PromptInput<'a> {
    Text(&'a str),
    Tokens(&'a [i64]),
}

fn prompt_inputs(p: &PromptField) -> Result<Vec<PromptInput<'_>>> {
    let v: Vec<PromptInput<'_>> = match p {
        PromptField::Text(s) => vec![PromptInput::Text(s)],
        PromptField::Texts(v) => v.iter().map(|s| PromptInput::Text(s)).collect(),
        PromptField::Tokens(t) => vec![PromptInput::Tokens(t)],
        PromptField::TokenLists(v) => v.iter().map(|t| PromptInput::Tokens(t)).collect(),
    };
    if v.is_empty() {
        return Err(ValidationError::PromptEmpty("prompt"));
    }
    Ok(v)
}

/// Checks a completions request and turns it into engine requests.
pub fn completion(req: &CompletionRequest, engine: &dyn Engine) -> Result<ValidCompletion> {
    let info = engine.info();
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(unsupported("suffix", "suffix (insertion)"));
    }
    let echo = req.echo.unwrap_or(false);
    // vLLM takes `max_tokens: 0` with `echo`: the prompt, scored, and nothing generated.
    let prompt_only = echo && (req.sampling.max_tokens == Some(0) && req.sampling.max_completion_tokens.is_none());
    let mut fields = std::borrow::Cow::Borrowed(&req.sampling);
    if prompt_only {
        fields.to_mut().max_tokens = Some(1);
    }
    let mut c = common(&fields, info, &engine.default_sampling())?;
    c.sampling.constraint = constraint(&req.sampling, engine)?;
    request_extras::apply_sampling_extras(&req.sampling, engine, &mut c)?;
    if let Some(b) = req.best_of {
        let n = c.n as i64;
        if b < n {
            return Err(ValidationError::BestOfBelowN { best_of: b, n });
        }
        if b > n {
            return Err(unsupported("best_of", "best_of greater than n"));
        }
    }
    let logprobs = match req.logprobs {
        Some(k) if k < 0 || k as u64 > info.max_logprobs as u64 => {
            return Err(ValidationError::LogprobsOutOfRange(k, info.max_logprobs))
        }
        Some(k) => Some(k as usize),
        None => None,
    };
    // echo with logprobs returns the prompt's log-probs too (vLLM asks for prompt_logprobs of the same width).
    if let (true, Some(k)) = (echo, logprobs) {
        c.sampling.prompt_logprobs = Some(c.sampling.prompt_logprobs.map_or(k, |p| p.max(k)));
    }
    c.sampling.logprobs = logprobs;
    let inputs = prompt_inputs(&req.prompt)?;
    let choices = inputs.len().saturating_mul(c.n);
    if choices > MAX_CHOICES {
        return Err(ValidationError::TooManyChoices(choices));
    }
    let add_special_tokens = req.add_special_tokens.unwrap_or(true);
    let mut prompts = Vec::with_capacity(inputs.len());
    let mut requests = Vec::with_capacity(choices);
    for input in inputs {
        let (ids, text) = match input {
            PromptInput::Text(t) => {
                let ids =
                    engine.encode(t, add_special_tokens).map_err(|e| ValidationError::Tokenization(e.to_string()))?;
                (ids, echo.then(|| t.to_owned()))
            }
            PromptInput::Tokens(t) => {
                let ids =
                    t.iter().map(|&id| token_id("prompt", id, info.vocab_size)).collect::<Result<Vec<TokenId>>>()?;
                let text = if echo {
                    Some(engine.decode(&ids, false).map_err(|e| ValidationError::Tokenization(e.to_string()))?)
                } else {
                    None
                };
                (ids, text)
            }
        };
        let choices = requests_for_prompt(&c, ids, info, "prompt")?;
        // Counted after truncate_prompt_tokens, as the engine sees the prompt.
        let token_count = choices.first().map_or(0, |r| r.prompt_token_ids.len());
        prompts.push(ValidPrompt { token_count, echo: text });
        requests.extend(choices);
    }
    Ok(ValidCompletion {
        prompts,
        n: c.n,
        requests,
        stream: c.stream,
        include_usage: c.include_usage,
        logprobs,
        prompt_only,
    })
}

/// Token ids as given on the wire (`/detokenize`), checked against the vocabulary.
pub fn token_ids(param: &'static str, ids: &[i64], info: &EngineInfo) -> Result<Vec<TokenId>> {
    ids.iter().map(|&id| token_id(param, id, info.vocab_size)).collect()
}

#[cfg(test)]
#[path = "validate_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "validate_props.rs"]
mod props;
