//! The axum router: routes, the API-key layer on `/v1`, the access log, and OpenAI-shaped answers for unknown routes
//! and wrong methods.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Request};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;

use crate::auth;
use crate::error::ApiError;
use crate::routes::{chat, completions, health, metrics, models, tokenize};
use crate::state::AppState;

/// How HTTP requests are logged (uvicorn-style access lines).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AccessLog(pub bool);

/// Every route and its methods, as `serve` lists them at start-up (vLLM's "Available routes are:" block);
/// `app_tests` checks that the router serves each of them.
pub const ROUTES: &[(&str, &str)] = &[
    ("/v1/chat/completions", "POST"),
    ("/v1/completions", "POST"),
    ("/v1/models", "GET"),
    ("/health", "GET"),
    ("/ping", "GET, POST"),
    ("/version", "GET"),
    ("/metrics", "GET"),
    ("/tokenize", "POST"),
    ("/detokenize", "POST"),
];

/// The whole HTTP API.
pub fn router(state: AppState, access_log: AccessLog) -> Router {
    let v1 = Router::new()
        .route("/chat/completions", post(chat::create))
        .route("/completions", post(completions::create))
        .route("/models", get(models::list))
        .layer(middleware::from_fn_with_state(state.clone(), auth::require_api_key));
    let mut app = Router::new()
        .nest("/v1", v1)
        .route("/health", get(health::health))
        .route("/ping", get(health::health).post(health::health))
        .route("/version", get(health::version))
        .route("/metrics", get(metrics::handler))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed);
    if access_log.0 {
        app = app.layer(middleware::from_fn(log_access));
    }
    app.with_state(state)
}

async fn not_found(req: Request) -> ApiError {
    ApiError::RouteNotFound(format!("{} {}", req.method(), req.uri().path()))
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

/// Logs `ADDR - "METHOD PATH VERSION" STATUS` once the response head is ready.
async fn log_access(req: Request, next: Next) -> Response {
    let peer = req.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.to_string()).unwrap_or_else(|| "-".into());
    let line = format!("{} {} {:?}", req.method(), req.uri().path(), req.version());
    let response = next.run(req).await;
    let status = response.status();
    tracing::info!(target: "rserve::access", "{peer} - \"{line}\" {} {}", status.as_u16(), status.canonical_reason().unwrap_or(""));
    response
}
