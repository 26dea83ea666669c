//! Engine outputs in OpenAI's response shapes: whole responses for `stream: false` (`chat_response`,
//! `completion_response`) and stream chunk renderers for `stream: true` (`ChatStream`, `CompletionStream`), which turn
//! each engine event into the JSON of zero or more SSE `data:` lines.

use std::time::{SystemTime, UNIX_EPOCH};

use rserve_engine::api::{FinishReason, RequestEvent, Usage};
use serde::Serialize;

use crate::error::ApiError;
use crate::fanout::ChoiceOutput;
use crate::openai::logprobs;
use crate::openai::reasoning::{ReasoningReading, ReasoningSplit};
use crate::openai::tool_stream::{StreamPiece, ToolStream};
use crate::openai::tools::{self, ToolMode, ToolReading};
use crate::openai::types::{
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionResponse, ChatDelta,
    ChatLogprobs, ChunkUsage, CompletionChoice, CompletionLogprobs, CompletionResponse, FunctionDelta, FunctionOut,
    ResponseHead, ToolCallDelta, ToolCallOut, UsageOut,
};
use crate::openai::validate::ValidPrompt;
use crate::sse::StreamRenderer;

/// Id, creation time and model name shared by a response and all its chunks.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponseMeta {
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl ResponseMeta {
    /// A fresh id such as `chatcmpl-<32 hex digits>`.
    pub fn new(prefix: &str, model: String) -> Self {
        let created = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        Self { id: format!("{prefix}-{:032x}", rand::random::<u128>()), created, model }
    }

    /// The head of a response or chunk of kind `object`.
    pub fn head(&self, object: &'static str) -> ResponseHead {
        ResponseHead { id: self.id.clone(), object, created: self.created, model: self.model.clone() }
    }
}

/// Serializes a chunk; our types always serialize, but a failure still yields valid JSON.
pub fn to_json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|e| error_json(&format!("serialization failed: {e}")))
}

/// The `data:` payload that reports an engine failure inside a stream.
pub fn error_json(message: &str) -> String {
    serde_json::to_string(&ApiError::Internal(message.to_owned()).body()).unwrap_or_else(|_| {
        r#"{"error":{"message":"internal error","type":"InternalServerError","param":null,"code":500}}"#.into()
    })
}

/// Token counts summed over choices: prompts counted once, completions per choice.
#[derive(Debug, Clone, Copy, Default)]
struct UsageSum {
    prompt: usize,
    completion: usize,
    cached: usize,
}

impl UsageSum {
    fn out(&self) -> UsageOut {
        UsageOut::new(self.prompt, self.completion, self.cached)
    }
}

/// The response to a non-streaming chat request.
pub fn chat_response(
    meta: ResponseMeta,
    prompt_tokens: usize,
    outputs: Vec<ChoiceOutput>,
    with_logprobs: bool,
    tools: &ToolReading,
    reasoning: Option<&ReasoningReading>,
) -> ChatCompletionResponse {
    let completion = outputs.iter().map(|o| o.usage.completion_tokens).sum();
    let cached = outputs.iter().map(|o| o.usage.cached_tokens).max().unwrap_or(0);
    // The prompt is every choice's: vLLM reports its scores once, beside the choices.
    let prompt_logprobs = outputs.iter().find_map(|o| o.prompt_logprobs.as_ref()).map(|(_, s)| logprobs::prompt(s));
    let choices = outputs
        .into_iter()
        .enumerate()
        .map(|(index, o)| {
            let (content, calls, reasoning) = read_choice(tools, reasoning, &o.text);
            let finish_reason = o.finish.map(|f| tools::finish_reason(&tools.mode, f.as_str(), !calls.is_empty()));
            let tool_calls = calls
                .into_iter()
                .map(|c| ToolCallOut {
                    id: c.id,
                    kind: "function",
                    function: FunctionOut { name: c.call.name, arguments: c.call.arguments },
                })
                .collect();
            ChatChoice {
                index,
                logprobs: with_logprobs.then(|| logprobs::chat(&o.logprobs)),
                message: AssistantMessage { role: "assistant", content, tool_calls, reasoning },
                finish_reason,
                stop_reason: o.stop_reason.map(Into::into),
            }
        })
        .collect();
    ChatCompletionResponse {
        head: meta.head("chat.completion"),
        choices,
        usage: UsageOut::new(prompt_tokens, completion, cached),
        prompt_logprobs,
    }
}

