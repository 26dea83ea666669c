//! The `--reasoning-parser`s: how a reasoning model's output splits into `reasoning` and content, as vLLM's parsers
//! of the same names split it. A choice's text goes through its `ReasoningSplit` first; tool parsing and the
//! content of the answer see only what it leaves as content (vLLM's rule: tools and structured outputs apply to the
//! text after the reasoning).
//! - `deepseek_r1`, `qwen3`: `<think>`...`</think>`, open from the first output token (`think.rs`);
//! - `deepseek_v3`: `deepseek_r1` when the request turns thinking on (`chat_template_kwargs.thinking` or
//!   `enable_thinking`), else all content;
//! - `mistral`: `[THINK]`...`[/THINK]`;
//! - `gpt_oss`: harmony's channels, tool calls included (`harmony.rs`).

mod harmony;
mod think;

use serde_json::{Map, Value};

pub use harmony::HarmonySplitter;
pub use think::{ThinkSplitter, ThinkStyle};

use crate::openai::tool_parsers::FunctionCall;

/// A parser by its vLLM name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ReasoningParser {
    #[value(name = "deepseek_r1")]
    DeepseekR1,
    #[value(name = "deepseek_v3")]
    DeepseekV3,
    Qwen3,
    #[value(name = "gpt_oss")]
    GptOss,
    Mistral,
}

impl ReasoningParser {
    /// Whether the parser's markers are special tokens of the models it serves, which must then stay in the text
    /// (harmony's `<|channel|>` and friends, Mistral's `[THINK]`); `<think>` is an ordinary added token.
    pub fn needs_special_tokens(self) -> bool {
        matches!(self, Self::GptOss | Self::Mistral)
    }

    /// The text that ends the reasoning: structured outputs and tool grammars start after it (vLLM's rule).
    pub fn end_marker(self) -> &'static str {
        match self.markers() {
            Some((_, end)) => end,
            None => "<|channel|>final<|message|>",
        }
    }

    /// The markers of the `<think>`-style parsers.
    fn markers(self) -> Option<(&'static str, &'static str)> {
        match self {
            Self::DeepseekR1 | Self::DeepseekV3 | Self::Qwen3 => Some(("<think>", "</think>")),
            Self::Mistral => Some(("[THINK]", "[/THINK]")),
            Self::GptOss => None,
        }
    }
}

/// How one chat request's choices are read for reasoning (`None` in `ValidChat`: no parser).
#[derive(Debug, Clone, PartialEq)]
pub struct ReasoningReading {
    pub parser: ReasoningParser,
    /// `include_reasoning` (default true): false drops the reasoning from the answer.
    pub include: bool,
    /// All content, no reasoning: thinking turned off for the request (Qwen3's `enable_thinking: false`, DeepSeek
    /// V3 without `thinking`), or the prompt already closed the reasoning.
    pub identity: bool,
}

fn kwarg_bool(kwargs: &Map<String, Value>, key: &str) -> Option<bool> {
    kwargs.get(key).and_then(Value::as_bool)
}

impl ReasoningReading {
    /// The reading for a request with these template variables, whose rendered prompt is `prompt`.
    pub fn new(parser: ReasoningParser, include: bool, kwargs: &Map<String, Value>, prompt: &str) -> Self {
        let thinking_off = match parser {
            ReasoningParser::Qwen3 => kwarg_bool(kwargs, "enable_thinking") == Some(false),
            ReasoningParser::DeepseekV3 => {
                !(kwarg_bool(kwargs, "thinking").unwrap_or(false)
                    || kwarg_bool(kwargs, "enable_thinking").unwrap_or(false))
            }
            _ => false,
        };
        Self { parser, include, identity: thinking_off || prompt_ends_reasoning(parser, prompt) }
    }

