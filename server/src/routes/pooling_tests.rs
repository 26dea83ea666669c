//! Route tests of the pooling APIs over the whole router with the fake engine in pooling mode: the shapes of
//! `/v1/embeddings` (text, token ids, chat form, base64, dimensions, truncation), `/pooling`, `/classify`, `/score`
//! (1:1, 1:N, N:N, by cosine and by cross-encoder), `/rerank` (order, `top_n`, `return_documents`), the 400s, and
//! the generation routes refused on a pooling model.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use base64::Engine as _;
use http_body_util::BodyExt;
use rserve_engine::api::{PoolingInfo, PoolingTask};
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::app::{router, AccessLog};
use crate::state::{AppState, ServerSettings};
use crate::testing::{self, FakeEngine};

fn settings() -> ServerSettings {
    ServerSettings {
        tools: Default::default(),
        reasoning: None,
        served_model_names: vec!["emb".into()],
        api_keys: Vec::new(),
        default_chat_template_kwargs: Default::default(),
        max_num_waiting: 100,
        max_num_queued_reqs: None,
        access_log_skip: Vec::new(),
        request_id_headers: false,
        log_requests: false,
        server_load_tracking: false,
        dev_mode: None,
    }
}

fn app_for(engine: FakeEngine) -> (Router, Arc<FakeEngine>) {
    let engine = Arc::new(engine);
    (router(AppState::new(engine.clone(), settings()), AccessLog(false)), engine)
}

fn embedder() -> (Router, Arc<FakeEngine>) {
    app_for(FakeEngine::pooling(64, testing::embedder(8, Some(Vec::new()))))
}

fn reranker() -> (Router, Arc<FakeEngine>) {
    app_for(FakeEngine::pooling(64, testing::classifier(&["relevant"])))
}

async fn post(app: &Router, path: &str, body: Value) -> (StatusCode, Value) {
    let req = Request::post(path)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .expect("request");
    let resp = app.clone().oneshot(req).await.expect("infallible");
    let status = resp.status();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (status, serde_json::from_slice(&bytes).expect("json body"))
}

/// A 400 naming `param`, with a message containing `says`.
fn assert_400(status: StatusCode, v: &Value, param: &str, says: &str) {
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["param"], param, "{v}");
    assert_eq!(v["error"]["code"], 400, "{v}");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(says), "{message:?} should say {says:?}");
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array().expect("array").iter().map(|x| x.as_f64().expect("number") as f32).collect()
}

#[tokio::test]
async fn embeddings_have_openais_shape() {
    let (app, engine) = embedder();
    let (s, v) = post(&app, "/v1/embeddings", json!({"model": "emb", "input": ["ab", "abc"]})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["object"], "list");
    assert_eq!(v["model"], "emb");
    assert!(v["id"].as_str().is_some_and(|id| id.starts_with("embd-")), "{v}");
    assert!(v["created"].is_u64());
    let data = v["data"].as_array().expect("data");
    assert_eq!(data.len(), 2);
    for (i, d) in data.iter().enumerate() {
        assert_eq!(d["object"], "embedding");
        assert_eq!(d["index"], i);
        let e = floats(&d["embedding"]);
        assert_eq!(e.len(), 8);
        let norm: f32 = e.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "normalised by default: {norm}");
    }
    // <s> + 2 bytes, <s> + 3 bytes.
    assert_eq!(v["usage"]["prompt_tokens"], 7);
    assert_eq!(v["usage"]["total_tokens"], 7);
    let submitted = engine.submitted();
    assert_eq!(submitted.len(), 2, "one engine request per input, all submitted together");
    let p = submitted[0].pooling.as_ref().expect("a pooling request");
    assert_eq!(p.task, PoolingTask::Embed);
    assert_eq!(submitted[0].stop.max_tokens, 1);
}