/// A finished choice's text: its reasoning split off first (with a parser), then its content read for tool calls;
/// calls the reasoning parser read itself (harmony's) come first. Returns (content, calls, reasoning).
fn read_choice(
    tools: &ToolReading,
    reasoning: Option<&ReasoningReading>,
    text: &str,
) -> (Option<String>, Vec<tools::ToolCall>, Option<String>) {
    let Some(reading) = reasoning else {
        let (content, calls) = tools::read_output(&tools.mode, tools.parallel, text);
        return (content, calls, None);
    };
    let (thought, content, parser_calls) = reading.splitter().split_whole(text);
    let (content, mut calls) = match content {
        Some(c) => tools::read_output(&tools.mode, tools.parallel, &c),
        None => (None, Vec::new()),
    };
    let mut all: Vec<tools::ToolCall> =
        parser_calls.into_iter().map(|call| tools::ToolCall { id: tools::call_id(), call }).collect();
    all.append(&mut calls);
    (content.filter(|c| !c.is_empty()), all, thought)
}

/// The response to a non-streaming completions request; choice `i` belongs to prompt `i / n`. `prompt_only`: each
/// choice is its echoed prompt alone (`max_tokens: 0`), the token the engine generated left out.
pub fn completion_response(
    meta: ResponseMeta,
    prompts: &[ValidPrompt],
    n: usize,
    outputs: Vec<ChoiceOutput>,
    with_logprobs: bool,
    prompt_only: bool,
) -> CompletionResponse {
    let n = n.max(1);
    let mut usage = UsageSum { prompt: prompts.iter().map(|p| p.token_count).sum(), ..UsageSum::default() };
    let mut choices = Vec::with_capacity(outputs.len());
    for (index, mut o) in outputs.into_iter().enumerate() {
        if prompt_only {
            // The one token the engine had to generate is not part of the answer.
            o = ChoiceOutput {
                finish: Some(FinishReason::Length),
                usage: Usage { completion_tokens: 0, ..o.usage },
                prompt_logprobs: o.prompt_logprobs,
                ..ChoiceOutput::default()
            };
        }
        usage.completion += o.usage.completion_tokens;
        if index.checked_rem(n) == Some(0) {
            usage.cached += o.usage.cached_tokens;
        }
        let echo = prompts.get(index / n).and_then(|p| p.echo.as_deref());
        let logprobs = with_logprobs.then(|| {
            let mut lp = CompletionLogprobs::default();
            // An echoed prompt's own tokens come first, scored (vLLM's form of scoring a text).
            let offset = match (echo, &o.prompt_logprobs) {
                (Some(_), Some((first, scored))) => logprobs::completion_prompt(first, scored, &mut lp),
                (e, _) => e.map_or(0, |e| e.chars().count()),
            };
            logprobs::completion(&o.logprobs, offset, &mut lp);
            lp
        });
        choices.push(CompletionChoice {
            index,
            text: format!("{}{}", echo.unwrap_or(""), o.text),
            logprobs,
            prompt_logprobs: o.prompt_logprobs.as_ref().map(|(_, scored)| logprobs::prompt(scored)),
            finish_reason: o.finish.map(|f| f.as_str()),
            stop_reason: o.stop_reason.map(Into::into),
        });
    }
    CompletionResponse { head: meta.head("text_completion"), choices, usage: Some(Some(usage.out())) }
}

/// Renders a chat stream: a role chunk per choice, content chunks, a finish chunk per choice, then usage.
pub struct ChatStream {
    meta: ResponseMeta,
    n: usize,
    include_usage: bool,
    with_logprobs: bool,
    usage: UsageSum,
    failed: bool,
    /// Per choice: how its text becomes content and tool-call deltas.
    tools: Vec<ToolStream>,
    /// `echo`: content sent right after each choice's role chunk.
    echo: Option<String>,
    /// Per choice, with a reasoning parser: its splitter, and how many calls it read (their stream indices).
    reasoning: Vec<(ReasoningSplit, usize)>,
}

impl ChatStream {
    pub fn new(meta: ResponseMeta, n: usize, prompt_tokens: usize, include_usage: bool, with_logprobs: bool) -> Self {
        let usage = UsageSum { prompt: prompt_tokens, ..UsageSum::default() };
        let tools = (0..n).map(|_| ToolStream::new(ToolMode::Off, true)).collect();
        Self { meta, n, include_usage, with_logprobs, usage, failed: false, tools, echo: None, reasoning: Vec::new() }
    }

