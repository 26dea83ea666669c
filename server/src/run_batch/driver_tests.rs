//! The driver over the whole router with the fake engine (no model): one output line per input line, a 200 line's
//! body equal to the route's HTTP answer, error lines for refused bodies and broken lines, many requests in flight
//! at once, and a stopped engine ending the run without writing the lines it could not answer.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tower::ServiceExt;

use super::*;
use crate::app::{router, AccessLog};
use crate::state::AppState;
use crate::testing::FakeEngine;

fn app(engine: FakeEngine) -> (Router, Arc<FakeEngine>) {
    let engine = Arc::new(engine);
    let state = AppState::new(engine.clone(), super::super::settings(vec!["smol".into()]));
    (router(state, AccessLog(false)), engine)
}

fn line(custom_id: &str, url: &str, body: Value) -> Vec<u8> {
    json!({"custom_id": custom_id, "method": "POST", "url": url, "body": body}).to_string().into_bytes()
}

/// Runs `lines` through the driver into a fresh file; returns the result and the output's lines.
async fn run_lines(router: Router, lines: Vec<Vec<u8>>, done: Done) -> (Result<Summary, RunBatchError>, Vec<Value>) {
    let path =
        std::env::temp_dir().join(format!("rserve-driver-{}-{}.jsonl", std::process::id(), rand::random::<u64>()));
    let out = File::create(&path).expect("output");
    let (tx, rx) = mpsc::channel(4);
    let feeder = tokio::spawn(async move {
        for l in lines {
            let _ = tx.send(Item::Line(super::super::line::parse(&l))).await;
        }
    });
    let progress = Progress::new(None, Box::new(|| 0));
    let result = run(router, rx, done, out, progress, 3).await;
    feeder.await.expect("feeder");
    let text = std::fs::read_to_string(&path).expect("read");
    let _ = std::fs::remove_file(&path);
    assert!(text.is_empty() || text.ends_with('\n'));
    (result, text.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect())
}

async fn http_answer(router: &Router, url: &str, body: &Value) -> Value {
    let req = Request::post(url).header(header::CONTENT_TYPE, "application/json").body(Body::from(body.to_string()));
    let resp = router.clone().oneshot(req.expect("request")).await.expect("infallible");
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.expect("body");
    serde_json::from_slice(&bytes).expect("json")
}

fn without_ids(mut v: Value) -> Value {
    if let Some(o) = v.as_object_mut() {
        o.remove("id");
        o.remove("created");
    }
    v
}

#[tokio::test]
async fn every_line_is_answered_as_the_route_answers() {
    let (router, engine) = app(FakeEngine::new(128));
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5});
    let cmpl = json!({"model": "smol", "prompt": "hello", "max_tokens": 3});
    let mut lines = vec![
        line("c", "/v1/chat/completions", chat.clone()),
        line("p", "/v1/completions", cmpl.clone()),
        line("t", "/v1/completions", json!({"prompt": "x", "temperature": 9})),
        line("m", "/v1/completions", json!({"model": "other", "prompt": "x"})),
        b"{oops".to_vec(),
        line("u", "/v1/embeddings", json!({"input": "x"})),
    ];
    lines.extend((0..20).map(|i| line(&format!("n{i}"), "/v1/completions", cmpl.clone())));
    let (result, out) = run_lines(router.clone(), lines, Done::default()).await;
    let summary = result.expect("the batch runs");
    assert_eq!(summary, Summary { written: 26, errors: 4, skipped: 0 });
    assert_eq!(out.len(), 26);
    assert_eq!(engine.submitted().len(), 22, "refused lines never reach the engine");
    let by_id = |id: &str| out.iter().find(|o| o["custom_id"] == id).cloned().expect(id);
    let c = by_id("c");
    assert_eq!(c["response"]["status_code"], 200);
    assert_eq!(
        without_ids(c["response"]["body"].clone()),
        without_ids(http_answer(&router, "/v1/chat/completions", &chat).await)
    );
    assert_eq!(
        without_ids(by_id("p")["response"]["body"].clone()),
        without_ids(http_answer(&router, "/v1/completions", &cmpl).await)
    );
    let t = by_id("t");
    assert_eq!(t["response"]["status_code"], 400);
    assert!(t["response"]["body"].is_null());
    assert_eq!(t["error"]["error"]["param"], "temperature");
    assert_eq!(by_id("m")["response"]["status_code"], 404);
    assert_eq!(by_id("u")["error"]["error"]["param"], "url");
    assert_eq!(out.iter().filter(|o| o["custom_id"].is_null()).count(), 1);
}

#[tokio::test]
async fn answered_lines_are_skipped() {
    let (router, engine) = app(FakeEngine::new(128));
    let body = json!({"prompt": "x", "max_tokens": 2});
    let lines = vec![line("a", "/v1/completions", body.clone()), b"[1]".to_vec(), line("b", "/v1/completions", body)];
    let done = Done::from_output(b"{\"custom_id\":\"a\"}\n{\"custom_id\":null}\n");
    let (result, out) = run_lines(router, lines, done).await;
    assert_eq!(result.expect("runs"), Summary { written: 1, errors: 0, skipped: 2 });
    assert_eq!(out.len(), 1);
    assert_eq!(out[0]["custom_id"], "b");
    assert_eq!(engine.submitted().len(), 1);
}

#[tokio::test]
async fn a_stopped_engine_ends_the_run_and_leaves_its_lines_unwritten() {
    let (router, _) = app(FakeEngine { fail_with: Some("stopped".into()), ..FakeEngine::new(128) });
    let lines = vec![b"not json".to_vec(), line("a", "/v1/completions", json!({"prompt": "x"}))];
    let (result, out) = tokio::time::timeout(Duration::from_secs(10), run_lines(router, lines, Done::default()))
        .await
        .expect("the run ends");
    assert!(matches!(result, Err(RunBatchError::EngineStopped(_))), "{result:?}");
    assert_eq!(out.len(), 1, "only the broken line was answered: {out:?}");
    assert!(out[0]["custom_id"].is_null());
}
