//! `GET /metrics`: the engine's Prometheus registries in the text exposition format (0.0.4, the format vLLM's
//! Prometheus client answers with by default): vLLM's `vllm:*` metrics and rserve's `rserve:*` KV block gauges, one
//! series per data-parallel replica (`engine="0"`, `"1"`, ...).

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use prometheus::proto::MetricFamily;
use prometheus::TextEncoder;
use rserve_engine::engine::EngineMetrics;

use crate::state::AppState;

/// The content type Python's Prometheus client (and so vLLM) answers with for the text format 0.0.4.
pub const CONTENT_TYPE_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

pub async fn handler(State(state): State<AppState>) -> Response {
    match render_replicas(&state.engine.replica_metrics()) {
        Ok(text) => ([(CONTENT_TYPE, CONTENT_TYPE_TEXT)], text).into_response(),
        // Only a metric family without samples fails to encode, which the engine never registers.
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("metrics: {e}")).into_response(),
    }
}

/// The whole exposition text of one engine.
#[cfg(test)]
pub fn render(m: &EngineMetrics) -> prometheus::Result<String> {
    render_replicas(&[m])
}

/// The exposition text of every data-parallel replica: each metric family once, with every replica's samples
/// (told apart by their `engine` label), in the first replica's family order.
pub fn render_replicas(replicas: &[&EngineMetrics]) -> prometheus::Result<String> {
    let mut families: Vec<MetricFamily> = Vec::new();
    for m in replicas {
        for mut family in m.gather() {
            match families.iter_mut().find(|f| f.name() == family.name()) {
                Some(f) => f.mut_metric().extend(std::mem::take(family.mut_metric())),
                None => families.push(family),
            }
        }
    }
    let mut out = String::with_capacity(32 * 1024 * replicas.len());
    TextEncoder::new().encode_utf8(&families, &mut out)?;
    Ok(out)
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
