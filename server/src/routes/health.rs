//! `GET /health` and `GET|POST /ping` (200, empty body, while the engine thread runs; 503 once it has stopped, as
//! vLLM answers when its engine is dead), `GET /version` and `GET /load` (vLLM's server load: `{"server_load": N}`,
//! the generation requests in progress with `--enable-server-load-tracking`, else 0).

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};

use crate::state::AppState;

pub async fn health(State(state): State<AppState>) -> StatusCode {
    if state.engine.is_alive() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

pub async fn version() -> Json<Value> {
    Json(json!({ "version": env!("CARGO_PKG_VERSION") }))
}

pub async fn load(State(state): State<AppState>) -> Json<Value> {
    Json(json!({ "server_load": state.server_load() }))
}
