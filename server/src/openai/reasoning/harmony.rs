//! gpt-oss's harmony output, split as it arrives: messages of the form `<|channel|>NAME[ to=RECIPIENT]
//! [<|constrain|>TYPE]<|message|>BODY<|end|>` (or `<|call|>`, `<|return|>`), each after the first opened again by
//! `<|start|>assistant`. The `analysis` channel is reasoning, `final` is content, and a `commentary` message with a
//! recipient (`to=functions.NAME`) is a tool call whose body is its JSON arguments; a commentary message without one
//! (a preamble) is content. Markers cut across deltas are held back until complete.

use super::think::partial_suffix;
use crate::openai::tool_parsers::FunctionCall;

const MESSAGE: &str = "<|message|>";
const CHANNEL: &str = "<|channel|>";
/// The markers that close a message body.
const BODY_ENDS: [&str; 3] = ["<|end|>", "<|call|>", "<|return|>"];

/// Where a message body goes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Route {
    Reasoning,
    Content,
    /// A tool call to this function; the body is its arguments.
    Call(String),
}

/// What a push or finish adds.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct HarmonyPiece {
    pub reasoning: String,
    pub content: String,
    /// Calls completed by this piece.
    pub calls: Vec<FunctionCall>,
}

/// One choice's harmony reader.
#[derive(Debug, Clone, Default)]
pub struct HarmonySplitter {
    /// The open message's route, `None` while reading a header.
    route: Option<Route>,
    held: String,
    /// A call's arguments so far.
    args: String,
}

/// The route a header (`<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json`) gives its body.
fn route_of(header: &str) -> Route {
    let words = header.replace("<|", " <|").replace("|>", "|> ");
    let mut channel = "";
    let mut recipient = None;
    let mut after_channel = false;
    for w in words.split_whitespace() {
        if w == CHANNEL {
            after_channel = true;
        } else if let Some(r) = w.strip_prefix("to=") {
            recipient = Some(r);
        } else if after_channel && !w.starts_with("<|") {
            channel = w;
            after_channel = false;
        }
    }
    match (channel, recipient) {
        ("analysis", None) => Route::Reasoning,
        (_, Some(r)) => Route::Call(r.strip_prefix("functions.").unwrap_or(r).to_owned()),
        _ => Route::Content,
    }
}

impl HarmonySplitter {
    /// Reads the next delta.
    pub fn push(&mut self, text: &str) -> HarmonyPiece {
        self.held.push_str(text);
        let mut out = HarmonyPiece::default();
        loop {
            match self.route.clone() {
                None => {
                    let Some(i) = self.held.find(MESSAGE) else { return out };
                    let route = route_of(&self.held[..i]);
                    self.held.drain(..i + MESSAGE.len());
                    self.route = Some(route);
                }
                Some(route) => {
                    let end = BODY_ENDS.iter().filter_map(|m| self.held.find(m).map(|i| (i, m.len()))).min();
                    match end {
                        Some((i, len)) => {
                            let body: String = self.held.drain(..i + len).take(i).collect();
                            self.emit(&route, &body, &mut out);
                            self.close(&route, &mut out);
                        }
                        None => {
                            let keep = BODY_ENDS.iter().map(|m| partial_suffix(&self.held, m)).max().unwrap_or(0);
                            let cut = self.held.len() - keep;
                            let body: String = self.held.drain(..cut).collect();
                            self.emit(&route, &body, &mut out);
                            return out;
                        }
                    }
                }
            }
        }
    }

    /// The end of the output: an open body keeps what it has (a call cut short becomes content, its arguments being
    /// incomplete); text that never reached a `<|message|>` is content unless it is a cut header.
    pub fn finish(&mut self) -> HarmonyPiece {
        let mut out = HarmonyPiece::default();
        let rest = std::mem::take(&mut self.held);
        match self.route.take() {
            Some(Route::Call(_)) => {
                out.content = std::mem::take(&mut self.args) + &rest;
            }
            Some(route) => self.emit(&route, &rest, &mut out),
            None if !rest.contains("<|") => out.content = rest,
            None => {}
        }
        out
    }

    fn emit(&mut self, route: &Route, body: &str, out: &mut HarmonyPiece) {
        match route {
            Route::Reasoning => out.reasoning.push_str(body),
            Route::Content => out.content.push_str(body),
            Route::Call(_) => self.args.push_str(body),
        }
    }

    fn close(&mut self, route: &Route, out: &mut HarmonyPiece) {
        if let Route::Call(name) = route {
            let arguments = std::mem::take(&mut self.args).trim().to_owned();
            out.calls.push(FunctionCall { name: name.clone(), arguments });
        }
        self.route = None;
    }
}