    /// Sends `echo` as the first content of every choice (chat `echo`).
    pub fn with_echo(mut self, echo: Option<String>) -> Self {
        self.echo = echo.filter(|e| !e.is_empty());
        self
    }

    /// Reads every choice for tool calls as `reading` says.
    pub fn with_tools(mut self, reading: &ToolReading) -> Self {
        self.tools = (0..self.n).map(|_| ToolStream::new(reading.mode.clone(), reading.parallel)).collect();
        self
    }

    /// Splits every choice's text into reasoning and content first, as `reading` says.
    pub fn with_reasoning(mut self, reading: Option<&ReasoningReading>) -> Self {
        self.reasoning = reading.map(|r| (0..self.n).map(|_| (r.splitter(), 0)).collect()).unwrap_or_default();
        self
    }

    /// The chunks of a piece of output with a reasoning parser: the reasoning (with the event's log-probs), then
    /// the content through the tool reading, then the calls the reasoning parser read. `last`: the choice ended,
    /// so what either side held back comes out.
    fn reasoning_chunks(
        &mut self,
        index: usize,
        text: &str,
        mut logprobs: Option<ChatLogprobs>,
        last: bool,
    ) -> Vec<String> {
        let Some((split, made)) = self.reasoning.get_mut(index) else { return Vec::new() };
        let piece = if last { split.finish() } else { split.push(text) };
        let first_call = *made;
        *made += piece.calls.len();
        let mut out = Vec::new();
        if !piece.reasoning.is_empty() {
            let delta = ChatDelta { reasoning: Some(piece.reasoning), ..ChatDelta::default() };
            let choice =
                ChatChunkChoice { index, delta, logprobs: logprobs.take(), finish_reason: None, stop_reason: None };
            out.push(self.chunk(vec![choice], self.null_usage()));
        }
        let tool_piece = match self.tools.get_mut(index) {
            Some(t) if !t.is_off() => {
                let mut p = if piece.content.is_empty() { StreamPiece::default() } else { t.push(&piece.content) };
                if last {
                    let rest = t.finish();
                    p.content = match (p.content, rest.content) {
                        (Some(a), Some(b)) => Some(a + &b),
                        (a, b) => a.or(b),
                    };
                    p.calls.extend(rest.calls);
                }
                p
            }
            _ => StreamPiece { content: (!piece.content.is_empty()).then_some(piece.content), calls: Vec::new() },
        };
        let mut calls: Vec<ToolCallDelta> = piece
            .calls
            .into_iter()
            .enumerate()
            .map(|(i, call)| ToolCallDelta {
                index: first_call + i,
                id: Some(tools::call_id()),
                kind: Some("function"),
                function: FunctionDelta { name: Some(call.name), arguments: call.arguments },
            })
            .collect();
        calls.extend(tool_piece.calls);
        let has_content = tool_piece.content.as_ref().is_some_and(|c| !c.is_empty());
        let logprobs = if has_content { logprobs } else { None };
        out.extend(self.piece_chunks(
            index,
            StreamPiece { content: tool_piece.content.filter(|c| !c.is_empty()), calls },
            logprobs,
        ));
        out
    }

    /// The end of a choice without a reasoning parser: what its tool reading held back, and its finish reason.
    fn finish_tools(&mut self, index: usize, reason: &'static str) -> (Vec<String>, &'static str) {
        match self.tools.get_mut(index) {
            Some(t) if !t.is_off() => {
                let piece = t.finish();
                let made = t.made_calls();
                let mode = t.mode().clone();
                (self.piece_chunks(index, piece, None), tools::finish_reason(&mode, reason, made))
            }
            _ => (Vec::new(), reason),
        }
    }

    /// Whether choice `index` made tool calls, through its tool reading or its reasoning parser.
    fn made_calls(&self, index: usize) -> bool {
        self.tools.get(index).is_some_and(ToolStream::made_calls)
            || self.reasoning.get(index).is_some_and(|(_, made)| *made > 0)
    }

