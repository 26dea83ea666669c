//! Tool calls in a chat stream, one `ToolStream` per choice: the text deltas of a choice become content deltas and
//! tool-call deltas in OpenAI's shape (a call's first delta has its id, type and name; argument text follows), so
//! that the deltas reassemble to the non-streamed answer.
//! - a named choice streams its arguments as they are generated (the name goes first);
//! - `required` is a JSON list: it is read when the choice ends;
//! - `auto` streams content until the parser's marker shows up (holding back what could be its beginning), then
//!   reads the rest when the choice ends (text that turns out not to be a call is sent as content).

use super::tool_parsers::FunctionCall;
use super::tools::{call_id, read_output, ToolMode};
use super::types::{FunctionDelta, ToolCallDelta};

/// What one event of a choice adds to the stream.
#[derive(Debug, Default, PartialEq)]
pub struct StreamPiece {
    pub content: Option<String>,
    pub calls: Vec<ToolCallDelta>,
}

pub struct ToolStream {
    mode: ToolMode,
    parallel: bool,
    /// Text not sent yet (the call part once `in_call`).
    held: String,
    in_call: bool,
    /// A named choice's call id once its first delta went out.
    named_id: Option<String>,
    made_calls: bool,
}

/// The delta of one complete call: its id, type, name and arguments in one entry (a chunk holds one entry per call
/// index, so a client reading `delta.tool_calls[i]` sees the whole call).
fn call_delta(index: usize, id: String, call: FunctionCall) -> ToolCallDelta {
    ToolCallDelta {
        index,
        id: Some(id),
        kind: Some("function"),
        function: FunctionDelta { name: Some(call.name), arguments: call.arguments },
    }
}

impl ToolStream {
    pub fn new(mode: ToolMode, parallel: bool) -> Self {
        Self { mode, parallel, held: String::new(), in_call: false, named_id: None, made_calls: false }
    }

    pub fn mode(&self) -> &ToolMode {
        &self.mode
    }

    /// Whether this choice's stream is plain content (no tool handling).
    pub fn is_off(&self) -> bool {
        self.mode == ToolMode::Off
    }

    /// Whether the choice produced tool calls (for its finish reason).
    pub fn made_calls(&self) -> bool {
        self.made_calls
    }

    /// A text delta of the choice.
    pub fn push(&mut self, text: &str) -> StreamPiece {
        match &self.mode {
            ToolMode::Off => StreamPiece { content: Some(text.to_owned()), calls: vec![] },
            ToolMode::Named(name) => {
                // The first delta names the call (with whatever arguments came with it); later ones add arguments.
                let first = self.named_id.is_none();
                if first {
                    self.named_id = Some(call_id());
                    self.made_calls = true;
                } else if text.is_empty() {
                    return StreamPiece::default();
                }
                let delta = ToolCallDelta {
                    index: 0,
                    id: first.then(|| self.named_id.clone()).flatten(),
                    kind: first.then_some("function"),
                    function: FunctionDelta { name: first.then(|| name.clone()), arguments: text.to_owned() },
                };
                StreamPiece { content: None, calls: vec![delta] }
            }
            ToolMode::Required => {
                self.held.push_str(text);
                StreamPiece::default()
            }
            ToolMode::Auto(parser) => {
                self.held.push_str(text);
                if self.in_call {
                    return StreamPiece::default();
                }
                let send = match parser.call_start(&self.held) {
                    Some(start) => {
                        self.in_call = true;
                        let rest = self.held.split_off(start);
                        std::mem::replace(&mut self.held, rest)
                    }
                    None => {
                        let keep = parser.marker_prefix_len(&self.held);
                        let rest = self.held.split_off(self.held.len() - keep);
                        std::mem::replace(&mut self.held, rest)
                    }
                };
                StreamPiece { content: (!send.is_empty()).then_some(send), calls: vec![] }
            }
        }
    }