#[tokio::test]
async fn embeddings_take_every_input_form() {
    let (app, engine) = embedder();
    let (s, v) = post(&app, "/v1/embeddings", json!({"input": "hi"})).await;
    assert_eq!((s, v["data"].as_array().map(Vec::len)), (StatusCode::OK, Some(1)), "{v}");
    let (s, v) = post(&app, "/v1/embeddings", json!({"input": [5, 6, 7]})).await;
    assert_eq!((s, v["usage"]["prompt_tokens"].as_u64()), (StatusCode::OK, Some(3)), "{v}");
    let (s, v) = post(&app, "/v1/embeddings", json!({"input": [[5, 6], [7]]})).await;
    assert_eq!((s, v["data"].as_array().map(Vec::len)), (StatusCode::OK, Some(2)), "{v}");
    let (s, v) = post(&app, "/v1/embeddings", json!({"input": "hi", "add_special_tokens": false})).await;
    assert_eq!((s, v["usage"]["prompt_tokens"].as_u64()), (StatusCode::OK, Some(2)), "{v}");
    // The chat form: the template's text, no special tokens added on top by default.
    let (s, v) = post(&app, "/v1/embeddings", json!({"messages": [{"role": "user", "content": "hi"}]})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let last = engine.submitted().pop().expect("submitted");
    let text = "<s>user: hi\n";
    assert_eq!(last.prompt_token_ids.len(), text.len(), "the fake encodes each byte as one id, plus none added");
}

#[tokio::test]
async fn embeddings_in_base64_decode_to_the_float_vectors() {
    let (app, _) = embedder();
    let (_, plain) = post(&app, "/v1/embeddings", json!({"input": "hello"})).await;
    let (s, v) = post(&app, "/v1/embeddings", json!({"input": "hello", "encoding_format": "base64"})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let b64 = v["data"][0]["embedding"].as_str().expect("a base64 string");
    let bytes = base64::engine::general_purpose::STANDARD.decode(b64).expect("base64");
    let decoded: Vec<f32> = bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    assert_eq!(decoded, floats(&plain["data"][0]["embedding"]));
}

#[tokio::test]
async fn embeddings_dimensions_normalize_and_truncation_reach_the_engine() {
    let (app, engine) = embedder();
    let body = json!({"input": "hello", "dimensions": 3, "normalize": false, "truncate_prompt_tokens": 2});
    let (s, v) = post(&app, "/v1/embeddings", body).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(floats(&v["data"][0]["embedding"]).len(), 3);
    assert_eq!(v["usage"]["prompt_tokens"], 2, "the last 2 tokens are kept");
    let r = engine.submitted().pop().expect("submitted");
    assert_eq!(r.prompt_token_ids, testing::ids(&[b'l' as u32 + 3, b'o' as u32 + 3]), "vLLM keeps the last tokens");
    let p = r.pooling.expect("pooling");
    assert_eq!((p.dimensions, p.normalize), (Some(3), Some(false)));
    let (s, v) = post(&app, "/v1/embeddings", json!({"input": "x", "truncate_prompt_tokens": -1})).await;
    assert_eq!(s, StatusCode::OK, "-1 means the context length: {v}");
}

#[tokio::test]
async fn embeddings_refusals_name_the_field() {
    let (app, _) = embedder();
    let (s, v) = post(&app, "/v1/embeddings", json!({"input": []})).await;
    assert_400(s, &v, "input", "must not be empty");
    let (s, v) = post(&app, "/v1/embeddings", json!({"input": [[]]})).await;
    assert_400(s, &v, "input", "must not be empty");
    let (s, v) = post(&app, "/v1/embeddings", json!({})).await;
    assert_400(s, &v, "input", "input or messages");
    let (s, v) = post(&app, "/v1/embeddings", json!({"input": "x", "encoding_format": "bytes"})).await;
    assert_400(s, &v, "encoding_format", "base64");
    let (s, v) = post(&app, "/v1/embeddings", json!({"input": "x", "dimensions": 9})).await;
    assert_400(s, &v, "dimensions", "between 1 and 8");
    let (s, v) = post(&app, "/v1/embeddings", json!({"input": "x".repeat(64)})).await;
    assert_400(s, &v, "input", "maximum context length is 64");
    let (s, v) = post(&app, "/v1/embeddings", json!({"input": "x", "truncate_prompt_tokens": 65})).await;
    assert_400(s, &v, "truncate_prompt_tokens", "greater than max_model_len");
    let (s, v) = post(&app, "/v1/embeddings", json!({"input": [9999]})).await;
    assert_400(s, &v, "input", "token ids");
    let (app, _) = app_for(FakeEngine::pooling(64, testing::embedder(8, None)));
    let (s, v) = post(&app, "/v1/embeddings", json!({"input": "x", "dimensions": 4})).await;
    assert_400(s, &v, "dimensions", "does not support matryoshka");
}

#[tokio::test]
async fn a_bidirectional_input_must_fit_one_step() {
    let mut engine = FakeEngine::pooling(64, testing::embedder(8, None));
    engine.info.max_num_batched_tokens = 10;
    let (app, _) = app_for(engine);
    let (s, v) = post(&app, "/v1/embeddings", json!({"input": "x".repeat(20)})).await;
    assert_400(s, &v, "input", "--max-num-batched-tokens");
    let (s, v) = post(&app, "/v1/embeddings", json!({"input": "x".repeat(20), "truncate_prompt_tokens": 10})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
}

#[tokio::test]
async fn an_engine_failure_fails_the_request() {
    let mut engine = FakeEngine::pooling(64, testing::embedder(8, None));
    engine.fail_with = Some("device lost".into());
    let (app, _) = app_for(engine);
    let (s, v) = post(&app, "/v1/embeddings", json!({"input": ["a", "b"]})).await;
    assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR, "{v}");
    assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("device lost")), "{v}");
}