    /// The chunks of a piece of a choice's stream: content (with the event's log-probs), then tool-call deltas.
    fn piece_chunks(&self, index: usize, piece: StreamPiece, logprobs: Option<ChatLogprobs>) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(text) = piece.content {
            let delta = ChatDelta { content: Some(text), ..ChatDelta::default() };
            let choice = ChatChunkChoice { index, delta, logprobs, finish_reason: None, stop_reason: None };
            out.push(self.chunk(vec![choice], self.null_usage()));
        }
        if !piece.calls.is_empty() {
            let delta = ChatDelta { tool_calls: Some(piece.calls), ..ChatDelta::default() };
            let choice = ChatChunkChoice { index, delta, logprobs: None, finish_reason: None, stop_reason: None };
            out.push(self.chunk(vec![choice], self.null_usage()));
        }
        out
    }

    fn chunk(&self, choices: Vec<ChatChunkChoice>, usage: ChunkUsage) -> String {
        to_json(&ChatCompletionChunk { head: self.meta.head("chat.completion.chunk"), choices, usage })
    }

    fn null_usage(&self) -> ChunkUsage {
        self.include_usage.then_some(None)
    }
}

impl StreamRenderer for ChatStream {
    fn start(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        for index in 0..self.n {
            let delta = ChatDelta { role: Some("assistant"), content: Some(String::new()), ..ChatDelta::default() };
            out.push(self.chunk(
                vec![ChatChunkChoice { index, delta, logprobs: None, finish_reason: None, stop_reason: None }],
                self.null_usage(),
            ));
            if let Some(echo) = &self.echo {
                let delta = ChatDelta { content: Some(echo.clone()), ..ChatDelta::default() };
                out.push(self.chunk(
                    vec![ChatChunkChoice { index, delta, logprobs: None, finish_reason: None, stop_reason: None }],
                    self.null_usage(),
                ));
            }
        }
        out
    }

    fn on_event(&mut self, index: usize, event: RequestEvent) -> Vec<String> {
        match event {
            RequestEvent::Delta { text, logprobs: lps, .. } => {
                if text.is_empty() && (lps.is_empty() || !self.with_logprobs) {
                    return Vec::new();
                }
                let logprobs = self.with_logprobs.then(|| logprobs::chat(&lps));
                if !self.reasoning.is_empty() {
                    return self.reasoning_chunks(index, &text, logprobs, false);
                }
                match self.tools.get_mut(index) {
                    Some(t) if !t.is_off() => {
                        let piece = t.push(&text);
                        self.piece_chunks(index, piece, logprobs)
                    }
                    _ => {
                        let delta = ChatDelta { content: Some(text), ..ChatDelta::default() };
                        let choice = ChatChunkChoice { index, delta, logprobs, finish_reason: None, stop_reason: None };
                        vec![self.chunk(vec![choice], self.null_usage())]
                    }
                }
            }
            RequestEvent::Finished { reason, usage, stop_reason } => {
                self.usage.completion += usage.completion_tokens;
                self.usage.cached = self.usage.cached.max(usage.cached_tokens);
                let (mut out, finish_reason) = if !self.reasoning.is_empty() {
                    let out = self.reasoning_chunks(index, "", None, true);
                    let mode = self.tools.get(index).map(|t| t.mode().clone()).unwrap_or(ToolMode::Off);
                    (out, tools::finish_reason(&mode, reason.as_str(), self.made_calls(index)))
                } else {
                    self.finish_tools(index, reason.as_str())
                };
                let choice = ChatChunkChoice {
                    index,
                    delta: ChatDelta::default(),
                    logprobs: None,
                    finish_reason: Some(finish_reason),
                    stop_reason: stop_reason.map(Into::into),
                };
                out.push(self.chunk(vec![choice], self.null_usage()));
                out
            }
            RequestEvent::Error(message) => {
                self.failed = true;
                vec![error_json(&message)]
            }
            // A streamed chat request cannot ask for them (`prompt_logprobs` with `stream` is refused); a generation
            // request never pools.
            RequestEvent::PromptLogprobs { .. } | RequestEvent::Pooled { .. } => Vec::new(),
        }
    }

    fn finish(&mut self) -> Vec<String> {
        if self.include_usage && !self.failed {
            vec![self.chunk(Vec::new(), Some(Some(self.usage.out())))]
        } else {
            Vec::new()
        }
    }

    fn failed(&self) -> bool {
        self.failed
    }
}

/// Renders a completions stream: the echoed prompt first (if asked), text chunks, a finish chunk per choice, usage.
pub struct CompletionStream {
    meta: ResponseMeta,
    /// Per choice: the echo text (sent first) and the character offset for log-probs.
    echo: Vec<Option<String>>,
    offsets: Vec<usize>,
    n: usize,
    include_usage: bool,
    with_logprobs: bool,
    usage: UsageSum,
    failed: bool,
    /// `max_tokens: 0` with `echo`: the prompt alone (`completion_response`'s `prompt_only`).
    prompt_only: bool,
}

