//! API-key check for the `/v1` routes: `Authorization: Bearer <key>` must match one of the `--api-key` keys (or
//! `VLLM_API_KEY`, or the lines of `--api-key-file`), compared in constant time.

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use crate::error::ApiError;
use crate::state::AppState;

/// Compares in constant time for keys of one length (`subtle`, which keeps the optimiser from turning the loop into
/// an early exit); only the length can show in the time taken.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    bool::from(a.ct_eq(b))
}

/// True if the `Authorization` header value carries this key.
pub fn authorized(header: Option<&[u8]>, key: &str) -> bool {
    let Some(h) = header else { return false };
    let Some(token) = h.strip_prefix(b"Bearer ") else {
        return false;
    };
    same_bytes(token, key.as_bytes())
}

/// Middleware: refuses requests without the right key (when a key is configured).
pub async fn require_api_key(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let keys = &state.settings.api_keys;
    if !keys.is_empty() {
        let header = req.headers().get(AUTHORIZATION).map(|v| v.as_bytes());
        // Every key is compared (no early exit), so the time taken does not say which key came close.
        let matches = keys.iter().fold(false, |found, key| authorized(header, key) | found);
        if !matches {
            return ApiError::Unauthorized.into_response();
        }
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_keys() {
        assert!(authorized(Some(b"Bearer sk-1"), "sk-1"));
        assert!(!authorized(Some(b"Bearer sk-2"), "sk-1"));
        assert!(!authorized(Some(b"Bearer sk-1x"), "sk-1"));
        assert!(!authorized(Some(b"sk-1"), "sk-1"));
        assert!(!authorized(None, "sk-1"));
    }
}
