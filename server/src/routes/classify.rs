//! `POST /classify`, vLLM's classification API: each input's label scores (probabilities, or raw logits with
//! `use_activation: false`) and the best label's name.

use axum::extract::State;
use axum::Json;
use rserve_engine::api::{PoolingParams, PoolingTask};

use crate::error::ApiError;
use crate::json::ApiJson;
use crate::openai::pooling::types::{ClassifyData, EncodeRequest, ListResponse, PoolingUsage};
use crate::openai::pooling::validate::{self, Limits};
use crate::openai::pooling::{gather, render, Api};
use crate::openai::render::ResponseMeta;
use crate::state::AppState;

pub async fn create(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<EncodeRequest>,
) -> Result<Json<ListResponse<ClassifyData>>, ApiError> {
    let model = state.resolve_model(req.model.as_deref())?;
    let engine = state.engine.as_ref();
    let info = engine.info();
    let pooling = validate::pooling_info(info, PoolingTask::Classify, Api::Classification)?;
    validate::served_options(&req)?;
    let labels = pooling.labels.clone();
    let mut params = PoolingParams::new(PoolingTask::Classify);
    params.activation = req.activation().unwrap_or(true);
    let limits = Limits::new(info, req.truncate_prompt_tokens, "classification")?;
    let requests = validate::requests(&req, engine, &limits, &params)?;
    let meta = ResponseMeta::new("classify", model);
    let pooled = gather::run(&state, &meta.id, requests).await?;
    let usage = PoolingUsage::new(gather::prompt_tokens(&pooled));
    let data = pooled
        .into_iter()
        .enumerate()
        .map(|(index, p)| ClassifyData {
            index,
            label: render::label(&p.data, &labels),
            num_classes: p.data.len(),
            probs: p.data,
        })
        .collect();
    Ok(Json(ListResponse { id: meta.id, object: "list", created: meta.created, model: meta.model, data, usage }))
}
