//! The output thread: it turns each step's sampled ids into the requests' events (incremental detokenization, stop
//! strings, the text of log-prob tokens) while the engine thread goes on with the next step, as vLLM's output
//! processor does apart from its engine core.
//!
//! Every event of a request accepted by the engine goes through this thread, in the order the engine sent it, so
//! a request's deltas always come before its end. A stop string is found here: the thread ends the request (its
//! `Finished` event) and tells the engine, which then aborts it in the scheduler before its next step; ids the
//! request computed meanwhile are dropped here. A client that went away is reported back the same way.

use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;

use rserve_scheduler::{IdMap, RequestId};
use tokio::sync::mpsc::UnboundedSender;

use super::output::TextOutput;
use crate::api::{FinishReason, RequestEvent, StopReason, TokenLogprob, Usage};
use crate::model::TokenId;
use crate::sampling::RowLogprobs;
use crate::tokenizer::Tokenizer;

/// What the engine thread sends, in its order.
pub(crate) enum ToOutput {
    /// A request the engine accepted: its text state, its event channel and its prompt's length.
    Add { id: RequestId, text: Box<TextOutput>, events: UnboundedSender<RequestEvent>, prompt_tokens: usize },
    /// One sampled token (its log-probs, when asked). `show`: its text is part of the output (false for a stop
    /// token the request does not include). `cached_tokens`: the request's prompt tokens from the prefix cache.
    Token { id: RequestId, token: TokenId, show: bool, logprobs: Option<RowLogprobs>, cached_tokens: usize },
    /// The request's prompt log-probs: its first token, then each later prompt token with its scores.
    Prompt { id: RequestId, first: TokenId, scored: Vec<(TokenId, RowLogprobs)> },
    /// A pooling request's result, just before its `Finish`.
    Pooled { id: RequestId, data: Vec<f32> },
    /// The request ended in the engine: its last held-back text (when `flush`), then `Finished`.
    Finish { id: RequestId, reason: FinishReason, stop_reason: Option<StopReason>, usage: Usage, flush: bool },
    /// The request failed: an `Error` event ends it.
    Fail { id: RequestId, message: String },
    /// The client is gone (or the engine dropped the request): forget it without an event.
    Forget { id: RequestId },
}

/// What this thread tells the engine: requests it ended, which the engine must abort.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Ended {
    /// A stop string matched: the request finished with `stop`.
    Stop(RequestId),
    /// The client's channel is closed.
    Gone(RequestId),
    /// Its text could not be made (a tokenizer error), and it got an `Error` event.
    Failed(RequestId),
}

/// One request's state on this thread.
struct Request {
    text: Box<TextOutput>,
    events: UnboundedSender<RequestEvent>,
    /// The usage a stop string reports: the prompt, its cached part, the tokens received so far.
    usage: Usage,
}

/// The thread's loop: runs until the engine drops its sender.
pub(crate) fn run(tokenizer: Arc<Tokenizer>, rx: Receiver<Vec<ToOutput>>, ended: Sender<Ended>) {
    let mut live: IdMap<RequestId, Request> = IdMap::default();
    while let Ok(batch) = rx.recv() {
        for msg in batch {
            handle(&tokenizer, &mut live, msg, &ended);
        }
    }
}

fn handle(tokenizer: &Tokenizer, live: &mut IdMap<RequestId, Request>, msg: ToOutput, ended: &Sender<Ended>) {
    match msg {
        ToOutput::Add { id, text, events, prompt_tokens } => {
            let usage = Usage { prompt_tokens, completion_tokens: 0, cached_tokens: 0 };
            live.insert(id, Request { text, events, usage });
        }
        ToOutput::Token { id, token, show, logprobs, cached_tokens } => {
            let Some(r) = live.get_mut(&id) else { return };
            r.usage.completion_tokens += 1;
            r.usage.cached_tokens = cached_tokens;
            let (text, stop) = match show.then(|| r.text.push(token)) {
                None => (String::new(), None),
                Some(Ok(pushed)) => pushed,
                Some(Err(e)) => {
                    let _ = r.events.send(RequestEvent::Error(e.to_string()));
                    live.remove(&id);
                    let _ = ended.send(Ended::Failed(id));
                    return;
                }
            };
            let logprobs = logprobs.map(|lp| named(tokenizer, token, lp)).into_iter().collect();
            let delta = RequestEvent::Delta { text, token_ids: vec![token], logprobs };
            if r.events.send(delta).is_err() {
                live.remove(&id);
                let _ = ended.send(Ended::Gone(id));
                return;
            }
            if let Some(s) = stop {
                let _ = r.events.send(RequestEvent::Finished {
                    reason: FinishReason::Stop,
                    usage: r.usage,
                    stop_reason: Some(StopReason::Text(s)),
                });
                live.remove(&id);
                let _ = ended.send(Ended::Stop(id));
            }
        }
        ToOutput::Finish { id, reason, stop_reason, usage, flush } => {
            let Some(mut r) = live.remove(&id) else { return };
            if flush {
                if let Ok((rest, _)) = r.text.finish() {
                    if !rest.is_empty() {
                        let _ = r.events.send(RequestEvent::Delta { text: rest, token_ids: vec![], logprobs: vec![] });
                    }
                }
            }
            let _ = r.events.send(RequestEvent::Finished { reason, usage, stop_reason });
        }
        ToOutput::Fail { id, message } => {
            if let Some(r) = live.remove(&id) {
                let _ = r.events.send(RequestEvent::Error(message));
            }
        }
        ToOutput::Forget { id } => {
            live.remove(&id);
        }
        ToOutput::Pooled { id, data } => {
            if let Some(r) = live.get(&id) {
                let _ = r.events.send(RequestEvent::Pooled { data });
            }
        }
        ToOutput::Prompt { id, first, scored } => {
            if let Some(r) = live.get(&id) {
                let first = tokenizer.token_to_string(first).unwrap_or_default();
                let scored = scored.into_iter().map(|(t, lp)| named(tokenizer, t, lp)).collect();
                let _ = r.events.send(RequestEvent::PromptLogprobs { first, scored });
            }
        }
    }
}

/// The log-probs of one token with the text of each token named.
fn named(tokenizer: &Tokenizer, token: TokenId, lp: RowLogprobs) -> TokenLogprob {
    let name = |id: TokenId| tokenizer.token_to_string(id).unwrap_or_default();
    TokenLogprob {
        token_id: token,
        token: name(token),
        logprob: lp.chosen,
        top: lp.top.into_iter().map(|(id, l)| (TokenId(id), name(TokenId(id)), l)).collect(),
    }
}
