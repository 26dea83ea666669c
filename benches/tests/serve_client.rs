//! The `bench serve` HTTP client against a scripted server on a local socket: a stream whose chunks arrive at known
//! times must give the TTFT, ITLs, text and usage counts the script implies; HTTP errors and in-stream errors must
//! become failed outcomes, not panics; `/v1/models` and `/detokenize` answers in vLLM's and llama.cpp's shapes.

use std::time::{Duration, Instant};

use rserve_benches::serve::client::{ApiKind, Client, RequestSettings, RequestSpec};
use rserve_benches::serve::metrics::RequestOutcome;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// One scripted HTTP response: a status line + headers, then body parts sent after the given delays.
struct Script {
    head: String,
    parts: Vec<(u64, String)>,
}

/// Serves each script to one connection, in order; returns the base URL.
async fn serve(scripts: Vec<Script>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        for s in scripts {
            let (mut sock, _) = listener.accept().await.expect("accept");
            // Read the request head and body (Content-Length) before answering.
            let mut buf = Vec::new();
            let mut tmp = [0u8; 4096];
            loop {
                let n = sock.read(&mut tmp).await.expect("read");
                buf.extend_from_slice(&tmp[..n]);
                let text = String::from_utf8_lossy(&buf).to_string();
                if let Some(end) = text.find("\r\n\r\n") {
                    let len = text[..end]
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                        })
                        .unwrap_or(0);
                    if buf.len() >= end + 4 + len || n == 0 {
                        break;
                    }
                }
            }
            sock.write_all(s.head.as_bytes()).await.expect("write");
            for (delay, part) in s.parts {
                tokio::time::sleep(Duration::from_millis(delay)).await;
                sock.write_all(part.as_bytes()).await.expect("write");
                sock.flush().await.expect("flush");
            }
            sock.shutdown().await.ok();
        }
    });
    format!("http://{addr}")
}

fn sse_head() -> String {
    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n".into()
}

fn settings(base: &str, api: ApiKind) -> RequestSettings {
    let path = if api == ApiKind::Chat { "/v1/chat/completions" } else { "/v1/completions" };
    RequestSettings { api, api_url: format!("{base}{path}"), ignore_eos: true, ..Default::default() }
}

fn spec() -> RequestSpec {
    RequestSpec { prompt: "hi".into(), prompt_len: 2, max_tokens: 3, model: "m".into(), request_id: None }
}

/// One server-sent event: `data: {payload}` and a blank line.
fn data(payload: &str) -> String {
    format!("data: {payload}\n\n")
}

/// Sends one streaming request of `api` to a server that answers it with an event stream of `parts`; checks that it
/// succeeded.
async fn stream_ok(api: ApiKind, parts: Vec<(u64, String)>) -> RequestOutcome {
    let base = serve(vec![Script { head: sse_head(), parts }]).await;
    let client = Client::new(&base, Duration::from_secs(10)).expect("client");
    let out = client.stream_request(&settings(&base, api), &spec(), Instant::now()).await;
    assert!(out.success, "{}", out.error);
    out
}

#[tokio::test]
async fn a_timed_stream_gives_ttft_itl_text_and_usage() {
    let chunk = |t: &str| data(&format!(r#"{{"choices":[{{"index":0,"text":"{t}","finish_reason":null}}]}}"#));
    let parts = vec![
        (150, chunk("Hel")),
        (100, chunk("lo")),
        (200, chunk("!")),
        (0, data(r#"{"choices":[{"index":0,"text":"","finish_reason":"length"}]}"#)),
        (0, data(r#"{"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":3}}"#)),
        (0, data("[DONE]")),
    ];
    let out = stream_ok(ApiKind::Completions, parts).await;
    assert_eq!(out.generated_text, "Hello!");
    assert_eq!(out.num_chunks, 3);
    assert_eq!((out.usage_prompt_tokens, out.usage_completion_tokens), (Some(2), Some(3)));
    assert!(out.ttft >= 0.14 && out.ttft < 0.5, "ttft {}", out.ttft);
    assert_eq!(out.itl.len(), 2);
    assert!(out.itl[0] >= 0.09 && out.itl[0] < 0.3, "itl {:?}", out.itl);
    assert!(out.itl[1] >= 0.19 && out.itl[1] < 0.4, "itl {:?}", out.itl);
    assert!(out.latency >= out.ttft + out.itl[0] + out.itl[1] - 1e-6);
}

#[tokio::test]
async fn chat_streams_read_the_delta_content() {
    let parts = vec![
        (0, data(r#"{"choices":[{"index":0,"delta":{"role":"assistant"}}]}"#)),
        (20, data(r#"{"choices":[{"index":0,"delta":{"content":"a"}}]}"#)),
        // The last event and the end marker in one write.
        (20, data(r#"{"choices":[{"index":0,"delta":{"content":"b"}}]}"#) + &data("[DONE]")),
    ];
    let out = stream_ok(ApiKind::Chat, parts).await;
    assert_eq!(out.generated_text, "ab");
    assert_eq!((out.num_chunks, out.itl.len(), out.usage_completion_tokens), (2, 1, None));
}

#[tokio::test]
async fn errors_become_failed_outcomes() {
    let base = serve(vec![
        Script {
            head: "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 27\r\nconnection: close\r\n\r\n{\"error\":{\"message\":\"no\"}}".into(),
            parts: vec![],
        },
        Script {
            head: sse_head(),
            parts: vec![(0, data(r#"{"error":{"message":"engine died"}}"#))],
        },
        Script { head: sse_head(), parts: vec![(0, data("[DONE]"))] },
    ])
    .await;
    let client = Client::new(&base, Duration::from_secs(10)).expect("client");
    let s = settings(&base, ApiKind::Completions);
    let a = client.stream_request(&s, &spec(), Instant::now()).await;
    assert!(!a.success && a.error.contains("400"), "{}", a.error);
    let b = client.stream_request(&s, &spec(), Instant::now()).await;
    assert!(!b.success && b.error.contains("engine died"), "{}", b.error);
    let c = client.stream_request(&s, &spec(), Instant::now()).await;
    assert!(!c.success && c.error.contains("without any text"), "{}", c.error);
}

#[tokio::test]
async fn models_and_detokenize_in_both_shapes() {
    let json = |body: &str| {
        Script {
        head: format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        ),
        parts: vec![],
    }
    };
    let base = serve(vec![
        json("{\"object\":\"list\",\"data\":[{\"id\":\"smol\"},{\"id\":\"other\"}]}"),
        json("{\"prompt\":\"vllm text\"}"),
        json("{\"content\":\"llama.cpp text\"}"),
    ])
    .await;
    let client = Client::new(&base, Duration::from_secs(10)).expect("client");
    assert_eq!(client.first_model().await.expect("models"), "smol");
    assert_eq!(client.detokenize(&[1, 2]).await.expect("detok"), "vllm text");
    assert_eq!(client.detokenize(&[1, 2]).await.expect("detok"), "llama.cpp text");
}
