//! `GET /v1/models`: the served model names.

use axum::extract::State;
use axum::Json;

use crate::openai::types::{ModelCard, ModelList};
use crate::state::AppState;

pub async fn list(State(state): State<AppState>) -> Json<ModelList> {
    let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let info = state.engine.info();
    let data = state
        .settings
        .served_model_names
        .iter()
        .map(|name| ModelCard {
            id: name.clone(),
            object: "model",
            created,
            // What vLLM writes; clients that check the server kind look for it.
            owned_by: "vllm",
            root: info.model_path.clone(),
            parent: None,
            max_model_len: info.max_model_len,
        })
        .collect();
    Json(ModelList { object: "list", data })
}
