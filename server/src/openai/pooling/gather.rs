//! Runs the engine requests of one pooling API request: all submitted at once (so the engine batches them), their
//! results gathered in input order. An input that fails fails the whole request with the engine's message; the
//! others are then dropped, which aborts them, as does dropping the future (client gone).

use futures_util::future::try_join_all;
use rserve_engine::api::{GenerateRequest, RequestEvent};

use crate::error::ApiError;
use crate::state::{Admitted, AppState};

/// One input's result: the engine's vector (an embedding, or the classifier's scores) and its token count.
#[derive(Debug, Clone, PartialEq)]
pub struct Pooled {
    pub data: Vec<f32>,
    pub prompt_tokens: usize,
}

/// Submits `requests` (logged under `id`) and waits for every result, in order.
pub async fn run(state: &AppState, id: &str, requests: Vec<GenerateRequest>) -> Result<Vec<Pooled>, ApiError> {
    let prompt_tokens = requests.iter().map(|r| r.prompt_token_ids.len()).sum();
    let admitted = state.submit_all(id, prompt_tokens, requests)?;
    try_join_all(admitted.into_iter().map(one)).await
}

/// The sum of the inputs' token counts (the usage of a pooling response).
pub fn prompt_tokens(pooled: &[Pooled]) -> usize {
    pooled.iter().map(|p| p.prompt_tokens).sum()
}

async fn one(mut admitted: Admitted) -> Result<Pooled, ApiError> {
    let mut data = None;
    while let Some(event) = admitted.next().await {
        match event {
            RequestEvent::Pooled { data: d } => data = Some(d),
            RequestEvent::Finished { usage, .. } => {
                return data.map(|data| Pooled { data, prompt_tokens: usage.prompt_tokens }).ok_or_else(|| {
                    ApiError::Internal("the engine finished a pooling request without its result".into())
                })
            }
            RequestEvent::Error(message) => return Err(ApiError::Internal(message)),
            // A pooling request generates nothing.
            RequestEvent::Delta { .. } | RequestEvent::PromptLogprobs { .. } => {}
        }
    }
    Err(ApiError::Internal("the engine stopped before the request finished".into()))
}
