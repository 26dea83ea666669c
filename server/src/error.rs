//! `ApiError`: every error a route can return, and the single place where errors become HTTP responses
//! (`impl IntoResponse`), OpenAI-shaped: `{"error": {"message", "type", "param", "code"}}`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::openai::pooling::PoolingError;
use crate::openai::validate::ValidationError;

/// An error answered to the client.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// A field broke one of the validation rules.
    #[error(transparent)]
    Validation(#[from] ValidationError),
    /// A rule of the pooling routes, or a generation route on a pooling model.
    #[error(transparent)]
    Pooling(#[from] PoolingError),
    /// The body is not valid JSON for this route (`param` names the field when known).
    #[error("invalid JSON body: {message}")]
    InvalidJson { message: String, param: Option<String> },
    /// The body could not be read.
    #[error("could not read the request body: {0}")]
    Body(String),
    /// The body is larger than the limit.
    #[error("request body is larger than the limit of {limit} bytes")]
    PayloadTooLarge { limit: usize },
    #[error("The model `{0}` does not exist.")]
    ModelNotFound(String),
    #[error("missing or invalid API key: send `Authorization: Bearer <key>`")]
    Unauthorized,
    /// The engine's waiting queue is full.
    #[error("the server is overloaded: {waiting} requests are waiting (limit {limit}); retry later")]
    Overloaded { waiting: usize, limit: usize },
    /// `--max-num-queued-reqs`: as many requests as allowed are in flight (waiting or running).
    #[error("the server is at capacity: {in_flight} requests are in flight (limit {limit}); retry later")]
    AtCapacity { in_flight: usize, limit: usize },
    /// `--max-connections` connections are open.
    #[error("the server is at capacity: {limit} connections are open; retry later")]
    TooManyConnections { limit: usize },
    /// The body did not arrive within `--http-body-timeout`.
    #[error("the request body did not arrive within {:.1} s", .0.as_secs_f64())]
    BodyTimeout(std::time::Duration),
    #[error("the engine has stopped: no request can be served (the server waits to be restarted)")]
    EngineStopped,
    #[error("the server is shutting down")]
    ShuttingDown,
    #[error("no route for {0}")]
    RouteNotFound(String),
    #[error("method not allowed")]
    MethodNotAllowed,
    /// A query parameter has a value the route cannot take.
    #[error("invalid query parameter {param}: {message}")]
    InvalidQuery { param: &'static str, message: String },
    /// A field broke a rule of a route that names its fields itself (the Responses API).
    #[error("{message}")]
    BadRequest { message: String, param: Option<String> },
    /// A stored response that is unknown, or no longer kept.
    #[error("Response with id '{id}' not found.")]
    ResponseNotFound { id: String, param: &'static str },
    /// The engine failed while running the request.
    #[error("internal error: {0}")]
    Internal(String),
}

/// The JSON body of every error response.
#[derive(Debug, Serialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize)]
pub struct ErrorDetail {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub param: Option<String>,
    /// The HTTP status, as vLLM sets it.
    pub code: u16,
}

/// Seconds a client should wait before retrying an overloaded server.
const RETRY_AFTER_SECS: &str = "1";

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Validation(_)
            | ApiError::Pooling(_)
            | ApiError::InvalidJson { .. }
            | ApiError::Body(_)
            | ApiError::InvalidQuery { .. }
            | ApiError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::ModelNotFound(_) | ApiError::RouteNotFound(_) | ApiError::ResponseNotFound { .. } => {
                StatusCode::NOT_FOUND
            }
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::Overloaded { .. }
            | ApiError::AtCapacity { .. }
            | ApiError::TooManyConnections { .. }
            | ApiError::EngineStopped
            | ApiError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The OpenAI error body for this error.
    pub fn body(&self) -> ErrorBody {
        let kind = match self.status() {
            StatusCode::BAD_REQUEST | StatusCode::PAYLOAD_TOO_LARGE | StatusCode::REQUEST_TIMEOUT => "BadRequestError",
            StatusCode::NOT_FOUND => "NotFoundError",
            StatusCode::UNAUTHORIZED => "AuthenticationError",
            StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailableError",
            StatusCode::METHOD_NOT_ALLOWED => "MethodNotAllowedError",
            _ => "InternalServerError",
        };
        let param = match self {
            ApiError::Validation(v) => v.param(),
            ApiError::Pooling(p) => p.param(),
            ApiError::InvalidJson { param, .. } | ApiError::BadRequest { param, .. } => param.clone(),
            ApiError::ResponseNotFound { param, .. } => Some((*param).to_owned()),
            ApiError::InvalidQuery { param, .. } => Some((*param).to_owned()),
            ApiError::ModelNotFound(_) => Some("model".into()),
            _ => None,
        };
        let code = self.status().as_u16();
        ErrorBody { error: ErrorDetail { message: self.to_string(), kind, param, code } }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::warn!(status = status.as_u16(), "request failed: {self}");
        } else {
            tracing::debug!(status = status.as_u16(), "request refused: {self}");
        }
        let mut response = (status, axum::Json(self.body())).into_response();
        // Every 503 says when to come back: a full queue or connection table empties, and a dead engine's server is
        // restarted by its supervisor.
        if status == StatusCode::SERVICE_UNAVAILABLE {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static(RETRY_AFTER_SECS));
        }
        if matches!(self, ApiError::BodyTimeout(_)) {
            // The rest of the body is still on its way: the connection cannot carry another request.
            response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        if matches!(self, ApiError::Unauthorized) {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn body_json(e: ApiError) -> (StatusCode, Option<String>, serde_json::Value) {
        let r = e.into_response();
        let status = r.status();
        let retry = r.headers().get(header::RETRY_AFTER).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let bytes = axum::body::to_bytes(r.into_body(), 1 << 20).await.expect("body");
        (status, retry, serde_json::from_slice(&bytes).expect("json"))
    }

    #[tokio::test]
    async fn error_bodies_have_openai_shape() {
        let (s, _, v) = body_json(ApiError::ModelNotFound("x".into())).await;
        assert_eq!(s, 404);
        assert_eq!(v["error"]["type"], "NotFoundError");
        assert_eq!(v["error"]["param"], "model");
        assert_eq!(v["error"]["code"], 404);
        assert_eq!(v["error"]["message"], "The model `x` does not exist.");

        let (s, _, v) = body_json(ApiError::Validation(ValidationError::TemperatureOutOfRange(3.0))).await;
        assert_eq!(s, 400);
        assert_eq!(v["error"]["type"], "BadRequestError");
        assert_eq!(v["error"]["param"], "temperature");
        assert_eq!(v["error"]["code"], 400, "vLLM puts the HTTP status in `code`");

        let (s, retry, v) = body_json(ApiError::Overloaded { waiting: 3, limit: 3 }).await;
        assert_eq!(s, 503);
        assert_eq!(retry.as_deref(), Some("1"));
        assert_eq!(v["error"]["type"], "ServiceUnavailableError");

        let (s, retry, v) = body_json(ApiError::EngineStopped).await;
        assert_eq!((s.as_u16(), retry.as_deref()), (503, Some("1")), "a dead engine's 503 says when to retry");
        assert_eq!(v["error"]["type"], "ServiceUnavailableError");

        let (s, retry, v) = body_json(ApiError::TooManyConnections { limit: 4 }).await;
        assert_eq!((s.as_u16(), retry.as_deref()), (503, Some("1")));
        assert_eq!(v["error"]["code"], 503);

        let (s, _, v) = body_json(ApiError::BodyTimeout(std::time::Duration::from_secs(2))).await;
        assert_eq!(s, 408);
        assert_eq!(v["error"]["code"], 408);

        let (s, _, v) = body_json(ApiError::PayloadTooLarge { limit: 10 }).await;
        assert_eq!(s, 413);
        assert_eq!(v["error"]["code"], 413);

        let (s, _, v) = body_json(ApiError::Unauthorized).await;
        assert_eq!(s, 401);
        assert_eq!(v["error"]["code"], 401);
        let keys: Vec<_> = v["error"].as_object().expect("object").keys().cloned().collect();
        assert_eq!(keys.len(), 4, "{keys:?}");
    }
}
