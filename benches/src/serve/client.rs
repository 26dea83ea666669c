//! The HTTP side of `bench serve`: model discovery (`/v1/models`), the server's `/tokenize` and `/detokenize`
//! (vLLM's and llama.cpp's request and response shapes), profiler start/stop, and one streaming completion or chat
//! request (vLLM's body, extra headers, `x-request-id`) timed chunk by chunk into a [`RequestOutcome`].

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::error::BenchError;
use super::metrics::RequestOutcome;
use super::sse::SseParser;

/// Which OpenAI API the endpoint speaks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ApiKind {
    /// `/v1/completions`: `prompt` in, `choices[0].text` out.
    #[default]
    Completions,
    /// `/v1/chat/completions`: one user message in, `choices[0].delta.content` out.
    Chat,
}

impl ApiKind {
    pub fn for_endpoint(endpoint: &str) -> Self {
        if endpoint.trim_end_matches('/').ends_with("chat/completions") {
            ApiKind::Chat
        } else {
            ApiKind::Completions
        }
    }
}

/// What to send for one request.
#[derive(Debug, Clone)]
pub struct RequestSpec {
    pub prompt: String,
    pub prompt_len: usize,
    pub max_tokens: usize,
    /// The `model` field (the served model, or a LoRA adapter's name).
    pub model: String,
    /// Sent as the `x-request-id` header.
    pub request_id: Option<String>,
}

/// Settings shared by every request of a run.
#[derive(Debug, Clone, Default)]
pub struct RequestSettings {
    pub api: ApiKind,
    pub api_url: String,
    pub ignore_eos: bool,
    /// `logprobs` (completions) when given.
    pub logprobs: Option<u32>,
    /// Fields merged into every body last (the sampling flags, then `--extra-body`), as vLLM merges them.
    pub extra_body: serde_json::Map<String, Value>,
}

/// A client for one server.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
}

impl Client {
    /// A client for the server at `base` (`http://host:port`, no trailing slash needed); each request may take at
    /// most `timeout`.
    pub fn new(base: &str, timeout: Duration) -> Result<Self, BenchError> {
        Self::with_headers(base, timeout, &[])
    }

    /// A client that sends `headers` with every request (`--header`, the `OPENAI_API_KEY` bearer token).
    pub fn with_headers(base: &str, timeout: Duration, headers: &[(String, String)]) -> Result<Self, BenchError> {
        let mut map = reqwest::header::HeaderMap::new();
        for (k, v) in headers {
            let name = reqwest::header::HeaderName::from_bytes(k.as_bytes())
                .map_err(|e| BenchError::arg("--header", format!("'{k}' is not a header name: {e}")))?;
            let value = reqwest::header::HeaderValue::from_str(v)
                .map_err(|e| BenchError::arg("--header", format!("'{v}' is not a header value: {e}")))?;
            map.insert(name, value);
        }
        // No connection reuse: servers close idle keep-alive connections on their own schedule (llama.cpp's HTTP
        // library after a few requests), and a request sent on a connection the server is closing fails before it
        // reached the server. A fresh localhost connection per request costs well under a millisecond.
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .default_headers(map)
            .pool_max_idle_per_host(0)
            .build()
            .map_err(|e| BenchError::Http { url: base.to_owned(), message: e.to_string() })?;
        Ok(Self { http, base: base.trim_end_matches('/').to_owned() })
    }

    /// `base` + `path`.
    pub fn url(&self, path: &str) -> String {
        if path.starts_with('/') {
            format!("{}{path}", self.base)
        } else {
            format!("{}/{path}", self.base)
        }
    }

    async fn post_json(&self, path: &str, body: &Value) -> Result<Value, BenchError> {
        let url = self.url(path);
        let resp = self
            .http
            .post(&url)
            .json(body)
            .send()
            .await
            .map_err(|e| BenchError::Http { url: url.clone(), message: e.to_string() })?;
        read_json(url, resp).await
    }

    /// POSTs `path` (`/start_profile`, `/stop_profile`) with no body; whether the server answered 200.
    pub async fn post_empty(&self, path: &str) -> bool {
        self.http.post(self.url(path)).send().await.is_ok_and(|r| r.status() == reqwest::StatusCode::OK)
    }

    /// The id of the first model `/v1/models` lists.
    pub async fn first_model(&self) -> Result<String, BenchError> {
        let url = self.url("/v1/models");
        let resp = self
            .http
            .get(&url)
            .send()
            .await
            .map_err(|e| BenchError::Http { url: url.clone(), message: e.to_string() })?;
        let v = read_json(url.clone(), resp).await?;
        v["data"][0]["id"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| BenchError::BadResponse { url, message: format!("no model id in {v}") })
    }