impl CompletionStream {
    pub fn new(
        meta: ResponseMeta,
        prompts: &[ValidPrompt],
        n: usize,
        include_usage: bool,
        with_logprobs: bool,
    ) -> Self {
        let n = n.max(1);
        let echo: Vec<Option<String>> = prompts.iter().flat_map(|p| std::iter::repeat_n(p.echo.clone(), n)).collect();
        let usage = UsageSum { prompt: prompts.iter().map(|p| p.token_count).sum(), ..UsageSum::default() };
        let offsets = vec![0; echo.len()];
        Self { offsets, echo, meta, n, include_usage, with_logprobs, usage, failed: false, prompt_only: false }
    }

    /// Each choice is its echoed prompt alone (`max_tokens: 0`): the engine's one generated token is not sent.
    pub fn with_prompt_only(mut self, prompt_only: bool) -> Self {
        self.prompt_only = prompt_only;
        self
    }

    /// A chunk of choice `index`'s text (and its tokens' log-probs).
    fn text_chunk(&self, index: usize, text: String, logprobs: Option<CompletionLogprobs>) -> String {
        let choice =
            CompletionChoice { index, text, logprobs, prompt_logprobs: None, finish_reason: None, stop_reason: None };
        self.chunk(choice)
    }

    fn chunk(&self, choice: CompletionChoice) -> String {
        to_json(&CompletionResponse {
            head: self.meta.head("text_completion"),
            choices: vec![choice],
            usage: self.include_usage.then_some(None),
        })
    }
}

impl StreamRenderer for CompletionStream {
    fn start(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        if self.with_logprobs {
            // The echo goes out with its prompt's scores, when they come (`RequestEvent::PromptLogprobs`).
            return out;
        }
        for index in 0..self.echo.len() {
            if let Some(text) = self.echo[index].take() {
                self.offsets[index] = text.chars().count();
                out.push(self.text_chunk(index, text, None));
            }
        }
        out
    }

    fn on_event(&mut self, index: usize, event: RequestEvent) -> Vec<String> {
        match event {
            RequestEvent::PromptLogprobs { first, scored } => {
                let Some(text) = self.echo.get_mut(index).and_then(Option::take) else { return Vec::new() };
                let mut lp = CompletionLogprobs::default();
                let offset = logprobs::completion_prompt(&first, &scored, &mut lp);
                if let Some(off) = self.offsets.get_mut(index) {
                    *off = offset;
                }
                vec![self.text_chunk(index, text, Some(lp))]
            }
            RequestEvent::Delta { text, logprobs: lps, .. } => {
                if self.prompt_only || (text.is_empty() && (lps.is_empty() || !self.with_logprobs)) {
                    return Vec::new();
                }
                let logprobs = self.with_logprobs.then(|| {
                    let mut lp = CompletionLogprobs::default();
                    if let Some(off) = self.offsets.get_mut(index) {
                        *off = logprobs::completion(&lps, *off, &mut lp);
                    }
                    lp
                });
                vec![self.text_chunk(index, text, logprobs)]
            }
            RequestEvent::Finished { reason, usage, stop_reason } => {
                let (reason, stop_reason, usage) = match self.prompt_only {
                    true => (FinishReason::Length, None, Usage { completion_tokens: 0, ..usage }),
                    false => (reason, stop_reason, usage),
                };
                self.usage.completion += usage.completion_tokens;
                if index.checked_rem(self.n) == Some(0) {
                    self.usage.cached += usage.cached_tokens;
                }
                vec![self.chunk(CompletionChoice {
                    index,
                    text: String::new(),
                    logprobs: None,
                    prompt_logprobs: None,
                    finish_reason: Some(reason.as_str()),
                    stop_reason: stop_reason.map(Into::into),
                })]
            }
            RequestEvent::Error(message) => {
                self.failed = true;
                vec![error_json(&message)]
            }
            // A generation request never pools.
            RequestEvent::Pooled { .. } => Vec::new(),
        }
    }

    fn finish(&mut self) -> Vec<String> {
        if self.include_usage && !self.failed {
            vec![to_json(&CompletionResponse {
                head: self.meta.head("text_completion"),
                choices: Vec::new(),
                usage: Some(Some(self.usage.out())),
            })]
        } else {
            Vec::new()
        }
    }

    fn failed(&self) -> bool {
        self.failed
    }
}

#[cfg(test)]
#[path = "render_tests.rs"]
mod tests;