    /// The choice ended: what was held back, read as calls where it is calls.
    pub fn finish(&mut self) -> StreamPiece {
        let held = std::mem::take(&mut self.held);
        match &self.mode {
            ToolMode::Off => StreamPiece::default(),
            ToolMode::Named(_) => {
                if self.named_id.is_none() {
                    // Nothing was generated: the call still goes out, with empty arguments.
                    return self.push("");
                }
                StreamPiece::default()
            }
            ToolMode::Required | ToolMode::Auto(_) => {
                if held.is_empty() {
                    return StreamPiece::default();
                }
                let (content, calls) = read_output(&self.mode, self.parallel, &held);
                self.made_calls |= !calls.is_empty();
                let calls: Vec<ToolCallDelta> =
                    calls.into_iter().enumerate().map(|(i, c)| call_delta(i, c.id, c.call)).collect();
                StreamPiece { content: content.filter(|c| !c.is_empty()), calls }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tool_parsers::ToolParser;
    use super::*;

    /// Concatenated content and (name, arguments) per call index, as a client reassembles them.
    fn reassemble(pieces: &[StreamPiece]) -> (String, Vec<(String, String)>) {
        let mut content = String::new();
        let mut calls: Vec<(String, String)> = Vec::new();
        for p in pieces {
            content.push_str(p.content.as_deref().unwrap_or(""));
            for d in &p.calls {
                if d.index == calls.len() {
                    calls.push((String::new(), String::new()));
                }
                if let Some(n) = &d.function.name {
                    calls[d.index].0.push_str(n);
                }
                calls[d.index].1.push_str(&d.function.arguments);
            }
        }
        (content, calls)
    }

    fn run(mode: ToolMode, parts: &[&str]) -> (String, Vec<(String, String)>) {
        let mut s = ToolStream::new(mode, true);
        let mut pieces: Vec<StreamPiece> = parts.iter().map(|p| s.push(p)).collect();
        pieces.push(s.finish());
        for p in &pieces {
            // OpenAI's form: at most one entry per call index in one delta.
            let mut seen: Vec<usize> = p.calls.iter().map(|d| d.index).collect();
            seen.dedup();
            assert_eq!(seen.len(), p.calls.len(), "{:?}", p.calls);
        }
        reassemble(&pieces)
    }

    #[test]
    fn streamed_calls_reassemble_to_the_whole_answer() {
        let text = ["Sure.", " <tool", "_call>{\"name\": \"f\", ", "\"arguments\": {\"a\": 1}}</tool_call>"];
        let whole: String = text.concat();
        let (content, calls) = run(ToolMode::Auto(ToolParser::Hermes), &text);
        let (c2, want) = read_output(&ToolMode::Auto(ToolParser::Hermes), true, &whole);
        assert_eq!(content.trim_end(), c2.unwrap());
        assert_eq!(calls, want.into_iter().map(|c| (c.call.name, c.call.arguments)).collect::<Vec<_>>());
        assert_eq!(
            run(ToolMode::Named("g".into()), &["{\"x\"", ": 2}"]),
            (String::new(), vec![("g".into(), "{\"x\": 2}".into())])
        );
        let (_, calls) = run(ToolMode::Required, &["[{\"name\": \"f\", \"para", "meters\": {}}]"]);
        assert_eq!(calls, vec![("f".into(), "{}".into())]);
        // Parallel calls: one entry each, numbered in order.
        let (_, calls) = run(
            ToolMode::Required,
            &["[{\"name\": \"f\", \"parameters\": {}}, {\"name\": \"g\", \"parameters\": {\"b\": 2}}]"],
        );
        assert_eq!(calls, vec![("f".into(), "{}".into()), ("g".into(), "{\"b\":2}".into())]);
        // A named call's first delta carries its name and the first arguments together.
        let mut s = ToolStream::new(ToolMode::Named("g".into()), true);
        let first = s.push("{\"x\"");
        assert_eq!(first.calls.len(), 1);
        assert_eq!(
            (first.calls[0].function.name.as_deref(), first.calls[0].function.arguments.as_str()),
            (Some("g"), "{\"x\"")
        );
        assert!(first.calls[0].id.is_some() && s.push(": 2}").calls[0].id.is_none());
    }

    #[test]
    fn text_that_is_not_a_call_streams_as_content() {
        let parts = ["Hello <to", "day is nice"];
        assert_eq!(run(ToolMode::Auto(ToolParser::Hermes), &parts), (parts.concat(), vec![]));
        let parts = ["{broken", " json"];
        assert_eq!(run(ToolMode::Auto(ToolParser::Llama3Json), &parts), (parts.concat(), vec![]));
    }
}
