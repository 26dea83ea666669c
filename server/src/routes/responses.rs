//! `POST /v1/responses`, `GET /v1/responses/{id}` and `POST /v1/responses/{id}/cancel` (vLLM's three routes; it has
//! no `DELETE`). A response runs through the chat pipeline (`openai::responses`); finished ones are kept for
//! retrieval unless `store: false`.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::error::ApiError;
use crate::fanout;
use crate::json::ApiJson;
use crate::openai::pooling::validate::refuse_on_pooling_model;
use crate::openai::pooling::Api;
use crate::openai::render::{self, ChatStream, ResponseMeta};
use crate::openai::responses::convert;
use crate::openai::responses::render::{answer_message, echo, from_chat, Draft};
use crate::openai::responses::store::Stored;
use crate::openai::responses::stream::{self, ResponsesStream, StoreTo};
use crate::openai::responses::types::{ResponseId, ResponsesRequest};
use crate::openai::validate;
use crate::routes::chat::with_default_kwargs;
use crate::state::AppState;

pub async fn create(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<ResponsesRequest>,
) -> Result<Response, ApiError> {
    // A pooling model serves no generation (vLLM has no handler for it).
    refuse_on_pooling_model(state.engine.info(), Api::Responses)?;
    let previous = match req.previous_response_id.as_deref() {
        None | Some("") => None,
        Some(id) => Some(
            state
                .responses
                .get(&ResponseId::from_client(id))
                .ok_or_else(|| ApiError::ResponseNotFound { id: id.to_owned(), param: "previous_response_id" })?,
        ),
    };
    let mut conv = convert::to_chat(&req, previous.as_deref())?;
    with_default_kwargs(&mut conv.chat, &state.settings.default_chat_template_kwargs);
    let model = state.resolve_model(conv.chat.model.as_deref())?;
    let valid = validate::chat(&conv.chat, state.engine.as_ref(), &state.settings.tools, state.settings.reasoning)
        .map_err(convert::rename_error)?;
    let draft = Draft::new(model.clone(), echo(&req, &conv, &valid));
    let meta = ResponseMeta { id: draft.id.as_str().to_owned(), created: draft.created_at, model };
    let merged = fanout::merge(
        state.submit_all(&meta.id, valid.prompt_tokens, valid.requests)?,
        state.engine.metrics().parent_observer(),
    );
    let engine = state.engine.clone();
    let count_tokens = move |text: &str| engine.encode(text, false).map_or(0, |ids| ids.len());
    if conv.stream {
        let chat = ChatStream::new(meta, 1, valid.prompt_tokens, true, false)
            .with_tools(&valid.tools)
            .with_reasoning(valid.reasoning.as_ref());
        let store =
            conv.store.then(|| StoreTo { store: Arc::clone(&state.responses), conversation: conv.conversation });
        let renderer = ResponsesStream::new(chat, draft, store, Box::new(count_tokens));
        return Ok(stream::response(renderer, merged));
    }
    let outputs = fanout::collect(merged, 1).await?;
    let chat = render::chat_response(meta, valid.prompt_tokens, outputs, false, &valid.tools, valid.reasoning.as_ref());
    let response = from_chat(&draft, chat, &count_tokens);
    if conv.store {
        let mut conversation = conv.conversation;
        conversation.push(answer_message(&response.output));
        state.responses.put(Stored { response: response.clone(), conversation });
    }
    Ok(Json(response).into_response())
}

pub async fn retrieve(State(state): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let stored = state
        .responses
        .get(&ResponseId::from_client(&id))
        .ok_or(ApiError::ResponseNotFound { id, param: "response_id" })?;
    Ok(Json(&stored.response).into_response())
}

/// Only background responses can be cancelled under vLLM, and this server runs none: a stored response has
/// finished (400, vLLM's message), any other id is unknown (404).
pub async fn cancel(State(state): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    match state.responses.get(&ResponseId::from_client(&id)) {
        Some(_) => Err(ApiError::BadRequest {
            message: "Cannot cancel a synchronous response.".into(),
            param: Some("response_id".into()),
        }),
        None => Err(ApiError::ResponseNotFound { id, param: "response_id" }),
    }
}