    /// A fresh splitter for one choice.
    pub fn splitter(&self) -> ReasoningSplit {
        let inner = match (self.identity, self.parser, self.parser.markers()) {
            (true, ..) => Inner::Identity,
            (false, ReasoningParser::GptOss, _) => Inner::Harmony(HarmonySplitter::default()),
            (false, ReasoningParser::Mistral, Some((s, e))) => {
                Inner::Think(ThinkSplitter::new(s, e, ThinkStyle::Closed))
            }
            (false, ReasoningParser::Qwen3, Some((s, e))) => {
                Inner::Think(ThinkSplitter::new(s, e, ThinkStyle::OpenedQwen3))
            }
            (false, _, Some((s, e))) => Inner::Think(ThinkSplitter::new(s, e, ThinkStyle::Opened)),
            (false, _, None) => Inner::Identity,
        };
        ReasoningSplit { inner, include: self.include }
    }
}

/// Whether the prompt itself closed the reasoning (vLLM's `prompt_is_reasoning_end`): its last marker is the end
/// marker, as when Qwen3's template writes `<think>\n\n</think>` for `enable_thinking: false`. Only for the parsers
/// whose templates open the reasoning in the prompt; Mistral's model opens it itself, after the prompt.
pub fn prompt_ends_reasoning(parser: ReasoningParser, prompt: &str) -> bool {
    if parser == ReasoningParser::Mistral {
        return false;
    }
    match parser.markers() {
        Some((start, end)) => match (prompt.rfind(start), prompt.rfind(end)) {
            (s, Some(e)) => s.is_none_or(|s| s < e),
            (_, None) => false,
        },
        None => false,
    }
}

/// What a piece of a choice's output adds to each side.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReasoningPiece {
    /// Empty when nothing was added (or `include_reasoning` is false).
    pub reasoning: String,
    pub content: String,
    /// Tool calls the parser itself read (harmony).
    pub calls: Vec<FunctionCall>,
}

#[derive(Debug, Clone)]
enum Inner {
    Identity,
    Think(ThinkSplitter),
    Harmony(HarmonySplitter),
}

/// One choice's reasoning splitter.
#[derive(Debug, Clone)]
pub struct ReasoningSplit {
    inner: Inner,
    include: bool,
}

impl ReasoningSplit {
    /// Splits the next delta of the choice.
    pub fn push(&mut self, text: &str) -> ReasoningPiece {
        let piece = match &mut self.inner {
            Inner::Identity => ReasoningPiece { content: text.to_owned(), ..ReasoningPiece::default() },
            Inner::Think(t) => {
                let s = t.push(text);
                ReasoningPiece { reasoning: s.reasoning, content: s.content, calls: Vec::new() }
            }
            Inner::Harmony(h) => {
                let p = h.push(text);
                ReasoningPiece { reasoning: p.reasoning, content: p.content, calls: p.calls }
            }
        };
        self.filtered(piece)
    }

    /// The end of the choice: what was held back.
    pub fn finish(&mut self) -> ReasoningPiece {
        let piece = match &mut self.inner {
            Inner::Identity => ReasoningPiece::default(),
            Inner::Think(t) => {
                let s = t.finish();
                ReasoningPiece { reasoning: s.reasoning, content: s.content, calls: Vec::new() }
            }
            Inner::Harmony(h) => {
                let p = h.finish();
                ReasoningPiece { reasoning: p.reasoning, content: p.content, calls: p.calls }
            }
        };
        self.filtered(piece)
    }

    fn filtered(&self, mut piece: ReasoningPiece) -> ReasoningPiece {
        if !self.include {
            piece.reasoning.clear();
        }
        piece
    }

    /// A whole output split at once: (reasoning, content, calls); `None` for a side that got no text.
    pub fn split_whole(mut self, text: &str) -> (Option<String>, Option<String>, Vec<FunctionCall>) {
        let mut whole = self.push(text);
        let rest = self.finish();
        whole.reasoning.push_str(&rest.reasoning);
        whole.content.push_str(&rest.content);
        whole.calls.extend(rest.calls);
        let some = |s: String| (!s.is_empty()).then_some(s);
        (some(whole.reasoning), some(whole.content), whole.calls)
    }
}

#[cfg(test)]
mod tests;
