//! The axum router: routes, the API-key layer on `/v1`, `/load` counting on the generation and pooling routes, the access log,
//! and OpenAI-shaped answers for unknown routes and wrong methods; and the front every request meets before routing
//! (`front`): CORS, then `--root-path` taken off the path.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, Uri};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use tower::Layer;
use tower_http::cors::CorsLayer;

use crate::auth;
use crate::error::ApiError;
use crate::routes::{
    chat, classify, completions, dev, embeddings, health, metrics, models, pooling, rerank, responses, score, tokenize,
};
use crate::state::{AppState, LoadSlot};

/// How HTTP requests are logged (uvicorn-style access lines).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AccessLog(pub bool);

/// Every route and its methods, as `serve` lists them at start-up (vLLM's "Available routes are:" block);
/// `app_tests` checks that the router serves each of them.
pub const ROUTES: &[(&str, &str)] = &[
    ("/v1/chat/completions", "POST"),
    ("/v1/completions", "POST"),
    ("/v1/responses", "POST"),
    ("/v1/responses/{response_id}", "GET"),
    ("/v1/responses/{response_id}/cancel", "POST"),
    ("/v1/models", "GET"),
    ("/v1/embeddings", "POST"),
    ("/v1/score", "POST"),
    ("/v1/rerank", "POST"),
    ("/pooling", "POST"),
    ("/classify", "POST"),
    ("/score", "POST"),
    ("/rerank", "POST"),
    ("/v2/rerank", "POST"),
    ("/health", "GET"),
    ("/ping", "GET, POST"),
    ("/version", "GET"),
    ("/metrics", "GET"),
    ("/tokenize", "POST"),
    ("/detokenize", "POST"),
    ("/load", "GET"),
];

/// vLLM's development routes, served (and listed) only with `VLLM_SERVER_DEV_MODE=1`.
pub const DEV_ROUTES: &[(&str, &str)] = &[("/server_info", "GET"), ("/reset_prefix_cache", "POST")];

/// The whole HTTP API.
pub fn router(state: AppState, access_log: AccessLog) -> Router {
    let load = middleware::from_fn_with_state(state.clone(), track_load);
    let v1 = Router::new()
        .route("/chat/completions", post(chat::create).layer(load.clone()))
        .route("/completions", post(completions::create).layer(load.clone()))
        .route("/responses", post(responses::create).layer(load.clone()))
        .route("/embeddings", post(embeddings::create).layer(load.clone()))
        .route("/score", post(score::create).layer(load.clone()))
        .route("/rerank", post(rerank::create).layer(load.clone()))
        .route("/responses/{response_id}", get(responses::retrieve))
        .route("/responses/{response_id}/cancel", post(responses::cancel))
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
        .route("/load", get(health::load))
        // vLLM's pooling routes outside `/v1` (no API key there, as vLLM checks keys on `/v1` only).
        .route("/pooling", post(pooling::create).layer(load.clone()))
        .route("/classify", post(classify::create).layer(load.clone()))
        .route("/score", post(score::create).layer(load.clone()))
        .route("/rerank", post(rerank::create).layer(load.clone()))
        .route("/v2/rerank", post(rerank::create).layer(load));
    if state.settings.dev_mode.is_some() {
        app = app
            .route("/server_info", get(dev::server_info))
            .route("/reset_prefix_cache", post(dev::reset_prefix_cache));
    }
    app = app.fallback(not_found).method_not_allowed_fallback(method_not_allowed);
    if state.settings.request_id_headers {
        app = app.layer(middleware::from_fn(x_request_id));
    }
    if access_log.0 {
        app = app.layer(middleware::from_fn_with_state(state.clone(), log_access));
    }
    app.with_state(state)
}

async fn not_found(req: Request) -> ApiError {
    ApiError::RouteNotFound(format!("{} {}", req.method(), req.uri().path()))
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

/// Logs `ADDR - "METHOD PATH VERSION" STATUS` once the response head is ready, except for the paths of
/// `--disable-access-log-for-endpoints`.
async fn log_access(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if state.settings.access_log_skip.iter().any(|p| p == req.uri().path()) {
        return next.run(req).await;
    }
    let peer = req.extensions().get::<ConnectInfo<Peer>>().map(|c| c.0 .0.to_string()).unwrap_or_else(|| "-".into());
    let line = format!("{} {} {:?}", req.method(), req.uri().path(), req.version());
    let response = next.run(req).await;
    let status = response.status();
    tracing::info!(target: "rserve::access", "{peer} - \"{line}\" {} {}", status.as_u16(), status.canonical_reason().unwrap_or(""));
    response
}

/// `--enable-request-id-headers`: every response carries `X-Request-Id`, the request's own or a fresh random one (32
/// hex digits, as vLLM's `uuid4().hex`).
async fn x_request_id(req: Request, next: Next) -> Response {
    let given = req.headers().get(X_REQUEST_ID).cloned();
    let mut response = next.run(req).await;
    let id = given.or_else(|| HeaderValue::try_from(format!("{:032x}", rand::random::<u128>())).ok());
    if let Some(id) = id {
        response.headers_mut().append(X_REQUEST_ID, id);
    }
    response
}

/// The header of `--enable-request-id-headers`.
const X_REQUEST_ID: &str = "x-request-id";

/// The routes `serve` lists at start-up: `ROUTES`, and `DEV_ROUTES` in development mode.
pub fn listed_routes(dev_mode: bool) -> impl Iterator<Item = &'static (&'static str, &'static str)> {
    ROUTES.iter().chain(if dev_mode { DEV_ROUTES } else { &[] })
}

/// Counts a generation request for `/load` from the handler's start until its response body has been sent or
/// dropped (vLLM's `load_aware_call`, which decrements in the response's background task).
async fn track_load(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let Some(slot) = state.track_load() else {
        return next.run(req).await;
    };
    let (parts, body) = next.run(req).await.into_parts();
    Response::from_parts(parts, Body::new(Counted { body, _slot: slot }))
}

/// A response body that holds its request's `/load` slot.
struct Counted {
    body: Body,
    _slot: LoadSlot,
}

impl http_body::Body for Counted {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// The client's address, for the access log: `serve::conn` puts it on each request as `ConnectInfo<Peer>`.
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub SocketAddr);

/// `router` behind what runs before routing: CORS (outermost, so that a preflight never meets the API key), then
/// `--root-path` taken off the path.
pub fn front(router: Router, cors: CorsLayer, root_path: Option<String>) -> Router {
    let strip = middleware::from_fn_with_state(root_path.map(Arc::<str>::from), strip_root_path);
    Router::new().fallback_service(cors.layer(strip.layer(router)))
}

/// FastAPI's `root_path` as Starlette routes with it: a path that starts with the root path (followed by `/` or
/// nothing) is routed without it; any other path is routed as it is, so the API answers with and without the prefix.
async fn strip_root_path(State(root): State<Option<Arc<str>>>, mut req: Request, next: Next) -> Response {
    if let Some(root) = root.as_deref() {
        if let Some(rest) = req.uri().path().strip_prefix(root).filter(|r| r.is_empty() || r.starts_with('/')) {
            let path = if rest.is_empty() { "/" } else { rest };
            let path_and_query = match req.uri().query() {
                Some(q) => format!("{path}?{q}"),
                None => path.to_owned(),
            };
            let mut parts = req.uri().clone().into_parts();
            parts.path_and_query = path_and_query.parse().ok();
            if let Ok(uri) = Uri::from_parts(parts) {
                *req.uri_mut() = uri;
            }
        }
    }
    next.run(req).await
}
