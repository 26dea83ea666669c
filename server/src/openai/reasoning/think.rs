//! Reasoning between a start and an end marker (`<think>`...`</think>`, `[THINK]`...`[/THINK]`), split as text
//! arrives: a marker may be cut across deltas, so text that could begin one is held back until it cannot.
//!
//! Two shapes, as vLLM's parsers read them:
//! - `Opened` (deepseek_r1, qwen3): the chat template opens the reasoning in the prompt, so the output is reasoning
//!   from its first character until the end marker; a start marker the model writes itself is dropped. No end
//!   marker: everything is reasoning (the answer was cut short). Qwen3 also ends the reasoning where a real tool
//!   call (`<tool_call>` followed by `<function`) begins, the call staying in the content.
//! - `Closed` (mistral): the output is content until the start marker, reasoning until the end marker, then content
//!   again; an end marker without a start marker is dropped.

/// Where the splitter is in the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Content before any start marker (`Closed` only).
    Before,
    Reasoning,
    /// After the end marker: everything is content.
    After,
}

/// Which of vLLM's marker parsers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThinkStyle {
    /// The reasoning is open from the first output character (deepseek_r1).
    Opened,
    /// As `Opened`, and a Qwen3 tool call ends the reasoning.
    OpenedQwen3,
    /// Reasoning only inside the markers (mistral).
    Closed,
}

const TOOL_CALL: &str = "<tool_call>";
const FUNCTION: &str = "<function";

/// One choice's splitter.
#[derive(Debug, Clone)]
pub struct ThinkSplitter {
    start: &'static str,
    end: &'static str,
    style: ThinkStyle,
    phase: Phase,
    /// Whether the start marker was seen (only the first one is a marker).
    started: bool,
    held: String,
}

/// Text a push or finish adds to each side.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Sides {
    pub reasoning: String,
    pub content: String,
}

/// The length of the longest end of `text` that is a proper prefix of `marker`.
pub fn partial_suffix(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&k| text.is_char_boundary(text.len() - k) && marker.starts_with(&text[text.len() - k..]))
        .unwrap_or(0)
}

impl ThinkSplitter {
    pub fn new(start: &'static str, end: &'static str, style: ThinkStyle) -> Self {
        let phase = if style == ThinkStyle::Closed { Phase::Before } else { Phase::Reasoning };
        Self { start, end, style, phase, started: false, held: String::new() }
    }

    /// Splits the next delta; text that could begin a marker stays held.
    pub fn push(&mut self, text: &str) -> Sides {
        self.held.push_str(text);
        let mut out = Sides::default();
        loop {
            match self.phase {
                Phase::After => {
                    out.content.push_str(&std::mem::take(&mut self.held));
                    return out;
                }
                Phase::Before => {
                    // Content until the start marker; a stray end marker is dropped.
                    let end = self.held.find(self.end);
                    let start = self.held.find(self.start).filter(|&s| end.is_none_or(|e| s < e));
                    match (start, end) {
                        (Some(s), _) => {
                            out.content.push_str(&self.held[..s]);
                            self.held.drain(..s + self.start.len());
                            self.started = true;
                            self.phase = Phase::Reasoning;
                        }
                        (_, Some(e)) => {
                            out.content.push_str(&self.held[..e]);
                            self.held.drain(..e + self.end.len());
                        }
                        (None, None) => {
                            let keep = partial_suffix(&self.held, self.start).max(partial_suffix(&self.held, self.end));
                            let cut = self.held.len() - keep;
                            out.content.push_str(&self.held[..cut]);
                            self.held.drain(..cut);
                            return out;
                        }
                    }
                }
                Phase::Reasoning => {
                    let start = (!self.started).then(|| self.held.find(self.start)).flatten();
                    let end = self.held.find(self.end);
                    let call = self.tool_call_start();
                    // The earliest of the three decides.
                    let first =
                        [start.map(|i| (i, 0)), end.map(|i| (i, 1)), call.map(|i| (i, 2))].into_iter().flatten().min();
                    match first {
                        Some((i, 0)) => {
                            out.reasoning.push_str(&self.held[..i]);
                            self.held.drain(..i + self.start.len());
                            self.started = true;
                        }
                        Some((i, 1)) => {
                            out.reasoning.push_str(&self.held[..i]);
                            self.held.drain(..i + self.end.len());
                            self.phase = Phase::After;
                        }
                        Some((i, _)) => {
                            out.reasoning.push_str(&self.held[..i]);
                            self.held.drain(..i);
                            self.phase = Phase::After;
                        }
                        None => {
                            let mut keep = partial_suffix(&self.held, self.end);
                            if !self.started {
                                keep = keep.max(partial_suffix(&self.held, self.start));
                            }
                            if self.style == ThinkStyle::OpenedQwen3 {
                                keep = keep.max(self.tool_call_pending());
                            }
                            let cut = self.held.len() - keep;
                            out.reasoning.push_str(&self.held[..cut]);
                            self.held.drain(..cut);
                            return out;
                        }
                    }
                }
            }
        }
    }

    /// The end of the output: held text goes to the side it was on.
    pub fn finish(&mut self) -> Sides {
        let rest = std::mem::take(&mut self.held);
        match self.phase {
            Phase::Reasoning => Sides { reasoning: rest, content: String::new() },
            Phase::Before | Phase::After => Sides { reasoning: String::new(), content: rest },
        }
    }

    /// Qwen3: where a confirmed tool call (`<tool_call>`, whitespace, `<function`) starts in the held text.
    fn tool_call_start(&self) -> Option<usize> {
        if self.style != ThinkStyle::OpenedQwen3 {
            return None;
        }
        let mut from = 0;
        while let Some(i) = self.held[from..].find(TOOL_CALL).map(|i| i + from) {
            if self.held[i + TOOL_CALL.len()..].trim_start().starts_with(FUNCTION) {
                return Some(i);
            }
            from = i + TOOL_CALL.len();
        }
        None
    }

    /// Qwen3: the length of a held end that may still become a tool call (a prefix of `<tool_call>`, or
    /// `<tool_call>` followed by whitespace and a prefix of `<function`).
    fn tool_call_pending(&self) -> usize {
        if let Some(i) = self.held.rfind(TOOL_CALL) {
            let after = self.held[i + TOOL_CALL.len()..].trim_start();
            if FUNCTION.starts_with(after) {
                return self.held.len() - i;
            }
        }
        partial_suffix(&self.held, TOOL_CALL)
    }
}
