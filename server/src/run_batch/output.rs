//! The lines of a batch output file, in vLLM's `BatchRequestOutput` shape (OpenAI's batch output):
//! `{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}`. A route's 200 answer goes into
//! `body` as the route wrote it (its bytes, not re-serialized, so a line's body is byte for byte the HTTP answer);
//! any other answer goes into `error` (the route's OpenAI error body, `{"error": {...}}`) with `body` null, as vLLM
//! writes an `ErrorResponse`. A line that never reached a route gets the same error body, status 400.

use serde::de::IgnoredAny;
use serde_json::Value;

use super::line::LineFailure;
use crate::error::{ErrorBody, ErrorDetail};

/// vLLM's ids: `vllm-<uuid hex>` for the line, `vllm-batch-<uuid hex>` for the request.
pub fn new_ids() -> (String, String) {
    (format!("vllm-{:032x}", rand::random::<u128>()), format!("vllm-batch-{:032x}", rand::random::<u128>()))
}

/// The output line of a route's answer (no trailing newline).
pub fn answer_line(custom_id: Option<&str>, status: u16, body: &[u8]) -> String {
    let (id, request_id) = new_ids();
    let raw = as_json(body);
    let (body, error) = if status == 200 { (raw.as_str(), "null") } else { ("null", raw.as_str()) };
    format!(
        r#"{{"id":{},"custom_id":{},"response":{{"status_code":{status},"request_id":{},"body":{body}}},"error":{error}}}"#,
        Value::from(id),
        custom_id.map_or(Value::Null, Value::from),
        Value::from(request_id),
    )
}

/// The output line of a line that never reached a route: status 400 and an OpenAI error body.
pub fn failure_line(failure: &LineFailure) -> String {
    let body = ErrorBody {
        error: ErrorDetail {
            message: failure.error.to_string(),
            kind: "BadRequestError",
            param: failure.error.param().map(str::to_owned),
            code: 400,
        },
    };
    // An `ErrorBody` of strings always serializes.
    let bytes = serde_json::to_vec(&body).unwrap_or_default();
    answer_line(failure.custom_id.as_deref(), 400, &bytes)
}

/// The body as one line of JSON: the bytes themselves when they are JSON (compact JSON has no raw newline), else
/// the text as a JSON string.
fn as_json(body: &[u8]) -> String {
    let is_json = serde_json::from_slice::<IgnoredAny>(body).is_ok();
    match std::str::from_utf8(body) {
        Ok(text) if is_json && !text.contains('\n') => text.to_owned(),
        Ok(text) if is_json => text.replace('\n', ""),
        _ => Value::from(String::from_utf8_lossy(body).into_owned()).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::line::LineError;
    use super::*;

    fn json(line: &str) -> Value {
        assert!(!line.contains('\n'));
        serde_json::from_str(line).expect("a line is JSON")
    }

    #[test]
    fn a_200_answer_is_the_body_byte_for_byte() {
        let body = br#"{"id":"cmpl-1","object":"text_completion","z":1,"a":2}"#;
        let line = answer_line(Some("c1"), 200, body);
        assert!(line.contains(r#""body":{"id":"cmpl-1","object":"text_completion","z":1,"a":2}}"#), "{line}");
        let v = json(&line);
        assert!(v["id"].as_str().unwrap().starts_with("vllm-"));
        assert_eq!(v["custom_id"], "c1");
        assert_eq!(v["response"]["status_code"], 200);
        assert!(v["response"]["request_id"].as_str().unwrap().starts_with("vllm-batch-"));
        assert!(v["error"].is_null());
    }

    #[test]
    fn an_error_answer_goes_to_error() {
        let body = br#"{"error":{"message":"bad","type":"BadRequestError","param":"temperature","code":null}}"#;
        let v = json(&answer_line(Some("x\"y"), 400, body));
        assert_eq!(v["custom_id"], "x\"y");
        assert_eq!(v["response"]["status_code"], 400);
        assert!(v["response"]["body"].is_null());
        assert_eq!(v["error"]["error"]["param"], "temperature");
    }

    #[test]
    fn a_failed_line_has_the_openai_error_shape() {
        let f = LineFailure { custom_id: None, error: LineError::Json("eof".into()) };
        let v = json(&failure_line(&f));
        assert!(v["custom_id"].is_null());
        assert_eq!(v["response"]["status_code"], 400);
        let e = &v["error"]["error"];
        assert_eq!(e["type"], "BadRequestError");
        assert_eq!(e["message"], "the line is not valid JSON: eof");
        assert!(e["param"].is_null());
        assert_eq!(e["code"], 400);
        let f = LineFailure { custom_id: Some("u".into()), error: LineError::Url("/v1/x".into()) };
        let v = json(&failure_line(&f));
        assert_eq!(v["custom_id"], "u");
        assert_eq!(v["error"]["error"]["param"], "url");
    }

    #[test]
    fn a_body_that_is_not_json_becomes_a_string() {
        let v = json(&answer_line(Some("t"), 500, b"engine\nfailed"));
        assert_eq!(v["error"], "engine\nfailed");
    }
}
