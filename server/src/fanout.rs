//! Fan-in of the `n` engine requests of one API request: their event streams merged into one stream of
//! `(choice index, event)` (for SSE), or collected into per-choice outputs (for plain JSON responses). Dropping the
//! merged stream drops every engine stream, which aborts the requests still running.

use futures_util::stream::{self, BoxStream, StreamExt};
use rserve_engine::api::{FinishReason, RequestEvent, StopReason, TokenLogprob, Usage};
use rserve_engine::engine::metrics::ParentObserver;

use crate::error::ApiError;
use crate::state::Admitted;

/// The events of all choices, tagged with the choice index.
pub type Merged = BoxStream<'static, (usize, RequestEvent)>;

/// Merges the choices' event streams; choice `i` is `admitted[i]`. When the last choice finishes, the request's
/// `n` and its longest choice go to vLLM's per-request histograms (`parent`): the fan-out into choices is ours, so
/// the engine cannot see them.
pub fn merge(admitted: Vec<Admitted>, parent: ParentObserver) -> Merged {
    let n = admitted.len();
    let streams = admitted.into_iter().enumerate().map(|(index, a)| {
        stream::unfold(a, move |mut a| async move { a.next().await.map(|ev| ((index, ev), a)) }).boxed()
    });
    let (mut finished, mut longest) = (0, 0);
    stream::select_all(streams)
        .inspect(move |(_, ev)| {
            if let RequestEvent::Finished { usage, .. } = ev {
                finished += 1;
                longest = longest.max(usage.completion_tokens);
                if finished == n {
                    parent.observe(n, longest);
                }
            }
        })
        .boxed()
}

/// Everything one choice produced.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChoiceOutput {
    pub text: String,
    pub logprobs: Vec<TokenLogprob>,
    pub finish: Option<FinishReason>,
    pub stop_reason: Option<StopReason>,
    pub usage: Usage,
    /// The prompt's log-probs, when asked: its first token's text, then every later token's scores.
    pub prompt_logprobs: Option<(String, Vec<TokenLogprob>)>,
}

/// Runs all choices to the end. An engine error fails the whole request.
pub async fn collect(mut merged: Merged, n: usize) -> Result<Vec<ChoiceOutput>, ApiError> {
    let mut outputs = vec![ChoiceOutput::default(); n];
    while let Some((index, event)) = merged.next().await {
        let Some(out) = outputs.get_mut(index) else { continue };
        match event {
            RequestEvent::Delta { text, logprobs, .. } => {
                out.text.push_str(&text);
                out.logprobs.extend(logprobs);
            }
            RequestEvent::Finished { reason, usage, stop_reason } => {
                out.finish = Some(reason);
                out.usage = usage;
                out.stop_reason = stop_reason;
            }
            RequestEvent::Error(message) => return Err(ApiError::Internal(message)),
            RequestEvent::PromptLogprobs { first, scored } => out.prompt_logprobs = Some((first, scored)),
            // A generation request never pools.
            RequestEvent::Pooled { .. } => {}
        }
    }
    if outputs.iter().any(|o| o.finish.is_none()) {
        return Err(ApiError::Internal("the engine stopped before the request finished".into()));
    }
    Ok(outputs)
}
