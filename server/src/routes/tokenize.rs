//! `POST /tokenize` and `POST /detokenize`, in vLLM's shapes: text or chat messages to token ids (with the count and
//! the context length), and token ids back to text.

use axum::extract::State;
use axum::Json;

use crate::error::ApiError;
use crate::json::ApiJson;
use crate::openai::types::{DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse};
use crate::openai::validate::{self, ValidationError};
use crate::state::AppState;

pub async fn tokenize(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<TokenizeRequest>,
) -> Result<Json<TokenizeResponse>, ApiError> {
    state.resolve_model(req.model.as_deref())?;
    let engine = state.engine.as_ref();
    let tokens = match (&req.prompt, &req.messages) {
        (Some(prompt), _) => engine
            .encode(prompt, req.add_special_tokens.unwrap_or(true))
            .map_err(|e| ValidationError::Tokenization(e.to_string()))?,
        (None, Some(messages)) => {
            let turns = validate::chat_turns(messages)?;
            validate::chat_prompt(engine, &turns, req.add_generation_prompt.unwrap_or(true))?
        }
        (None, None) => return Err(ValidationError::TokenizeInputMissing.into()),
    };
    let token_strs = if req.return_token_strs {
        let strs = tokens
            .iter()
            .map(|&t| engine.decode(&[t], false))
            .collect::<Result<Vec<String>, _>>()
            .map_err(|e| ValidationError::Tokenization(e.to_string()))?;
        Some(strs)
    } else {
        None
    };
    // The JSON carries bare numbers.
    let tokens = tokens.into_iter().map(|t| t.0).collect::<Vec<u32>>();
    Ok(Json(TokenizeResponse { count: tokens.len(), max_model_len: engine.info().max_model_len, tokens, token_strs }))
}

pub async fn detokenize(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<DetokenizeRequest>,
) -> Result<Json<DetokenizeResponse>, ApiError> {
    state.resolve_model(req.model.as_deref())?;
    let engine = state.engine.as_ref();
    let ids = validate::token_ids("tokens", &req.tokens, engine.info())?;
    let prompt = engine.decode(&ids, false).map_err(|e| ValidationError::Tokenization(e.to_string()))?;
    Ok(Json(DetokenizeResponse { prompt }))
}
