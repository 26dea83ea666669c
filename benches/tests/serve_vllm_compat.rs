//! `rserve bench serve` against `vllm bench serve` (the fixture `tests/fixtures/vllm/bench_serve.json`, made from
//! vLLM's source by `scripts/reference/vllm_bench_refs.py`): every vLLM flag parses, the defaults that matter are
//! vLLM's, a run against a local fake server writes a result JSON with exactly vLLM's keys (default run and
//! `--save-detailed`), and every summary line's label is one vLLM prints.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use rserve_benches::serve::metrics::{compute, RequestOutcome, Slo};
use rserve_benches::serve::report::{metric_rows, render_table};
use rserve_benches::serve::{self, ServeBenchArgs};
use rserve_tests::smollm2_gguf;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: ServeBenchArgs,
}

fn fixture() -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/vllm/bench_serve.json");
    serde_json::from_str(&std::fs::read_to_string(&path).expect("fixture")).expect("fixture JSON")
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array().expect("array").iter().map(|s| s.as_str().expect("string").to_owned()).collect()
}

/// A value to give `flag` on the command line: its vLLM default, else its first choice, else "1".
fn sample_value(flag: &Value) -> Option<String> {
    let action = flag["action"].as_str().unwrap_or("");
    if action == "store_true" || action.ends_with("BooleanOptionalAction") {
        return None;
    }
    Some(match (&flag["default"], &flag["choices"]) {
        (Value::String(s), _) => s.clone(),
        (Value::Null, Value::Array(c)) => c[0].as_str().map(str::to_owned).unwrap_or_else(|| c[0].to_string()),
        (Value::Null, _) => "1".into(),
        (Value::Number(n), _) => n.to_string(),
        (other, _) => other.to_string(),
    })
}

#[test]
fn every_vllm_flag_parses() {
    let f = fixture();
    let flags = f["flags"].as_array().expect("flags");
    assert!(flags.len() > 90, "{} flags", flags.len());
    for flag in flags {
        let name = flag["flag"].as_str().expect("flag name");
        let mut argv = vec!["bench".to_owned(), name.to_owned()];
        argv.extend(sample_value(flag));
        if let Err(e) = Cli::try_parse_from(&argv) {
            panic!("{argv:?} does not parse: {e}");
        }
    }
}

#[test]
fn defaults_are_vllms() {
    let f = fixture();
    let default = |name: &str| {
        f["flags"].as_array().expect("flags").iter().find(|x| x["flag"] == name).expect(name)["default"].clone()
    };
    let a = Cli::try_parse_from(["bench"]).expect("no flags").args;
    assert_eq!(default("--num-prompts"), a.num_prompts);
    assert_eq!(default("--seed"), a.seed);
    assert_eq!(default("--host"), a.host.as_str());
    assert_eq!(default("--port"), a.port);
    assert_eq!(default("--endpoint"), a.endpoint.as_str());
    assert_eq!(default("--backend"), a.backend.as_str());
    assert_eq!(default("--dataset-name"), a.dataset.dataset_name.name().as_str());
    assert_eq!(default("--request-rate"), "inf");
    assert!(a.request_rate.as_f64().is_infinite());
    assert_eq!(default("--burstiness"), a.burstiness);
    assert_eq!(default("--num-warmups"), a.num_warmups);
    assert_eq!(default("--metric-percentiles"), a.metric_percentiles.as_str());
    assert_eq!(default("--random-input-len"), a.dataset.random_input_len);
    assert_eq!(default("--random-output-len"), a.dataset.random_output_len);
    assert_eq!(default("--random-range-ratio"), a.dataset.random_range_ratio.as_str());
    assert_eq!(default("--random-prefix-len"), a.dataset.random_prefix_len);
    assert_eq!(default("--custom-output-len"), a.dataset.custom_output_len);
    assert_eq!(default("--ready-check-timeout-sec"), a.ready_check_timeout_sec);
    // Sampling is left to the server unless given.
    assert_eq!(default("--temperature"), Value::Null);
    assert!(a.sampling.temperature.is_none() && a.sampling.top_p.is_none() && a.sampling.top_k.is_none());
    assert!(!a.ignore_eos, "forced on at run time for the random dataset only");
}

/// Serves every connection with one streamed completion of three chunks and a usage chunk; returns the base URL.
fn fake_server() -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async move {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            tx.send(listener.local_addr().expect("addr")).expect("send addr");
            loop {
                let Ok((mut sock, _)) = listener.accept().await else { return };
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut tmp = [0u8; 8192];
                    loop {
                        let n = sock.read(&mut tmp).await.unwrap_or(0);
                        buf.extend_from_slice(&tmp[..n]);
                        let text = String::from_utf8_lossy(&buf).to_string();
                        let Some(end) = text.find("\r\n\r\n") else {
                            if n == 0 {
                                return;
                            }
                            continue;
                        };
                        let len = text[..end]
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().parse().unwrap_or(0))
                            })
                            .unwrap_or(0usize);
                        if buf.len() >= end + 4 + len || n == 0 {
                            break;
                        }
                    }
                    let mut reply =
                        String::from("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n");
                    for t in ["a", " b", " c"] {
                        reply.push_str(&format!("data: {{\"choices\":[{{\"index\":0,\"text\":\"{t}\"}}]}}\n\n"));
                    }
                    reply
                        .push_str("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":8,\"completion_tokens\":3}}\n\n");
                    reply.push_str("data: [DONE]\n\n");
                    sock.write_all(reply.as_bytes()).await.ok();
                    sock.shutdown().await.ok();
                });
            }
        });
    });
    let addr = rx.recv_timeout(Duration::from_secs(10)).expect("server address");
    format!("http://{addr}")
}

