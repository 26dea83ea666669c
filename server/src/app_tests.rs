//! Route tests over the whole router with the fake engine (no model): status codes and bodies of every route and
//! error case, SSE framing, API-key checks, admission (503), that a dropped stream aborts its requests; the front
//! layers (CORS preflights, `--root-path`), `/load` counting and the development routes.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use futures_util::StreamExt;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::app::{router, AccessLog};
use crate::cors::CorsSettings;
use crate::state::{AppState, ServerInfo, ServerSettings};
use crate::testing::{FakeEngine, REPLY};

fn settings() -> ServerSettings {
    ServerSettings {
        tools: Default::default(),
        reasoning: None,
        served_model_names: vec!["smol".into(), "alias".into()],
        api_keys: Vec::new(),
        default_chat_template_kwargs: Default::default(),
        max_num_waiting: 100,
        max_num_queued_reqs: None,
        access_log_skip: Vec::new(),
        request_id_headers: false,
        log_requests: true,
        server_load_tracking: false,
        dev_mode: None,
    }
}

fn app_with(engine: FakeEngine, settings: ServerSettings) -> (Router, Arc<FakeEngine>) {
    let engine = Arc::new(engine);
    let state = AppState::new(engine.clone(), settings);
    (router(state, AccessLog(false)), engine)
}

fn app() -> (Router, Arc<FakeEngine>) {
    app_with(FakeEngine::new(128), settings())
}

fn post(path: &str, body: Value) -> Request<Body> {
    Request::post(path)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .expect("request")
}

async fn send(app: &Router, req: Request<Body>) -> (StatusCode, Vec<u8>) {
    let resp = app.clone().oneshot(req).await.expect("infallible");
    let status = resp.status();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes().to_vec();
    (status, bytes)
}

async fn send_json(app: &Router, req: Request<Body>) -> (StatusCode, Value) {
    let (status, bytes) = send(app, req).await;
    let v = serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
    (status, v)
}

/// `code` is the HTTP status, as vLLM sets it.
fn assert_error(v: &Value, kind: &str, param: Option<&str>, status: u16) {
    let e = &v["error"];
    assert_eq!(e["type"], kind, "{v}");
    assert_eq!(e["param"].as_str(), param, "{v}");
    assert_eq!(e["code"].as_u64(), Some(u64::from(status)), "{v}");
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
}

/// SSE `data:` payloads of a body.
fn sse_data(bytes: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(bytes)
        .split("\n\n")
        .filter_map(|ev| ev.lines().find_map(|l| l.strip_prefix("data: ")).map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn chat_completion_json() {
    let (app, engine) = app();
    let (s, v) = send_json(
        &app,
        post(
            "/v1/chat/completions",
            json!({"model": "alias", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "n": 2}),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["model"], "alias");
    assert_eq!(v["object"], "chat.completion");
    assert!(v["id"].as_str().is_some_and(|id| id.starts_with("chatcmpl-")));
    assert_eq!(v["choices"].as_array().map(Vec::len), Some(2));
    assert_eq!(v["choices"][1]["message"]["content"], &REPLY[..5]);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 10);
    assert_eq!(v["usage"]["prompt_tokens"], 22);
    assert_eq!(engine.submitted().len(), 2);
}

#[tokio::test]
async fn chat_stream_sse() {
    let (app, _) = app();
    let (s, bytes) = send(&app, post("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "hi"}], "stop": ",", "stream": true, "stream_options": {"include_usage": true}}))).await;
    assert_eq!(s, StatusCode::OK);
    let data = sse_data(&bytes);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).expect("json")).collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chunks[0]["model"], "smol");
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(text, "Hello");
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "stop");
    let usage = &chunks[chunks.len() - 1];
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 5);
}

