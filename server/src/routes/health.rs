//! `GET /health` (200, empty body, while the server runs) and `GET /version`.

use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};

pub async fn health() -> StatusCode {
    StatusCode::OK
}

pub async fn version() -> Json<Value> {
    Json(json!({ "version": env!("CARGO_PKG_VERSION") }))
}
