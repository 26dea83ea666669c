//! `POST /rerank`, `/v1/rerank` (Jina's shape) and `/v2/rerank` (Cohere's): one query scored against each
//! document (as `/score` pairs them 1:N), results best first, the best `top_n`. vLLM answers the three routes
//! alike, and so does this.

use axum::extract::State;
use axum::Json;

use crate::error::ApiError;
use crate::json::ApiJson;
use crate::openai::pooling::score::{self, ScoreSettings};
use crate::openai::pooling::types::{RerankRequest, RerankResponse, RerankUsage};
use crate::openai::pooling::{gather, render, Api, PoolingError};
use crate::openai::render::ResponseMeta;
use crate::state::AppState;

pub async fn create(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<RerankRequest>,
) -> Result<Json<RerankResponse>, ApiError> {
    let model = state.resolve_model(req.model.as_deref())?;
    let top_n = match req.top_n {
        None => 0,
        Some(n) => usize::try_from(n).map_err(|_| PoolingError::TopN(n))?,
    };
    let settings = ScoreSettings {
        api: Api::Rerank,
        first_field: "query",
        second_field: "documents",
        truncate: req.truncate_prompt_tokens,
        activation: req.activation(),
    };
    let query = [req.query];
    let pairs = score::pairs("query", 1, "documents", req.documents.len())?;
    let mut plan = score::plan(state.engine.as_ref(), &query, &req.documents, pairs, &settings)?;
    let meta = ResponseMeta::new("rerank", model);
    let pooled = gather::run(&state, &meta.id, std::mem::take(&mut plan.requests)).await?;
    let prompt_tokens = gather::prompt_tokens(&pooled);
    let scores = plan.scores(&pooled)?;
    let results = render::rerank(&scores, req.documents, top_n, req.return_documents.unwrap_or(true));
    Ok(Json(RerankResponse {
        id: meta.id,
        model: meta.model,
        usage: RerankUsage { prompt_tokens, total_tokens: prompt_tokens },
        results,
    }))
}