    /// Token ids of `text` without special tokens, from the server's `/tokenize` (vLLM's `prompt` shape first, then
    /// llama.cpp's `content` shape).
    pub async fn tokenize(&self, text: &str) -> Result<Vec<u32>, BenchError> {
        let first = self.post_json("/tokenize", &json!({ "prompt": text, "add_special_tokens": false })).await;
        // llama.cpp answers the vLLM shape with an empty list (it reads `content`), so only a non-empty answer (or
        // any answer for empty text) is taken.
        let v = match first {
            Ok(v) if v["tokens"].as_array().is_some_and(|t| !t.is_empty() || text.is_empty()) => v,
            _ => self.post_json("/tokenize", &json!({ "content": text, "add_special": false })).await?,
        };
        let ids = v["tokens"].as_array().ok_or_else(|| BenchError::BadResponse {
            url: self.url("/tokenize"),
            message: format!("no tokens in {v}"),
        })?;
        ids.iter().map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok())).collect::<Option<Vec<u32>>>().ok_or_else(
            || BenchError::BadResponse { url: self.url("/tokenize"), message: format!("bad token ids in {v}") },
        )
    }

    /// Text of `ids` from the server's `/detokenize` (answers `prompt` on vLLM and rserve, `content` on llama.cpp).
    pub async fn detokenize(&self, ids: &[u32]) -> Result<String, BenchError> {
        let v = self.post_json("/detokenize", &json!({ "tokens": ids })).await?;
        v.get("prompt")
            .or_else(|| v.get("content"))
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| BenchError::BadResponse { url: self.url("/detokenize"), message: format!("no text in {v}") })
    }

    /// Sends one streaming request and times it; `run_start` is the start of the benchmark (for `start_offset`).
    /// Never fails: errors are recorded in the outcome.
    pub async fn stream_request(&self, s: &RequestSettings, req: &RequestSpec, run_start: Instant) -> RequestOutcome {
        let mut out = RequestOutcome { prompt_len: req.prompt_len, ..Default::default() };
        let body = request_body(s, req);
        let sent = Instant::now();
        out.start_offset = sent.duration_since(run_start).as_secs_f64();
        let mut post = self.http.post(&s.api_url).json(&body);
        if let Some(id) = &req.request_id {
            post = post.header("x-request-id", id);
        }
        let resp = match post.send().await {
            Ok(r) => r,
            Err(e) => {
                out.error = format!("request failed: {e}");
                return out;
            }
        };
        if !resp.status().is_success() {
            let status = resp.status().as_u16();
            out.error = format!("HTTP {status}: {}", resp.text().await.unwrap_or_default());
            return out;
        }
        let mut resp = resp;
        let mut parser = SseParser::new();
        let mut last: Option<Instant> = None;
        let mut done = false;
        loop {
            let events = match resp.chunk().await {
                Ok(Some(bytes)) => parser.push(&bytes),
                Ok(None) => {
                    let tail: Vec<String> = parser.finish().into_iter().collect();
                    done = true;
                    tail
                }
                Err(e) => {
                    out.error = format!("stream broke: {e}");
                    return out;
                }
            };
            let now = Instant::now();
            for data in events {
                if data.trim() == "[DONE]" {
                    continue;
                }
                let v: Value = match serde_json::from_str(&data) {
                    Ok(v) => v,
                    Err(e) => {
                        out.error = format!("bad stream chunk ({e}): {data}");
                        return out;
                    }
                };
                if let Some(err) = v.get("error") {
                    out.error = format!("server error in stream: {err}");
                    return out;
                }
                if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
                    let get = |k: &str| u.get(k).and_then(Value::as_u64).map(|n| n as usize);
                    out.usage_prompt_tokens = get("prompt_tokens").or(out.usage_prompt_tokens);
                    out.usage_completion_tokens = get("completion_tokens").or(out.usage_completion_tokens);
                }
                let text = chunk_text(s.api, &v);
                if text.is_empty() {
                    continue;
                }
                match last {
                    None => out.ttft = now.duration_since(sent).as_secs_f64(),
                    Some(prev) => out.itl.push(now.duration_since(prev).as_secs_f64()),
                }
                last = Some(now);
                out.num_chunks += 1;
                out.generated_text.push_str(text);
            }
            if done {
                break;
            }
        }
        out.latency = sent.elapsed().as_secs_f64();
        if last.is_none() {
            out.error = "the stream ended without any text".into();
            return out;
        }
        out.success = true;
        out
    }
}

/// The JSON body of one streaming request, as vLLM's request functions build it: completions take `prompt` and
/// `max_tokens` (and `logprobs` when given), chat one user message and `max_completion_tokens`; then `ignore_eos`
/// when set, then the sampling and `--extra-body` fields, which override anything before them.
pub fn request_body(s: &RequestSettings, req: &RequestSpec) -> Value {
    let mut body = json!({
        "model": req.model,
        "stream": true,
        "stream_options": { "include_usage": true },
    });
    match s.api {
        ApiKind::Completions => {
            body["prompt"] = json!(req.prompt);
            body["max_tokens"] = json!(req.max_tokens);
            if let Some(n) = s.logprobs {
                body["logprobs"] = json!(n);
            }
        }
        ApiKind::Chat => {
            body["messages"] = json!([{ "role": "user", "content": req.prompt }]);
            body["max_completion_tokens"] = json!(req.max_tokens);
        }
    }
    if s.ignore_eos {
        body["ignore_eos"] = json!(true);
    }
    if let Value::Object(m) = &mut body {
        m.extend(s.extra_body.clone());
    }
    body
}

/// The text a stream chunk carries (empty for role-only, finish and usage chunks).
fn chunk_text(api: ApiKind, v: &Value) -> &str {
    let choice = &v["choices"][0];
    let text = match api {
        ApiKind::Completions => choice["text"].as_str(),
        ApiKind::Chat => choice["delta"]["content"].as_str().or_else(|| choice["delta"]["reasoning_content"].as_str()),
    };
    text.unwrap_or("")
}

async fn read_json(url: String, resp: reqwest::Response) -> Result<Value, BenchError> {
    let status = resp.status();
    let text = resp.text().await.map_err(|e| BenchError::Http { url: url.clone(), message: e.to_string() })?;
    if !status.is_success() {
        return Err(BenchError::Status { url, status: status.as_u16(), body: text });
    }
    serde_json::from_str(&text).map_err(|e| BenchError::BadResponse { url, message: format!("{e}: {text}") })
}
