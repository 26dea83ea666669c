//! `POST /v1/completions`: validate (one or more prompts, `n` choices each), submit, answer as JSON or SSE.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::error::ApiError;
use crate::fanout;
use crate::json::ApiJson;
use crate::openai::pooling::validate::refuse_on_pooling_model;
use crate::openai::pooling::Api;
use crate::openai::render::{self, CompletionStream, ResponseMeta};
use crate::openai::types::CompletionRequest;
use crate::openai::validate;
use crate::sse;
use crate::state::AppState;

pub async fn create(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<CompletionRequest>,
) -> Result<Response, ApiError> {
    // A pooling model serves no generation (vLLM has no handler for it).
    refuse_on_pooling_model(state.engine.info(), Api::Completions)?;
    let model = state.resolve_model(req.model.as_deref())?;
    let valid = validate::completion(&req, state.engine.as_ref())?;
    let meta = ResponseMeta::new("cmpl", model);
    let total = valid.requests.len();
    let prompt_tokens = valid.prompts.iter().map(|p| p.token_count).sum();
    let merged = fanout::merge(
        state.submit_all(&meta.id, prompt_tokens, valid.requests)?,
        state.engine.metrics().parent_observer(),
    );
    if valid.stream {
        let renderer =
            CompletionStream::new(meta, &valid.prompts, valid.n, valid.include_usage, valid.logprobs.is_some())
                .with_prompt_only(valid.prompt_only);
        Ok(sse::response(renderer, merged))
    } else {
        let outputs = fanout::collect(merged, total).await?;
        let with_logprobs = valid.logprobs.is_some();
        let body =
            render::completion_response(meta, &valid.prompts, valid.n, outputs, with_logprobs, valid.prompt_only);
        Ok(Json(body).into_response())
    }
}