fn run_and_read(base: &str, dir: &std::path::Path, extra: &[&str]) -> Value {
    let tok = smollm2_gguf();
    let mut argv: Vec<String> = [
        "bench",
        "--base-url",
        base,
        "--model",
        "org/m",
        "--tokenizer",
        &tok.display().to_string(),
        "--random-input-len",
        "8",
        "--random-output-len",
        "3",
        "--num-prompts",
        "4",
        "--request-rate",
        "200",
        "--burstiness",
        "0.5",
        "--num-warmups",
        "1",
        "--max-concurrency",
        "2",
        "--temperature",
        "0",
        "--disable-tqdm",
        "--save-result",
        "--result-dir",
        &dir.display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    argv.extend(extra.iter().map(|s| s.to_string()));
    serve::run(Cli::try_parse_from(&argv).expect("flags").args).expect("run");
    let files: Vec<_> = std::fs::read_dir(dir).expect("result dir").map(|e| e.expect("entry").path()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let name = files[0].file_name().and_then(|n| n.to_str()).expect("name").to_owned();
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&files[0]).expect("read")).expect("JSON");
    std::fs::remove_file(&files[0]).expect("remove");
    assert!(name.ends_with(".json"), "{name}");
    json.as_object().expect("object").get("completed").expect("completed");
    let mut out = json.clone();
    out["__file_name"] = Value::String(name);
    out
}

fn keys(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().expect("object").keys().filter(|k| *k != "__file_name").cloned().collect();
    k.sort();
    k
}

#[test]
fn a_run_writes_exactly_vllms_result_keys() {
    let f = fixture();
    let base = fake_server();
    let dir = tempfile_dir();
    let mut want = strings(&f["default_run_keys"]);
    want.sort();
    let plain = run_and_read(&base, &dir, &[]);
    assert_eq!(keys(&plain), want);
    assert_eq!(plain["completed"], 4);
    assert_eq!(plain["total_output_tokens"], 12);
    assert_eq!(plain["label"], Value::Null);
    assert_eq!(plain["burstiness"], 0.5);
    assert!(
        plain["max_concurrent_requests"].as_u64().is_some_and(|n| (1..=4).contains(&n)),
        "requests active in one second"
    );
    assert!(plain["max_output_tokens_per_s"].as_f64().is_some_and(|x| x >= 3.0));
    let name = plain["__file_name"].as_str().expect("name");
    assert!(name.starts_with("openai-200.0qps-concurrency2-m-"), "{name}");

    let mut want = strings(&f["detailed_run_keys"]);
    want.sort();
    let detailed = run_and_read(&base, &dir, &["--save-detailed", "--label", "rs", "--result-filename", "r.json"]);
    assert_eq!(keys(&detailed), want);
    assert_eq!(detailed["__file_name"], "r.json");
    assert_eq!(detailed["label"], "rs");
    assert_eq!(detailed["start_times"].as_array().map(Vec::len), Some(4));
    std::fs::remove_dir_all(&dir).ok();
}

fn tempfile_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("rserve-bench-compat-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

#[test]
fn summary_labels_are_vllms() {
    let f = fixture();
    let labels = strings(&f["summary_labels"]);
    let outcome = RequestOutcome {
        success: true,
        prompt_len: 4,
        num_chunks: 3,
        ttft: 0.1,
        latency: 0.3,
        itl: vec![0.1, 0.1],
        ..Default::default()
    };
    let m = compute(&[outcome], 1.0, &Slo { ttft_ms: Some(1.0), ..Default::default() }, &[50.0, 99.0], None);
    let all = ["ttft", "tpot", "itl", "e2el", "client_queue_time", "e2el_including_client_queue"];
    let rows = metric_rows(&m, &all, Some(4), true);
    let table = render_table(&m, &rows, Some(4), 2.0);
    for line in table.lines().filter(|l| !l.starts_with('=') && !l.starts_with('-')) {
        let label = line[..40.min(line.len())].trim_end();
        let known = labels.iter().any(|l| match l.split_once("{}") {
            None => l == label,
            Some((a, b)) => label.starts_with(a) && label.ends_with(b.rsplit("{}").next().unwrap_or(b)),
        });
        assert!(known, "'{label}' is not a label vllm bench serve prints");
    }
    for want in ["Peak output token throughput (tok/s):", "Peak concurrent requests:", "Request goodput (req/s):"] {
        assert!(table.contains(want), "{want} missing from\n{table}");
    }
}
