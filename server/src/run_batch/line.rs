//! One line of a batch input file (OpenAI's batch request shape: `{"custom_id", "method", "url", "body"}`) checked
//! into a `BatchRequest`, or a `LineFailure` that still carries the `custom_id` when the line has one, so that its
//! error line can be matched to its request. Only what routing needs is checked here; the body itself is validated
//! by the route it goes to, as the server would.

use serde_json::{Map, Value};

/// The routes a batch line may name (those that generate).
pub const ROUTES: &[&str] = &["/v1/chat/completions", "/v1/completions"];

/// A line ready for its route.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchRequest {
    pub custom_id: String,
    /// One of `ROUTES`.
    pub url: &'static str,
    /// The request body, as JSON bytes.
    pub body: Vec<u8>,
}

/// Why a line never reached a route.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LineError {
    #[error("the line is not valid UTF-8")]
    Utf8,
    #[error("the line is not valid JSON: {0}")]
    Json(String),
    #[error("the line must be a JSON object with custom_id, method, url and body")]
    NotAnObject,
    #[error("custom_id is missing: every batch line needs a string custom_id")]
    MissingCustomId,
    #[error("custom_id must be a string")]
    CustomIdType,
    #[error("method {0} is not supported: batch requests are POST")]
    Method(String),
    /// vLLM's message, with the routes rserve runs.
    #[error("URL {0} was used. Supported endpoints: /v1/chat/completions, /v1/completions.")]
    Url(String),
    #[error("body must be a JSON object (the request of the route named by url)")]
    Body,
    /// vLLM's message: a batch answer is one JSON body, never an event stream.
    #[error("Request must not be sent in stream mode")]
    Stream,
}

impl LineError {
    /// The field the error is about (OpenAI's `param`).
    pub fn param(&self) -> Option<&'static str> {
        match self {
            LineError::Utf8 | LineError::Json(_) | LineError::NotAnObject => None,
            LineError::MissingCustomId | LineError::CustomIdType => Some("custom_id"),
            LineError::Method(_) => Some("method"),
            LineError::Url(_) => Some("url"),
            LineError::Body => Some("body"),
            LineError::Stream => Some("stream"),
        }
    }
}

/// A line that failed, with its `custom_id` when it had a string one.
#[derive(Debug, Clone, PartialEq)]
pub struct LineFailure {
    pub custom_id: Option<String>,
    pub error: LineError,
}

/// Checks one non-blank input line.
pub fn parse(bytes: &[u8]) -> Result<BatchRequest, LineFailure> {
    let fail = |custom_id: Option<String>, error| LineFailure { custom_id, error };
    let text = std::str::from_utf8(bytes).map_err(|_| fail(None, LineError::Utf8))?;
    let value: Value = serde_json::from_str(text).map_err(|e| fail(None, LineError::Json(e.to_string())))?;
    let Value::Object(mut line) = value else { return Err(fail(None, LineError::NotAnObject)) };
    let custom_id = match line.get("custom_id") {
        Some(Value::String(s)) => s.clone(),
        None | Some(Value::Null) => return Err(fail(None, LineError::MissingCustomId)),
        Some(_) => return Err(fail(None, LineError::CustomIdType)),
    };
    let with_id = |error| LineFailure { custom_id: Some(custom_id.clone()), error };
    // OpenAI requires the method; vLLM does not look at it. A missing one is taken as POST.
    match line.get("method") {
        None | Some(Value::Null) => {}
        Some(Value::String(m)) if m.eq_ignore_ascii_case("POST") => {}
        Some(other) => return Err(with_id(LineError::Method(shown(other)))),
    }
    let url = match line.get("url") {
        Some(Value::String(u)) => {
            ROUTES.iter().copied().find(|r| r == u).ok_or_else(|| with_id(LineError::Url(u.clone())))?
        }
        other => return Err(with_id(LineError::Url(other.map(shown).unwrap_or_else(|| "(none)".into())))),
    };
    let body: Map<String, Value> = match line.remove("body") {
        Some(Value::Object(b)) => b,
        _ => return Err(with_id(LineError::Body)),
    };
    if body.get("stream") == Some(&Value::Bool(true)) {
        return Err(with_id(LineError::Stream));
    }
    let body = serde_json::to_vec(&body).map_err(|e| with_id(LineError::Json(e.to_string())))?;
    Ok(BatchRequest { custom_id, url, body })
}

/// A JSON value for a message: strings without their quotes.
fn shown(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chat_line_becomes_a_request() {
        let line =
            br#"{"custom_id":"a1","method":"POST","url":"/v1/chat/completions","body":{"messages":[],"max_tokens":4}}"#;
        let r = parse(line).expect("valid");
        assert_eq!(r.custom_id, "a1");
        assert_eq!(r.url, "/v1/chat/completions");
        let body: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(body["max_tokens"], 4);
        let r = parse(br#"{"custom_id":"b","url":"/v1/completions","body":{"prompt":"x"}}"#).expect("no method: POST");
        assert_eq!(r.url, "/v1/completions");
    }

    #[test]
    fn failures_keep_the_custom_id_when_there_is_one() {
        let cases: &[(&[u8], Option<&str>, LineError)] = &[
            (b"{not json", None, LineError::Json(String::new())),
            (b"\xff\xfe", None, LineError::Utf8),
            (b"[1,2]", None, LineError::NotAnObject),
            (br#"{"url":"/v1/completions","body":{}}"#, None, LineError::MissingCustomId),
            (br#"{"custom_id":7,"url":"/v1/completions","body":{}}"#, None, LineError::CustomIdType),
            (
                br#"{"custom_id":"m","method":"GET","url":"/v1/completions","body":{}}"#,
                Some("m"),
                LineError::Method("GET".into()),
            ),
            (
                br#"{"custom_id":"u","method":"POST","url":"/v1/embeddings","body":{}}"#,
                Some("u"),
                LineError::Url("/v1/embeddings".into()),
            ),
            (br#"{"custom_id":"n","method":"POST","body":{}}"#, Some("n"), LineError::Url("(none)".into())),
            (br#"{"custom_id":"b","method":"POST","url":"/v1/completions","body":"x"}"#, Some("b"), LineError::Body),
            (
                br#"{"custom_id":"s","url":"/v1/completions","body":{"prompt":"x","stream":true}}"#,
                Some("s"),
                LineError::Stream,
            ),
        ];
        for (line, id, error) in cases {
            let f = parse(line).expect_err("invalid");
            assert_eq!(f.custom_id.as_deref(), *id, "{}", String::from_utf8_lossy(line));
            match (&f.error, error) {
                (LineError::Json(_), LineError::Json(_)) => {}
                (got, want) => assert_eq!(got, want),
            }
        }
    }

    #[test]
    fn the_url_error_is_vllms() {
        assert_eq!(
            LineError::Url("/v1/embeddings".into()).to_string(),
            "URL /v1/embeddings was used. Supported endpoints: /v1/chat/completions, /v1/completions."
        );
        assert_eq!(LineError::Url("x".into()).param(), Some("url"));
    }
}
