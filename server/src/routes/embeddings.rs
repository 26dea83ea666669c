//! `POST /v1/embeddings`, OpenAI's shape with vLLM's extras: each input (text, token ids, or a conversation)
//! embedded in one engine batch; vectors as floats or base64, cut to `dimensions` by the engine.

use axum::extract::State;
use axum::Json;
use rserve_engine::api::{PoolingParams, PoolingTask};

use crate::error::ApiError;
use crate::json::ApiJson;
use crate::openai::pooling::types::{EmbeddingData, EncodeRequest, ListResponse, PoolingUsage};
use crate::openai::pooling::validate::{self, Limits};
use crate::openai::pooling::{gather, render, Api};
use crate::openai::render::ResponseMeta;
use crate::state::AppState;

pub async fn create(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<EncodeRequest>,
) -> Result<Json<ListResponse<EmbeddingData>>, ApiError> {
    let model = state.resolve_model(req.model.as_deref())?;
    let engine = state.engine.as_ref();
    let info = engine.info();
    let pooling = validate::pooling_info(info, PoolingTask::Embed, Api::Embeddings)?;
    let format = validate::encoding_format(req.encoding_format.as_deref())?;
    validate::served_options(&req)?;
    let mut params = PoolingParams::new(PoolingTask::Embed);
    params.dimensions = validate::dimensions(req.dimensions, pooling, &model)?;
    params.normalize = req.normalize.or(req.use_activation);
    let limits = Limits::new(info, req.truncate_prompt_tokens, "embedding generation")?;
    let requests = validate::requests(&req, engine, &limits, &params)?;
    let meta = ResponseMeta::new("embd", model);
    let pooled = gather::run(&state, &meta.id, requests).await?;
    let usage = PoolingUsage::new(gather::prompt_tokens(&pooled));
    let data = pooled
        .into_iter()
        .enumerate()
        .map(|(index, p)| EmbeddingData { index, object: "embedding", embedding: render::vector(p.data, format) })
        .collect();
    Ok(Json(ListResponse { id: meta.id, object: "list", created: meta.created, model: meta.model, data, usage }))
}
