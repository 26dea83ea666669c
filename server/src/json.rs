//! `ApiJson<T>`: the JSON body extractor of every POST route. It reads the body up to `MAX_BODY_BYTES` whatever the
//! content type, and answers parse errors and oversized bodies as OpenAI-shaped `ApiError`s (naming the field that
//! failed), never as axum's plain-text rejections. A body not in within `--http-body-timeout` (`BodyTimeout`, put on
//! the request by the connection) is answered 408.

use axum::body::Body;
use axum::extract::{FromRequest, Request};
use futures_util::StreamExt;
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// Largest accepted request body.
pub const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;
/// How much of an oversized body is read and thrown away so that the client can read the 413 (closing a socket with
/// unread data makes the kernel reset the connection).
const MAX_DRAIN_BYTES: usize = 8 * MAX_BODY_BYTES;

/// How long the whole body may take to arrive (`--http-body-timeout`), a request extension set per connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyTimeout(pub std::time::Duration);

/// A JSON request body deserialized into `T`.
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

/// Reads a whole body, refusing it past `limit` bytes.
pub async fn read_body(body: Body, limit: usize) -> Result<Vec<u8>, ApiError> {
    let mut data = body.into_data_stream();
    let mut buf = Vec::new();
    let mut seen = 0usize;
    while let Some(chunk) = data.next().await {
        let chunk = chunk.map_err(|e| ApiError::Body(e.to_string()))?;
        seen = seen.saturating_add(chunk.len());
        if seen > limit {
            if seen > MAX_DRAIN_BYTES {
                break;
            }
            continue;
        }
        buf.extend_from_slice(&chunk);
    }
    if seen > limit {
        return Err(ApiError::PayloadTooLarge { limit });
    }
    Ok(buf)
}

/// Parses JSON, naming the field that failed (e.g. `messages[0].content`).
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let param = (path != ".").then_some(path);
        ApiError::InvalidJson { message: e.inner().to_string(), param }
    })?;
    de.end().map_err(|e| ApiError::InvalidJson { message: e.to_string(), param: None })?;
    Ok(value)
}

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Self::Rejection> {
        let timeout = req.extensions().get::<BodyTimeout>().copied();
        let read = read_body(req.into_body(), MAX_BODY_BYTES);
        let bytes = match timeout {
            Some(BodyTimeout(t)) => tokio::time::timeout(t, read).await.map_err(|_| ApiError::BodyTimeout(t))??,
            None => read.await?,
        };
        parse(&bytes).map(ApiJson)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openai::types::{ChatCompletionRequest, CompletionRequest};

    #[test]
    fn parse_errors_name_the_field() {
        let e = parse::<ChatCompletionRequest>(br#"{"messages": [], "temperature": "hot"}"#).unwrap_err();
        match e {
            ApiError::InvalidJson { param, message } => {
                assert_eq!(param.as_deref(), Some("temperature"));
                assert!(message.contains("invalid type"), "{message}");
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(matches!(parse::<ChatCompletionRequest>(b"{not json"), Err(ApiError::InvalidJson { .. })));
        assert!(matches!(parse::<ChatCompletionRequest>(b"{} x"), Err(ApiError::InvalidJson { .. })));
        assert!(matches!(parse::<ChatCompletionRequest>(b""), Err(ApiError::InvalidJson { .. })));
    }

    #[test]
    fn parse_errors_in_the_shared_sampling_fields_name_the_field() {
        let param = |body: &[u8]| match parse::<CompletionRequest>(body) {
            Err(ApiError::InvalidJson { param, .. }) => param,
            other => panic!("unexpected {other:?}"),
        };
        assert_eq!(param(br#"{"prompt": "x", "seed": "a"}"#).as_deref(), Some("seed"));
        assert_eq!(param(br#"{"prompt": "x", "top_k": 1.5}"#).as_deref(), Some("top_k"));
        assert_eq!(param(br#"{"prompt": "x", "stop_token_ids": [1, "a"]}"#).as_deref(), Some("stop_token_ids[1]"));
        assert_eq!(param(br#"{"prompt": "x", "logit_bias": {"5": "a"}}"#).as_deref(), Some("logit_bias.5"));
        assert_eq!(
            param(br#"{"prompt": "x", "stream_options": {"include_usage": 1}}"#).as_deref(),
            Some("stream_options.include_usage")
        );
        assert_eq!(param(br#"{"prompt": 5}"#).as_deref(), Some("prompt"));
    }

    #[test]
    fn the_shared_sampling_fields_are_read_from_the_top_level() {
        let r: CompletionRequest =
            parse(br#"{"prompt": "x", "temperature": 1, "max_tokens": 3, "echo": true}"#).expect("parses");
        assert_eq!(r.sampling.temperature, Some(1.0), "an integer is read as a float");
        assert_eq!(r.sampling.max_tokens, Some(3));
        assert_eq!(r.echo, Some(true));
        let e = parse::<ChatCompletionRequest>(b"5").unwrap_err();
        assert!(e.to_string().contains("expected struct ChatCompletionRequest"), "{e}");
    }

    #[test]
    fn unknown_fields_are_ignored() {
        let r: ChatCompletionRequest =
            parse(br#"{"messages": [{"role":"user","content":"hi"}], "frobnicate": 3, "metadata": {"a": 1}}"#)
                .expect("parses");
        assert_eq!(r.messages.len(), 1);
    }

    #[tokio::test]
    async fn a_body_slower_than_its_timeout_is_408() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(1);
        tx.send(Ok(b"{\"prompt\":".to_vec())).await.expect("send");
        let body = Body::from_stream(tokio_stream_of(rx));
        let mut req = Request::new(body);
        req.extensions_mut().insert(BodyTimeout(std::time::Duration::from_millis(50)));
        let err = ApiJson::<CompletionRequest>::from_request(req, &()).await.unwrap_err();
        assert!(matches!(err, ApiError::BodyTimeout(_)), "{err:?}");
        drop(tx);
    }

    /// The receiver as a stream (a body whose sender never finishes).
    fn tokio_stream_of(
        mut rx: tokio::sync::mpsc::Receiver<Result<Vec<u8>, std::io::Error>>,
    ) -> impl futures_util::Stream<Item = Result<Vec<u8>, std::io::Error>> {
        futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
    }

    #[tokio::test]
    async fn oversized_bodies_are_refused() {
        let err = read_body(Body::from(vec![b'x'; 100]), 99).await.unwrap_err();
        assert!(matches!(err, ApiError::PayloadTooLarge { limit: 99 }));
        assert_eq!(read_body(Body::from(vec![b'x'; 99]), 99).await.expect("fits").len(), 99);
    }
}
