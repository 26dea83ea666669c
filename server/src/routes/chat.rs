//! `POST /v1/chat/completions`: validate, submit one engine request per choice, answer as JSON or as an SSE stream.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::fanout;
use crate::json::ApiJson;
use crate::openai::pooling::validate::refuse_on_pooling_model;
use crate::openai::pooling::Api;
use crate::openai::render::{self, ChatStream, ResponseMeta};
use crate::openai::types::ChatCompletionRequest;
use crate::openai::validate;
use crate::sse;
use crate::state::AppState;

/// `--default-chat-template-kwargs` under the request's own `chat_template_kwargs`: the request's keys win, as vLLM
/// merges them. A value that is not an object is left for validation to refuse.
pub fn with_default_kwargs(req: &mut ChatCompletionRequest, defaults: &Map<String, Value>) {
    if defaults.is_empty() {
        return;
    }
    match &mut req.chat_template_kwargs {
        Some(Value::Object(kw)) => {
            for (k, v) in defaults {
                kw.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        slot @ (None | Some(Value::Null)) => *slot = Some(Value::Object(defaults.clone())),
        Some(_) => {}
    }
}

pub async fn create(
    State(state): State<AppState>,
    ApiJson(mut req): ApiJson<ChatCompletionRequest>,
) -> Result<Response, ApiError> {
    // A pooling model serves no generation (vLLM has no handler for it).
    refuse_on_pooling_model(state.engine.info(), Api::ChatCompletions)?;
    with_default_kwargs(&mut req, &state.settings.default_chat_template_kwargs);
    let model = state.resolve_model(req.model.as_deref())?;
    let valid = validate::chat(&req, state.engine.as_ref(), &state.settings.tools, state.settings.reasoning)?;
    let meta = ResponseMeta::new("chatcmpl", model);
    let n = valid.requests.len();
    let merged = fanout::merge(
        state.submit_all(&meta.id, valid.prompt_tokens, valid.requests)?,
        state.engine.metrics().parent_observer(),
    );
    if valid.stream {
        let renderer = ChatStream::new(meta, n, valid.prompt_tokens, valid.include_usage, valid.logprobs.is_some())
            .with_tools(&valid.tools)
            .with_echo(valid.echo)
            .with_reasoning(valid.reasoning.as_ref());
        Ok(sse::response(renderer, merged))
    } else {
        let outputs = fanout::collect(merged, n).await?;
        let mut response = render::chat_response(
            meta,
            valid.prompt_tokens,
            outputs,
            valid.logprobs.is_some(),
            &valid.tools,
            valid.reasoning.as_ref(),
        );
        // Chat `echo`: the last message's content in front of each choice's (vLLM's shape).
        if let Some(echo) = valid.echo.filter(|e| !e.is_empty()) {
            for c in &mut response.choices {
                c.message.content = Some(format!("{echo}{}", c.message.content.as_deref().unwrap_or("")));
            }
        }
        Ok(Json(response).into_response())
    }
}
