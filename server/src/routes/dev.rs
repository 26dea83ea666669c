//! vLLM's development routes, served only with `VLLM_SERVER_DEV_MODE=1` (as vLLM does): `GET /server_info` (the
//! configuration, the `VLLM_*` environment and a few facts of the system) and `POST /reset_prefix_cache` (drop the
//! cached prefix blocks; `{"success": bool}`).

use axum::extract::{Query, State};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::state::AppState;

#[derive(Debug, Default, Deserialize)]
pub struct ServerInfoQuery {
    config_format: Option<String>,
}

/// `GET /server_info?config_format=text|json`: vLLM's shape, `{"vllm_config", "vllm_env", "system_env"}`; the
/// configuration is one `name=value, …` string (text, the default) or an object (json).
pub async fn server_info(
    State(state): State<AppState>,
    Query(query): Query<ServerInfoQuery>,
) -> Result<Json<Value>, ApiError> {
    let config = state.settings.dev_mode.as_ref().map(|i| i.config.as_slice()).unwrap_or_default();
    let vllm_config = match query.config_format.as_deref() {
        None | Some("text") => Value::String(config_text(config)),
        Some("json") => Value::Object(config.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect()),
        Some(other) => {
            return Err(ApiError::InvalidQuery {
                param: "config_format",
                message: format!("{other:?} is not one of 'text', 'json'"),
            })
        }
    };
    Ok(Json(json!({ "vllm_config": vllm_config, "vllm_env": vllm_env(), "system_env": system_env() })))
}

/// `name=value` pairs joined as vLLM's `str(VllmConfig)` writes them (strings quoted, null as None).
fn config_text(config: &[(&str, Value)]) -> String {
    let value = |v: &Value| match v {
        Value::String(s) => format!("{s:?}").replace('"', "'"),
        Value::Null => "None".to_owned(),
        Value::Bool(b) => if *b { "True" } else { "False" }.to_owned(),
        other => other.to_string(),
    };
    config.iter().map(|(k, v)| format!("{k}={}", value(v))).collect::<Vec<_>>().join(", ")
}

/// The `VLLM_*` environment variables, leaving out any whose name holds "KEY" (as vLLM does).
fn vllm_env() -> Map<String, Value> {
    std::env::vars().filter(|(k, _)| k.starts_with("VLLM_") && !k.contains("KEY")).map(|(k, v)| (k, v.into())).collect()
}

/// What we know of the system, under the names of vLLM's `collect_env` where they exist.
fn system_env() -> Value {
    json!({
        "os": std::env::consts::OS,
        "architecture": std::env::consts::ARCH,
        "cpu_count": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "rserve_version": env!("CARGO_PKG_VERSION"),
    })
}

#[derive(Debug, Default, Deserialize)]
pub struct ResetQuery {
    reset_running_requests: Option<String>,
    reset_external: Option<String>,
}

/// FastAPI's reading of a boolean query parameter.
fn query_bool(param: &'static str, value: Option<&str>) -> Result<bool, ApiError> {
    match value.map(str::to_ascii_lowercase).as_deref() {
        None => Ok(false),
        Some("1" | "true" | "on" | "yes" | "y" | "t") => Ok(true),
        Some("0" | "false" | "off" | "no" | "n" | "f") => Ok(false),
        Some(other) => Err(ApiError::InvalidQuery { param, message: format!("{other:?} is not a valid boolean") }),
    }
}

/// `POST /reset_prefix_cache[?reset_running_requests=true][&reset_external=true]`: `{"success": bool}`; false while
/// requests hold blocks (the free cached blocks are dropped all the same; retry when idle, or preempt the running
/// requests with `reset_running_requests=true`). `reset_external` resets an external KV connector's cache: there is
/// none, which vLLM counts as success.
pub async fn reset_prefix_cache(
    State(state): State<AppState>,
    Query(query): Query<ResetQuery>,
) -> Result<Json<Value>, ApiError> {
    let preempt_running = query_bool("reset_running_requests", query.reset_running_requests.as_deref())?;
    query_bool("reset_external", query.reset_external.as_deref())?;
    tracing::info!("Resetting prefix cache...");
    let success = state.engine.reset_prefix_cache(preempt_running).await.map_err(|_| ApiError::EngineStopped)?;
    Ok(Json(json!({ "success": success })))
}
