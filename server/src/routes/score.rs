//! `POST /score` and `/v1/score`, vLLM's score API: two sides (`text_1` / `text_2`, or `queries` with `documents`
//! or `items`, or `data_1` / `data_2`) paired 1:1, 1:N or N:N, one score per pair (see `openai::pooling::score`).

use axum::extract::State;
use axum::Json;

use crate::error::ApiError;
use crate::json::ApiJson;
use crate::openai::pooling::score::{self, ScoreSettings};
use crate::openai::pooling::types::{ListResponse, PoolingUsage, ScoreData, ScoreRequest};
use crate::openai::pooling::{gather, Api, PoolingError};
use crate::openai::render::ResponseMeta;
use crate::state::AppState;

pub async fn create(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<ScoreRequest>,
) -> Result<Json<ListResponse<ScoreData>>, ApiError> {
    let model = state.resolve_model(req.model.as_deref())?;
    let (truncate, activation) = (req.truncate_prompt_tokens, req.activation());
    let (first_field, first, second_field, second) = req.sides().ok_or(PoolingError::ScoreInputsMissing)?;
    let settings = ScoreSettings { api: Api::Score, first_field, second_field, truncate, activation };
    let (first, second) = (first.into_vec(), second.into_vec());
    let pairs = score::pairs(first_field, first.len(), second_field, second.len())?;
    let mut plan = score::plan(state.engine.as_ref(), &first, &second, pairs, &settings)?;
    let meta = ResponseMeta::new("score", model);
    let pooled = gather::run(&state, &meta.id, std::mem::take(&mut plan.requests)).await?;
    let usage = PoolingUsage::new(gather::prompt_tokens(&pooled));
    let data = plan
        .scores(&pooled)?
        .into_iter()
        .enumerate()
        .map(|(index, score)| ScoreData { index, object: "score", score })
        .collect();
    Ok(Json(ListResponse { id: meta.id, object: "list", created: meta.created, model: meta.model, data, usage }))
}