#[tokio::test]
async fn completions_json_stream_and_token_prompts() {
    let (app, engine) = app();
    let (s, v) =
        send_json(&app, post("/v1/completions", json!({"prompt": ["a", "b"], "max_tokens": 3, "echo": true}))).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["object"], "text_completion");
    assert!(v["id"].as_str().is_some_and(|id| id.starts_with("cmpl-")));
    assert_eq!(v["choices"][0]["text"], format!("a{}", &REPLY[..3]));
    assert_eq!(v["choices"][1]["text"], format!("b{}", &REPLY[..3]));
    let (s, v) =
        send_json(&app, post("/v1/completions", json!({"prompt": [5, 6, 7], "max_tokens": 2, "logprobs": 1}))).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["choices"][0]["logprobs"]["tokens"], json!(["H", "e"]));
    assert_eq!(engine.submitted().last().map(|r| r.prompt_token_ids.clone()), Some(crate::testing::ids(&[5, 6, 7])));
    let (s, bytes) = send(&app, post("/v1/completions", json!({"prompt": "a", "max_tokens": 2, "stream": true}))).await;
    assert_eq!(s, StatusCode::OK);
    let data = sse_data(&bytes);
    assert_eq!(data.len(), 4, "{data:?}");
    assert_eq!(data[3], "[DONE]");
}

#[tokio::test]
async fn models_health_version_metrics() {
    let (app, _) = app();
    let (s, v) = send_json(&app, Request::get("/v1/models").body(Body::empty()).expect("req")).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], "smol");
    assert_eq!(v["data"][1]["id"], "alias");
    assert_eq!(v["data"][0]["object"], "model");
    assert_eq!(v["data"][0]["max_model_len"], 128);
    assert_eq!(v["data"][0]["owned_by"], "vllm");
    let (s, body) = send(&app, Request::get("/health").body(Body::empty()).expect("req")).await;
    assert_eq!((s, body.len()), (StatusCode::OK, 0));
    let (s, v) = send_json(&app, Request::get("/version").body(Body::empty()).expect("req")).await;
    assert_eq!(s, StatusCode::OK);
    assert!(v["version"].is_string());
    let (s, body) = send(&app, Request::get("/metrics").body(Body::empty()).expect("req")).await;
    assert_eq!(s, StatusCode::OK);
    assert!(String::from_utf8_lossy(&body).contains("vllm:num_requests_running{model_name=\"smol\",engine=\"0\"} 0"));
}

#[tokio::test]
async fn tokenize_and_detokenize() {
    let (app, _) = app();
    let (s, v) = send_json(&app, post("/tokenize", json!({"prompt": "ab", "return_token_strs": true}))).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v, json!({"count": 3, "max_model_len": 128, "tokens": [0, 100, 101], "token_strs": ["<s>", "a", "b"]}));
    let (s, v) = send_json(&app, post("/tokenize", json!({"messages": [{"role": "user", "content": "x"}]}))).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["count"], 21);
    let (s, v) = send_json(&app, post("/detokenize", json!({"tokens": [100, 101]}))).await;
    assert_eq!((s, v), (StatusCode::OK, json!({"prompt": "ab"})));
    let (s, v) = send_json(&app, post("/detokenize", json!({"tokens": [100, 100000]}))).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_error(&v, "BadRequestError", Some("tokens"), 400);
    let (s, v) = send_json(&app, post("/tokenize", json!({}))).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_error(&v, "BadRequestError", Some("prompt"), 400);
}

#[tokio::test]
async fn error_cases() {
    let (app, _) = app();
    let chat = |extra: Value| {
        let mut body = json!({"messages": [{"role": "user", "content": "hi"}]});
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        post("/v1/chat/completions", body)
    };
    let (s, v) = send_json(&app, chat(json!({"temperature": 5}))).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_error(&v, "BadRequestError", Some("temperature"), 400);
    assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("between 0 and 2")));

    let (s, v) = send_json(&app, chat(json!({"max_tokens": 1000}))).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_error(&v, "BadRequestError", Some("messages"), 400);

    let (s, v) = send_json(&app, chat(json!({"model": "gpt-4"}))).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_error(&v, "NotFoundError", Some("model"), 404);

    let (s, v) = send_json(&app, chat(json!({"tools": [{"type": "function"}]}))).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_error(&v, "BadRequestError", Some("tools[0]"), 400);

    let (s, v) = send_json(&app, chat(json!({"messages": "nope"}))).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_error(&v, "BadRequestError", Some("messages"), 400);

    let req = Request::post("/v1/chat/completions").body(Body::from("{\"messages\": [")).expect("req");
    let (s, v) = send_json(&app, req).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(v["error"]["type"], "BadRequestError");

    let big = vec![b' '; crate::json::MAX_BODY_BYTES + 1];
    let (s, v) = send_json(&app, Request::post("/v1/completions").body(Body::from(big)).expect("req")).await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);
    assert_error(&v, "BadRequestError", None, 413);

    let (s, v) = send_json(&app, Request::get("/v1/nothing").body(Body::empty()).expect("req")).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_eq!(v["error"]["type"], "NotFoundError");
    let (s, v) = send_json(&app, Request::get("/v1/chat/completions").body(Body::empty()).expect("req")).await;
    assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED);
    assert!(v["error"].is_object());
}