#[tokio::test]
async fn pooling_answers_the_raw_vectors() {
    let (app, _) = embedder();
    let (s, v) = post(&app, "/pooling", json!({"input": ["a", "b"]})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert!(v["id"].as_str().is_some_and(|id| id.starts_with("pool-")), "{v}");
    assert_eq!(v["data"][1]["object"], "pooling");
    assert_eq!(v["data"][1]["index"], 1);
    assert_eq!(floats(&v["data"][1]["data"]).len(), 8);
    let (s, v) = post(&app, "/pooling", json!({"input": "a", "task": "classify"})).await;
    assert_400(s, &v, "model", "does not support Pooling API");
    let (s, v) = post(&app, "/pooling", json!({"input": "a", "task": "reward"})).await;
    assert_400(s, &v, "task", "embed");
}

fn classifier_app() -> (Router, Arc<FakeEngine>) {
    app_for(FakeEngine::pooling(64, testing::classifier(&["neg", "pos", "neutral"])))
}

#[tokio::test]
async fn classify_names_the_best_label() {
    let (app, engine) = classifier_app();
    // Ids are byte + 3; `<s>` is 0. "a" = 100 (% 3 = 1: pos), "cc" = 102 twice (% 3 = 0: neg).
    let (s, v) = post(&app, "/classify", json!({"input": ["aaa", "cccc"], "model": "emb"})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert!(v["id"].as_str().is_some_and(|id| id.starts_with("classify-")), "{v}");
    assert_eq!(v["data"][0]["label"], "pos");
    assert_eq!(v["data"][1]["label"], "neg");
    assert_eq!(v["data"][0]["num_classes"], 3);
    let probs = floats(&v["data"][0]["probs"]);
    assert!((probs.iter().sum::<f32>() - 1.0).abs() < 1e-5, "softmax by default: {probs:?}");
    let (s, v) = post(&app, "/classify", json!({"input": "aaa", "use_activation": false})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(floats(&v["data"][0]["probs"]), vec![1.0, 3.0, 0.0], "raw logits");
    assert!(!engine.submitted().last().and_then(|r| r.pooling.as_ref()).expect("pooling").activation);
    // The pooling route on a classifier pools its scores.
    let (s, v) = post(&app, "/pooling", json!({"input": "aaa"})).await;
    assert_eq!((s, floats(&v["data"][0]["data"]).len()), (StatusCode::OK, 3), "{v}");
    let (s, v) = post(&app, "/pooling", json!({"input": "aaa", "dimensions": 2})).await;
    assert_400(s, &v, "dimensions", "embeddings only");
}

#[tokio::test]
async fn the_wrong_task_is_refused_as_vllm_refuses_it() {
    let (app, _) = classifier_app();
    let (s, v) = post(&app, "/v1/embeddings", json!({"input": "a"})).await;
    assert_400(s, &v, "model", "The model does not support Embeddings API");
    let (app, _) = embedder();
    let (s, v) = post(&app, "/classify", json!({"input": "a"})).await;
    assert_400(s, &v, "model", "The model does not support Classification API");
}

#[tokio::test]
async fn pooling_routes_on_a_generative_model_are_refused() {
    let (app, _) = app_for(FakeEngine::new(64));
    let cases = [
        ("/v1/embeddings", json!({"input": "a"}), "Embeddings"),
        ("/pooling", json!({"input": "a"}), "Pooling"),
        ("/classify", json!({"input": "a"}), "Classification"),
        ("/score", json!({"text_1": "a", "text_2": "b"}), "Score"),
        ("/v1/score", json!({"text_1": "a", "text_2": "b"}), "Score"),
        ("/rerank", json!({"query": "a", "documents": ["b"]}), "Rerank (Score)"),
        ("/v1/rerank", json!({"query": "a", "documents": ["b"]}), "Rerank (Score)"),
        ("/v2/rerank", json!({"query": "a", "documents": ["b"]}), "Rerank (Score)"),
    ];
    for (path, body, api) in cases {
        let (s, v) = post(&app, path, body).await;
        assert_400(s, &v, "model", &format!("The model does not support {api} API"));
    }
}

#[tokio::test]
async fn generation_routes_on_a_pooling_model_are_refused() {
    let (app, engine) = embedder();
    let cases = [
        ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "hi"}]}), "Chat Completions"),
        ("/v1/completions", json!({"prompt": "hi"}), "Completions"),
        ("/v1/responses", json!({"input": "hi"}), "Responses"),
    ];
    for (path, body, api) in cases {
        let (s, v) = post(&app, path, body).await;
        assert_400(s, &v, "model", &format!("The model does not support {api} API"));
    }
    assert!(engine.submitted().is_empty());
}

