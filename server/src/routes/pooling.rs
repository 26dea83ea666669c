//! `POST /pooling`, vLLM's raw pooling API: each input's pooler output (`task`: `embed`, the embedding; `classify`,
//! the classifier's scores; default: the model's first task) as `{index, object: "pooling", data}`.

use axum::extract::State;
use axum::Json;
use rserve_engine::api::{PoolingParams, PoolingTask};

use crate::error::ApiError;
use crate::json::ApiJson;
use crate::openai::pooling::types::{EncodeRequest, ListResponse, PoolingData, PoolingUsage};
use crate::openai::pooling::validate::{self, Limits};
use crate::openai::pooling::{gather, render, Api, PoolingError};
use crate::openai::render::ResponseMeta;
use crate::state::AppState;

pub async fn create(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<EncodeRequest>,
) -> Result<Json<ListResponse<PoolingData>>, ApiError> {
    let model = state.resolve_model(req.model.as_deref())?;
    let engine = state.engine.as_ref();
    let info = engine.info();
    let task = match req.task.as_deref() {
        None => info.pooling.as_ref().and_then(|p| p.tasks.first().copied()).unwrap_or(PoolingTask::Embed),
        Some("embed" | "embedding") => PoolingTask::Embed,
        Some("classify") => PoolingTask::Classify,
        Some(other) => return Err(PoolingError::Task(other.to_owned()).into()),
    };
    let pooling = validate::pooling_info(info, task, Api::Pooling)?;
    let format = validate::encoding_format(req.encoding_format.as_deref())?;
    validate::served_options(&req)?;
    let mut params = PoolingParams::new(task);
    match task {
        PoolingTask::Embed => {
            params.dimensions = validate::dimensions(req.dimensions, pooling, &model)?;
            params.normalize = req.normalize.or(req.use_activation);
        }
        PoolingTask::Classify => {
            if req.dimensions.is_some() {
                return Err(PoolingError::DimensionsWithoutEmbed.into());
            }
            params.activation = req.activation().unwrap_or(true);
        }
    }
    let limits = Limits::new(info, req.truncate_prompt_tokens, "pooling")?;
    let requests = validate::requests(&req, engine, &limits, &params)?;
    let meta = ResponseMeta::new("pool", model);
    let pooled = gather::run(&state, &meta.id, requests).await?;
    let usage = PoolingUsage::new(gather::prompt_tokens(&pooled));
    let data = pooled
        .into_iter()
        .enumerate()
        .map(|(index, p)| PoolingData { index, object: "pooling", data: render::vector(p.data, format) })
        .collect();
    Ok(Json(ListResponse { id: meta.id, object: "list", created: meta.created, model: meta.model, data, usage }))
}