#[tokio::test]
async fn api_key_guards_v1_only() {
    let (app, _) = app_with(
        FakeEngine::new(128),
        ServerSettings { api_keys: vec!["sk-other".into(), "sk-good".into()], ..settings() },
    );
    let models = |key: Option<&str>| {
        let mut r = Request::get("/v1/models");
        if let Some(k) = key {
            r = r.header(header::AUTHORIZATION, format!("Bearer {k}"));
        }
        r.body(Body::empty()).expect("req")
    };
    let (s, v) = send_json(&app, models(None)).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert_error(&v, "AuthenticationError", None, 401);
    assert_eq!(send(&app, models(Some("sk-bad"))).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(send(&app, models(Some("sk-good"))).await.0, StatusCode::OK);
    let (s, _) = send(&app, post("/v1/completions", json!({"prompt": "a"}))).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert_eq!(send(&app, Request::get("/health").body(Body::empty()).expect("req")).await.0, StatusCode::OK);
}

#[tokio::test]
async fn every_listed_route_is_served_with_its_methods() {
    let (app, _) = app();
    for (path, methods) in crate::app::ROUTES {
        for method in methods.split(", ") {
            let req = Request::builder().method(method).uri(*path);
            let req = match method {
                "POST" => req.header(header::CONTENT_TYPE, "application/json").body(Body::from("{}")),
                _ => req.body(Body::empty()),
            };
            let (status, body) = send(&app, req.expect("req")).await;
            assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
            // A path with an `{id}` may answer 404 for that id, but from its own route, not from the fallback.
            let body = String::from_utf8_lossy(&body);
            assert!(status != StatusCode::NOT_FOUND || !body.contains("no route for"), "{method} {path}: {body}");
        }
    }
}

#[tokio::test]
async fn health_and_ping_are_503_once_the_engine_has_stopped() {
    let (app, engine) = app();
    let get = |path: &str| Request::get(path).body(Body::empty()).expect("req");
    for req in [get("/health"), get("/ping"), Request::post("/ping").body(Body::empty()).expect("req")] {
        assert_eq!(send(&app, req).await.0, StatusCode::OK);
    }
    engine.alive.store(false, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(send(&app, get("/health")).await.0, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(send(&app, get("/ping")).await.0, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn full_waiting_queue_is_503_with_retry_after() {
    let engine = FakeEngine::new(128);
    engine.metrics.num_requests_waiting.set(2);
    let (app, _) = app_with(engine, ServerSettings { max_num_waiting: 2, ..settings() });
    let resp = app.clone().oneshot(post("/v1/completions", json!({"prompt": "a"}))).await.expect("infallible");
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(resp.headers().get(header::RETRY_AFTER).and_then(|v| v.to_str().ok()), Some("1"));
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    let v: Value = serde_json::from_slice(&bytes).expect("json");
    assert_error(&v, "ServiceUnavailableError", None, 503);
}

#[tokio::test]
async fn engine_failures_are_500_and_stopped_engine_is_503() {
    let mut engine = FakeEngine::new(128);
    engine.fail_with = Some("kernel exploded".into());
    let (app, _) = app_with(engine, settings());
    let (s, v) = send_json(&app, post("/v1/completions", json!({"prompt": "a"}))).await;
    assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("kernel exploded")));
    let mut engine = FakeEngine::new(128);
    engine.fail_with = Some("stopped".into());
    let (app, _) = app_with(engine, settings());
    let resp = app.clone().oneshot(post("/v1/completions", json!({"prompt": "a"}))).await.expect("infallible");
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    // The supervisor restarts a dead engine's server: the client is told when to come back.
    assert_eq!(resp.headers().get(header::RETRY_AFTER).and_then(|v| v.to_str().ok()), Some("1"));
}

#[tokio::test]
async fn dropping_a_stream_aborts_its_requests() {
    let mut engine = FakeEngine::new(128);
    engine.token_delay = Duration::from_millis(20);
    let (app, engine) = app_with(engine, settings());
    let resp = app
        .clone()
        .oneshot(post("/v1/completions", json!({"prompt": "a", "n": 3, "stream": true})))
        .await
        .expect("infallible");
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body().into_data_stream();
    // Read until some text arrived, then hang up.
    let first = body.next().await.expect("a frame").expect("data");
    assert!(!first.is_empty());
    drop(body);
    for _ in 0..100 {
        if engine.aborted.load(Ordering::SeqCst) == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(engine.aborted.load(Ordering::SeqCst), 3);
    assert_eq!(engine.completed.load(Ordering::SeqCst), 0);
}

/// The router behind the front layers, with the CORS flags `cors` and `--root-path`.
fn front_app(cors: CorsSettings, root_path: Option<&str>) -> Router {
    let (app, _) = app();
    crate::app::front(app, cors.layer().expect("cors"), root_path.map(str::to_owned))
}

fn cors(origins: &[&str], credentials: bool) -> CorsSettings {
    CorsSettings {
        allowed_origins: origins.iter().map(|o| (*o).to_owned()).collect(),
        allowed_methods: vec!["*".into()],
        allowed_headers: vec!["*".into()],
        allow_credentials: credentials,
    }
}

fn preflight(path: &str, origin: &str) -> Request<Body> {
    Request::options(path)
        .header(header::ORIGIN, origin)
        .header(header::ACCESS_CONTROL_REQUEST_METHOD, "POST")
        .header(header::ACCESS_CONTROL_REQUEST_HEADERS, "authorization,content-type")
        .body(Body::empty())
        .expect("req")
}

fn header_of(resp: &axum::response::Response, name: header::HeaderName) -> Option<String> {
    resp.headers().get(name).map(|v| v.to_str().expect("ascii").to_owned())
}

#[tokio::test]
async fn cors_preflight_from_any_origin_with_wildcards() {
    let app = front_app(cors(&["*"], false), None);
    let resp = app.clone().oneshot(preflight("/v1/chat/completions", "http://localhost:3000")).await.expect("ok");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(header_of(&resp, header::ACCESS_CONTROL_ALLOW_ORIGIN).as_deref(), Some("*"));
    let methods = header_of(&resp, header::ACCESS_CONTROL_ALLOW_METHODS).expect("methods");
    assert_eq!(methods, "DELETE,GET,HEAD,OPTIONS,PATCH,POST,PUT,QUERY");
    // "*" headers: the ones the browser asked for (Starlette's answer).
    assert_eq!(header_of(&resp, header::ACCESS_CONTROL_ALLOW_HEADERS).as_deref(), Some("authorization,content-type"));
    assert_eq!(header_of(&resp, header::ACCESS_CONTROL_MAX_AGE).as_deref(), Some("600"));
    assert_eq!(header_of(&resp, header::ACCESS_CONTROL_ALLOW_CREDENTIALS), None);

    // A simple request from a page: the answer carries the header too.
    let req = Request::get("/v1/models").header(header::ORIGIN, "http://localhost:3000").body(Body::empty());
    let resp = app.oneshot(req.expect("req")).await.expect("ok");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(header_of(&resp, header::ACCESS_CONTROL_ALLOW_ORIGIN).as_deref(), Some("*"));
}

#[tokio::test]
async fn cors_preflight_is_not_checked_for_the_api_key() {
    let (app, _) = app_with(
        FakeEngine::new(128),
        ServerSettings { api_keys: vec!["sk-other".into(), "sk-good".into()], ..settings() },
    );
    let app = crate::app::front(app, cors(&["*"], false).layer().expect("cors"), None);
    let resp = app.oneshot(preflight("/v1/completions", "http://a.example")).await.expect("ok");
    assert_eq!(resp.status(), StatusCode::OK);
}

#[tokio::test]
async fn cors_restricted_origins_and_credentials() {
    let app = front_app(cors(&["https://app.example"], true), None);
    let resp = app.clone().oneshot(preflight("/v1/completions", "https://app.example")).await.expect("ok");
    assert_eq!(header_of(&resp, header::ACCESS_CONTROL_ALLOW_ORIGIN).as_deref(), Some("https://app.example"));
    assert_eq!(header_of(&resp, header::ACCESS_CONTROL_ALLOW_CREDENTIALS).as_deref(), Some("true"));
    let resp = app.clone().oneshot(preflight("/v1/completions", "https://evil.example")).await.expect("ok");
    assert_eq!(header_of(&resp, header::ACCESS_CONTROL_ALLOW_ORIGIN), None, "a browser blocks this origin");

    // "*" with credentials echoes the origin: browsers refuse "*" on credentialed requests.
    let app = front_app(cors(&["*"], true), None);
    let resp = app.oneshot(preflight("/v1/completions", "https://b.example")).await.expect("ok");
    assert_eq!(header_of(&resp, header::ACCESS_CONTROL_ALLOW_ORIGIN).as_deref(), Some("https://b.example"));
}

#[tokio::test]
async fn cors_is_off_by_default_like_vllm() {
    let defaults = CorsSettings { allowed_origins: vec![], ..cors(&[], false) };
    let app = front_app(defaults, None);
    let resp = app.clone().oneshot(preflight("/v1/completions", "http://localhost:3000")).await.expect("ok");
    assert_eq!(header_of(&resp, header::ACCESS_CONTROL_ALLOW_ORIGIN), None);
    let req = Request::get("/health").header(header::ORIGIN, "http://localhost:3000").body(Body::empty());
    let resp = app.oneshot(req.expect("req")).await.expect("ok");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(header_of(&resp, header::ACCESS_CONTROL_ALLOW_ORIGIN), None);
}

#[test]
fn cors_flags_that_are_not_header_values_are_start_up_errors() {
    let bad = CorsSettings { allowed_methods: vec!["PO ST".into()], ..cors(&["*"], false) };
    assert!(bad.layer().unwrap_err().to_string().contains("--allowed-methods"));
    let bad = CorsSettings { allowed_headers: vec!["x y".into()], ..cors(&["*"], false) };
    assert!(bad.layer().unwrap_err().to_string().contains("--allowed-headers"));
    let bad = cors(&["http://a\n"], false);
    assert!(bad.layer().unwrap_err().to_string().contains("--allowed-origins"));
}

#[tokio::test]
async fn root_path_is_served_with_and_without_the_prefix() {
    let app = front_app(cors(&[], false), Some("/prefix"));
    for path in ["/prefix/v1/models", "/v1/models", "/prefix/health", "/health"] {
        let (s, _) = send(&app, Request::get(path).body(Body::empty()).expect("req")).await;
        assert_eq!(s, StatusCode::OK, "{path}");
    }
    let (s, v) = send_json(&app, Request::get("/prefixed/v1/models").body(Body::empty()).expect("req")).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "only a whole path segment is the prefix");
    assert_error(&v, "NotFoundError", None, 404);
    // The query string survives.
    let req = Request::get("/prefix/v1/models?x=1").body(Body::empty()).expect("req");
    assert_eq!(send(&app, req).await.0, StatusCode::OK);
}

#[tokio::test]
async fn load_counts_generation_requests_until_their_body_ends() {
    let mut engine = FakeEngine::new(128);
    engine.token_delay = Duration::from_millis(20);
    let (app, _) = app_with(engine, ServerSettings { server_load_tracking: true, ..settings() });
    let load = |app: Router| async move {
        let (s, v) = send_json(&app, Request::get("/load").body(Body::empty()).expect("req")).await;
        assert_eq!(s, StatusCode::OK);
        v
    };
    assert_eq!(load(app.clone()).await, json!({"server_load": 0}));
    let resp =
        app.clone().oneshot(post("/v1/completions", json!({"prompt": "a", "stream": true}))).await.expect("infallible");
    assert_eq!(load(app.clone()).await, json!({"server_load": 1}), "counted while the stream runs");
    let _ = resp.into_body().collect().await.expect("body");
    assert_eq!(load(app.clone()).await, json!({"server_load": 0}));

    // Without --enable-server-load-tracking, vLLM answers 0 whatever runs.
    let (untracked, _) = app_with(FakeEngine::new(128), settings());
    let _resp = untracked.clone().oneshot(post("/v1/completions", json!({"prompt": "a", "stream": true}))).await;
    assert_eq!(load(untracked).await, json!({"server_load": 0}));
}

#[tokio::test]
async fn dev_routes_only_in_dev_mode() {
    let (app, engine) = app_with(FakeEngine::new(128), ServerSettings { dev_mode: None, ..settings() });
    for (path, method) in crate::app::DEV_ROUTES {
        let req = Request::builder().method(*method).uri(*path).body(Body::empty()).expect("req");
        assert_eq!(send(&app, req).await.0, StatusCode::NOT_FOUND, "{path} without VLLM_SERVER_DEV_MODE");
    }
    assert!(engine.prefix_cache_resets.lock().expect("lock").is_empty());

    let info = ServerInfo { config: vec![("model", json!("m")), ("max_model_len", json!(128)), ("x", json!(null))] };
    let (app, engine) = app_with(FakeEngine::new(128), ServerSettings { dev_mode: Some(info), ..settings() });
    let (s, v) = send_json(&app, Request::post("/reset_prefix_cache").body(Body::empty()).expect("req")).await;
    assert_eq!((s, v), (StatusCode::OK, json!({"success": true})));
    let req = Request::post("/reset_prefix_cache?reset_running_requests=true&reset_external=true");
    assert_eq!(send_json(&app, req.body(Body::empty()).expect("req")).await.1, json!({"success": true}));
    let req = Request::post("/reset_prefix_cache?reset_running_requests=maybe").body(Body::empty()).expect("req");
    let (s, v) = send_json(&app, req).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_error(&v, "BadRequestError", Some("reset_running_requests"), 400);
    assert_eq!(*engine.prefix_cache_resets.lock().expect("lock"), vec![false, true]);

    let (s, v) = send_json(&app, Request::get("/server_info").body(Body::empty()).expect("req")).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["vllm_config"], "model='m', max_model_len=128, x=None");
    assert!(v["vllm_env"].is_object() && v["system_env"].is_object(), "{v}");
    let req = Request::get("/server_info?config_format=json").body(Body::empty()).expect("req");
    let (_, v) = send_json(&app, req).await;
    assert_eq!(v["vllm_config"], json!({"model": "m", "max_model_len": 128, "x": null}));

    engine.alive.store(false, Ordering::Relaxed);
    let (s, _) = send_json(&app, Request::post("/reset_prefix_cache").body(Body::empty()).expect("req")).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn default_chat_template_kwargs_sit_under_the_requests_own() {
    let defaults = serde_json::from_value(json!({"enable_thinking": false, "style": "terse"})).expect("object");
    let (app, engine) =
        app_with(FakeEngine::new(256), ServerSettings { default_chat_template_kwargs: defaults, ..settings() });
    use crate::port::Engine;
    let prompt = |engine: &FakeEngine| {
        let ids = engine.submitted().last().expect("submitted").prompt_token_ids.clone();
        engine.decode(&ids, false).expect("decodes")
    };
    let (s, _) =
        send_json(&app, post("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "hi"}]}))).await;
    assert_eq!(s, StatusCode::OK);
    assert!(
        prompt(&engine).contains("enable_thinking=false") && prompt(&engine).contains("style=\"terse\""),
        "{}",
        prompt(&engine)
    );
    let body =
        json!({"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"enable_thinking": true}});
    let (s, _) = send_json(&app, post("/v1/chat/completions", body)).await;
    assert_eq!(s, StatusCode::OK);
    assert!(
        prompt(&engine).contains("enable_thinking=true") && prompt(&engine).contains("style="),
        "{}",
        prompt(&engine)
    );
}

/// `--max-num-queued-reqs`: requests in flight (waiting or running, as the server counts them) are bounded.
#[tokio::test]
async fn max_num_queued_reqs_bounds_requests_in_flight() {
    let mut engine = FakeEngine::new(128);
    engine.token_delay = Duration::from_millis(200);
    let (app, _) = app_with(engine, ServerSettings { max_num_queued_reqs: Some(1), ..settings() });
    let body = json!({"prompt": "a", "max_tokens": 3, "stream": true});
    let first = app.clone().oneshot(post("/v1/completions", body.clone())).await.expect("infallible");
    assert_eq!(first.status(), StatusCode::OK);
    let resp = app.clone().oneshot(post("/v1/completions", body)).await.expect("infallible");
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(resp.headers().get(header::RETRY_AFTER).and_then(|v| v.to_str().ok()), Some("1"));
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    let v: Value = serde_json::from_slice(&bytes).expect("json");
    assert_error(&v, "ServiceUnavailableError", None, 503);
    drop(first);
}

/// `--enable-request-id-headers`: the request's `X-Request-Id` comes back, else a fresh 32-hex-digit one; off, none.
#[tokio::test]
async fn request_id_headers() {
    let (app, _) = app_with(FakeEngine::new(128), ServerSettings { request_id_headers: true, ..settings() });
    let mut req = Request::get("/health").body(Body::empty()).expect("request");
    req.headers_mut().insert("x-request-id", "abc-1".parse().expect("header"));
    let resp = app.clone().oneshot(req).await.expect("infallible");
    assert_eq!(resp.headers().get("x-request-id").and_then(|v| v.to_str().ok()), Some("abc-1"));
    let resp =
        app.clone().oneshot(Request::get("/v1/nope").body(Body::empty()).expect("request")).await.expect("infallible");
    let id = resp.headers().get("x-request-id").and_then(|v| v.to_str().ok()).expect("an id").to_owned();
    assert!(id.len() == 32 && id.chars().all(|c| c.is_ascii_hexdigit()), "{id}");
    let (plain, _) = app_with(FakeEngine::new(128), settings());
    let resp = plain.oneshot(Request::get("/health").body(Body::empty()).expect("request")).await.expect("infallible");
    assert!(resp.headers().get("x-request-id").is_none());
}

#[tokio::test]
async fn responses_create_retrieve_continue_cancel_and_stream() {
    let (app, engine) = app();
    let (s, v) = send_json(&app, post("/v1/responses", json!({"input": "hi", "max_output_tokens": 5}))).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["object"], "response");
    assert_eq!(v["status"], "incomplete");
    assert_eq!(v["output"][0]["content"][0]["text"], &REPLY[..5]);
    assert_eq!(v["usage"]["output_tokens"], 5);
    let id = v["id"].as_str().expect("id").to_owned();

    let (s, got) = send_json(&app, Request::get(format!("/v1/responses/{id}")).body(Body::empty()).expect("req")).await;
    assert_eq!((s, &got), (StatusCode::OK, &v));

    let follow = json!({"input": "again", "previous_response_id": id, "max_output_tokens": 2});
    let (s, v2) = send_json(&app, post("/v1/responses", follow)).await;
    assert_eq!(s, StatusCode::OK, "{v2}");
    assert_eq!(v2["previous_response_id"], id.as_str());
    let prompts = engine.submitted();
    let (first, second) = (&prompts[0].prompt_token_ids, &prompts[1].prompt_token_ids);
    assert!(second.len() > first.len(), "the follow-up's prompt holds the first turn and its answer");

    let (s, e) = send_json(&app, Request::get("/v1/responses/resp_nope").body(Body::empty()).expect("req")).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_error(&e, "NotFoundError", Some("response_id"), 404);
    let (s, e) =
        send_json(&app, post("/v1/responses", json!({"input": "x", "previous_response_id": "resp_nope"}))).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_error(&e, "NotFoundError", Some("previous_response_id"), 404);
    let (s, e) = send_json(&app, post(&format!("/v1/responses/{id}/cancel"), json!({}))).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(e["error"]["message"], "Cannot cancel a synchronous response.");

    let (s, e) = send_json(&app, post("/v1/responses", json!({"input": "x", "background": true}))).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_error(&e, "BadRequestError", Some("background"), 400);

    let (s, bytes) = send(&app, post("/v1/responses", json!({"input": "hi", "stream": true, "store": false}))).await;
    assert_eq!(s, StatusCode::OK);
    let text = String::from_utf8_lossy(&bytes);
    let names: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("event: ")).collect();
    assert_eq!(names.first(), Some(&"response.created"));
    assert_eq!(names.last(), Some(&"response.completed"));
    assert!(!text.contains("[DONE]"), "a Responses stream ends with response.completed");
    let done: Value = serde_json::from_str(sse_data(&bytes).last().expect("data")).expect("json");
    let rid = done["response"]["id"].as_str().expect("id");
    let req = Request::get(format!("/v1/responses/{rid}")).body(Body::empty()).expect("req");
    assert_eq!(send(&app, req).await.0, StatusCode::NOT_FOUND, "store: false keeps nothing");
}