#[tokio::test]
async fn score_by_cosine_pairs_one_to_one_one_to_n_and_n_to_n() {
    let (app, engine) = embedder();
    let (s, v) = post(&app, "/score", json!({"text_1": "abc", "text_2": "abc"})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert!(v["id"].as_str().is_some_and(|id| id.starts_with("score-")), "{v}");
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["object"], "score");
    assert!((v["data"][0]["score"].as_f64().expect("score") - 1.0).abs() < 1e-5, "equal texts: {v}");
    assert_eq!(v["usage"]["prompt_tokens"], 8);
    let before = engine.submitted().len();
    let (s, v) = post(&app, "/v1/score", json!({"text_1": "abc", "text_2": ["abc", "xyz", "ab"]})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let scores: Vec<f64> =
        v["data"].as_array().expect("data").iter().map(|d| d["score"].as_f64().expect("f")).collect();
    assert_eq!(scores.len(), 3);
    assert!(scores[0] > scores[2] && scores[2] > scores[1], "{scores:?}");
    assert_eq!(engine.submitted().len() - before, 4, "1:N embeds the query once");
    let (s, v) = post(&app, "/score", json!({"queries": ["a", "b"], "documents": ["a", "c"]})).await;
    assert_eq!((s, v["data"].as_array().map(Vec::len)), (StatusCode::OK, Some(2)), "{v}");
    let (s, v) = post(&app, "/score", json!({"text_1": ["a", "b"], "text_2": ["a", "b", "c"]})).await;
    assert_400(s, &v, "text_2", "1:1, 1:N or N:N");
    let (s, v) = post(&app, "/score", json!({"text_1": "a", "text_2": []})).await;
    assert_400(s, &v, "text_2", "must not be empty");
    let (s, v) = post(&app, "/score", json!({"text_1": "a"})).await;
    assert_400(s, &v, "text_1", "required");
}

#[tokio::test]
async fn score_by_cross_encoder_sends_each_pair_with_its_segments() {
    let (app, engine) = reranker();
    let (s, v) = post(&app, "/score", json!({"text_1": "ab", "text_2": ["ab", "xy"]})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let scores: Vec<f64> =
        v["data"].as_array().expect("data").iter().map(|d| d["score"].as_f64().expect("f")).collect();
    assert!(scores[0] > 0.5 && scores[1] < 0.5, "sigmoid scores: {scores:?}");
    let submitted = engine.submitted();
    assert_eq!(submitted.len(), 2, "one request per pair");
    let p = submitted[0].pooling.as_ref().expect("pooling");
    assert_eq!(p.task, PoolingTask::Classify);
    assert_eq!(p.token_type_ids.as_deref(), Some(&[0, 0, 0, 1, 1][..]), "<s> a b | a b");
    assert_eq!(v["usage"]["prompt_tokens"], 10);
    let (s, v) = post(&app, "/score", json!({"text_1": "ab", "text_2": "xy", "use_activation": false})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["data"][0]["score"], -2.0, "the raw logit");
    let (s, v) = post(&app, "/score", json!({"text_1": "ab", "text_2": "abcd", "truncate_prompt_tokens": 3})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let last = engine.submitted().pop().expect("submitted");
    assert_eq!(last.prompt_token_ids.len(), 3);
    assert_eq!(last.pooling.and_then(|p| p.token_type_ids), Some(vec![1, 1, 1]), "segments cut with the ids");
}

#[tokio::test]
async fn rerank_orders_by_score_with_top_n_and_documents() {
    let (app, _) = reranker();
    let docs = json!(["xyz", "abc", "abz"]);
    for path in ["/rerank", "/v1/rerank", "/v2/rerank"] {
        let (s, v) = post(&app, path, json!({"query": "abc", "documents": docs})).await;
        assert_eq!(s, StatusCode::OK, "{path}: {v}");
        assert!(v["id"].as_str().is_some_and(|id| id.starts_with("rerank-")), "{v}");
        assert_eq!(v["model"], "emb");
        let results = v["results"].as_array().expect("results");
        let order: Vec<u64> = results.iter().map(|r| r["index"].as_u64().expect("index")).collect();
        assert_eq!(order, vec![1, 2, 0], "{path}: {v}");
        assert_eq!(results[0]["document"]["text"], "abc");
        let scores: Vec<f64> = results.iter().map(|r| r["relevance_score"].as_f64().expect("score")).collect();
        assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
        assert_eq!(v["usage"]["total_tokens"], 3 * 7);
        assert_eq!(v["usage"]["prompt_tokens"], 3 * 7);
    }
    let (s, v) =
        post(&app, "/rerank", json!({"query": "abc", "documents": docs, "top_n": 2, "return_documents": false})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let results = v["results"].as_array().expect("results");
    assert_eq!(results.len(), 2);
    assert!(results.iter().all(|r| r.get("document").is_none()), "{v}");
    let (s, v) = post(&app, "/rerank", json!({"query": "abc", "documents": docs, "top_n": 0})).await;
    assert_eq!((s, v["results"].as_array().map(Vec::len)), (StatusCode::OK, Some(3)), "0 means all: {v}");
    let (s, v) = post(&app, "/rerank", json!({"query": "abc", "documents": []})).await;
    assert_400(s, &v, "documents", "must not be empty");
    let (s, v) = post(&app, "/rerank", json!({"query": "abc", "documents": docs, "top_n": -1})).await;
    assert_400(s, &v, "top_n", "at least 0");
}

#[tokio::test]
async fn rerank_on_an_embedding_model_uses_cosine_similarity() {
    let (app, _) = embedder();
    let (s, v) = post(&app, "/rerank", json!({"query": "abc", "documents": ["zzz", "abc"]})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["results"][0]["index"], 1, "{v}");
    assert!((v["results"][0]["relevance_score"].as_f64().expect("score") - 1.0).abs() < 1e-5);
}

#[tokio::test]
async fn a_classifier_that_is_no_cross_encoder_cannot_score() {
    let info = PoolingInfo { cross_encoder: false, ..testing::classifier(&["neg", "pos"]) };
    let (app, _) = app_for(FakeEngine::pooling(64, info));
    let (s, v) = post(&app, "/score", json!({"text_1": "a", "text_2": "b"})).await;
    assert_400(s, &v, "model", "does not support Score API");
}

#[tokio::test]
async fn a_client_gone_aborts_every_input() {
    let mut engine = FakeEngine::pooling(64, testing::embedder(8, None));
    engine.token_delay = std::time::Duration::from_millis(200);
    let (app, engine) = app_for(engine);
    let task = tokio::spawn(async move { post(&app, "/v1/embeddings", json!({"input": ["a", "b"]})).await });
    for _ in 0..100 {
        if engine.submitted().len() == 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(engine.submitted().len(), 2, "both inputs are submitted before any result");
    // The handler's future is dropped, as when the client hangs up.
    task.abort();
    for _ in 0..100 {
        if engine.aborted.load(std::sync::atomic::Ordering::SeqCst) == 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(engine.aborted.load(std::sync::atomic::Ordering::SeqCst), 2);
    assert_eq!(engine.completed.load(std::sync::atomic::Ordering::SeqCst), 0);
}
