//! The JSON result of a run with exactly `vllm bench serve`'s keys (the fixture `tests/fixtures/vllm/bench_serve.json`
//! lists them; the per-request arrays only with `--save-detailed`), its file name
//! (`{label}-{rate}qps[-concurrency{n}]-{model}-{date}.json`, or the ramp-up form, under `--result-dir`) and writing
//! it (`--append-result` adds one JSON line to an existing file).

use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

use super::error::BenchError;
use super::metrics::{BenchmarkMetrics, RequestOutcome};
use super::report::{pct_word, MetricRow};

/// Facts about the run that go into the JSON result next to the metrics.
#[derive(Debug, Clone)]
pub struct RunInfo {
    /// `YYYYMMDD-HHMMSS`.
    pub date: String,
    pub backend: String,
    /// `--label` (null when not given; the file name then uses the backend).
    pub label: Option<String>,
    pub model_id: String,
    pub tokenizer_id: String,
    pub num_prompts: usize,
    /// `--metadata` pairs, stored as top-level keys.
    pub metadata: Vec<(String, String)>,
    pub request_rate: f64,
    pub burstiness: f64,
    pub max_concurrency: Option<usize>,
    /// `(strategy, start rps, end rps)` with `--ramp-up-strategy`.
    pub ramp_up: Option<(&'static str, u64, u64)>,
}

/// The result JSON. `detailed` adds vLLM's per-request arrays (`input_lens`, `output_lens`, `ttfts`, `itls`,
/// `start_times`, `generated_texts`, `errors`).
pub fn result_json(
    info: &RunInfo,
    m: &BenchmarkMetrics,
    rows: &[MetricRow<'_>],
    outcomes: &[RequestOutcome],
    detailed: bool,
) -> Value {
    let mut o = Map::new();
    let rate = if info.request_rate.is_finite() { json!(info.request_rate) } else { json!("inf") };
    let setup = [
        ("date", json!(info.date)),
        ("endpoint_type", json!(info.backend)),
        ("backend", json!(info.backend)),
        ("label", json!(info.label)),
        ("model_id", json!(info.model_id)),
        ("tokenizer_id", json!(info.tokenizer_id)),
        ("num_prompts", json!(info.num_prompts)),
    ];
    for (k, v) in setup {
        o.insert(k.into(), v);
    }
    for (k, v) in &info.metadata {
        o.insert(k.clone(), json!(v));
    }
    o.insert("request_rate".into(), rate);
    o.insert("burstiness".into(), json!(info.burstiness));
    o.insert("max_concurrency".into(), json!(info.max_concurrency));
    if let Some((strategy, start, end)) = info.ramp_up {
        o.insert("ramp_up_strategy".into(), json!(strategy));
        o.insert("ramp_up_start_rps".into(), json!(start));
        o.insert("ramp_up_end_rps".into(), json!(end));
    }
    let per_request = |f: fn(&RequestOutcome) -> Value| Value::Array(outcomes.iter().map(f).collect());
    let results = [
        ("duration", json!(m.duration_s)),
        ("completed", json!(m.completed)),
        ("failed", json!(m.failed)),
        ("total_input_tokens", json!(m.total_input)),
        ("total_output_tokens", json!(m.total_output)),
        ("request_throughput", json!(m.request_throughput)),
        ("request_goodput", json!(m.request_goodput)),
        ("output_throughput", json!(m.output_throughput)),
        ("total_token_throughput", json!(m.total_token_throughput)),
        ("latencies", per_request(|r| json!(r.latency))),
        ("queue_times", per_request(|r| json!(r.queue_time))),
        ("max_output_tokens_per_s", json!(m.max_output_tokens_per_s)),
        ("max_concurrent_requests", json!(m.max_concurrent_requests)),
        // Audio input seconds per second (vLLM's ASR benchmarks); always 0 for text.
        ("rtfx", json!(0.0)),
    ];
    for (k, v) in results {
        o.insert(k.into(), v);
    }
    if detailed {
        let arrays = [
            ("input_lens", per_request(|r| json!(r.prompt_len))),
            ("output_lens", json!(m.output_lens)),
            ("ttfts", per_request(|r| json!(r.ttft))),
            ("itls", per_request(|r| json!(r.itl))),
            ("start_times", per_request(|r| json!(r.start_offset))),
            ("generated_texts", per_request(|r| json!(r.generated_text))),
            ("errors", per_request(|r| json!(r.error))),
        ];
        for (k, v) in arrays {
            o.insert(k.into(), v);
        }
    }
    for r in rows {
        o.insert(format!("mean_{}_ms", r.key), json!(r.summary.mean));
        o.insert(format!("median_{}_ms", r.key), json!(r.summary.median));
        o.insert(format!("std_{}_ms", r.key), json!(r.summary.std));
        for (p, v) in &r.summary.percentiles {
            o.insert(format!("p{}_{}_ms", pct_word(*p), r.key), json!(v));
        }
    }
    Value::Object(o)
}

/// Python's `str(float)` for the rates in file names: `10.0`, `0.5`, `inf`.
pub fn py_float(x: f64) -> String {
    if x.is_infinite() {
        if x > 0.0 { "inf" } else { "-inf" }.to_owned()
    } else if x.fract() == 0.0 && x.abs() < 1e16 {
        format!("{x:.1}")
    } else {
        format!("{x}")
    }
}

/// vLLM's result path: `--result-filename` or `{label}-{rate}qps[-concurrency{n}]-{model}-{date}.json` (with
/// `ramp-up-{strategy}-{start}qps-{end}qps` in place of the rate under a ramp-up), inside `--result-dir` when given.
/// `label` defaults to the backend; the model is the last `/` part of the model id.
pub fn result_path(info: &RunInfo, result_dir: Option<&Path>, result_filename: Option<&str>) -> PathBuf {
    let label = info.label.as_deref().unwrap_or(&info.backend);
    let model = info.model_id.rsplit('/').next().unwrap_or(&info.model_id);
    let concurrency = info.max_concurrency.map_or(String::new(), |c| format!("-concurrency{c}"));
    let name = match (result_filename, info.ramp_up) {
        (Some(f), _) => f.to_owned(),
        (None, Some((strategy, start, end))) => {
            format!("{label}-ramp-up-{strategy}-{start}qps-{end}qps{concurrency}-{model}-{}.json", info.date)
        }
        (None, None) => {
            format!("{label}-{}qps{concurrency}-{model}-{}.json", py_float(info.request_rate), info.date)
        }
    };
    match result_dir {
        Some(d) => d.join(name),
        None => PathBuf::from(name),
    }
}

/// Writes `json` to `path` (creating its folder): the whole file, or one more line of it when `append`.
pub fn write_result(path: &Path, json: &Value, append: bool) -> Result<(), BenchError> {
    let io = |source| BenchError::Io { path: path.to_path_buf(), source };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let text = json.to_string();
    if append {
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(io)?;
        let empty = f.metadata().map_err(io)?.len() == 0;
        let line = if empty { text } else { format!("\n{text}") };
        f.write_all(line.as_bytes()).map_err(io)
    } else {
        std::fs::write(path, text).map_err(io)
    }
}

/// UTC time `secs` after the Unix epoch as `YYYYMMDD-HHMMSS` (vLLM's result date format).
pub fn utc_stamp(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (proleptic Gregorian calendar, 400-year eras).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}{month:02}{day:02}-{:02}{:02}{:02}", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(rate: f64, concurrency: Option<usize>) -> RunInfo {
        RunInfo {
            date: "20260102-030405".into(),
            backend: "openai".into(),
            label: None,
            model_id: "HuggingFaceTB/SmolLM2-135M".into(),
            tokenizer_id: "t".into(),
            num_prompts: 1,
            metadata: vec![],
            request_rate: rate,
            burstiness: 1.0,
            max_concurrency: concurrency,
            ramp_up: None,
        }
    }

    /// The names `vllm bench serve` gives (compute_result_filename).
    #[test]
    fn result_names_follow_vllm() {
        let p = |i: &RunInfo, d: Option<&str>, f: Option<&str>| result_path(i, d.map(Path::new), f);
        assert_eq!(
            p(&info(f64::INFINITY, None), None, None),
            PathBuf::from("openai-infqps-SmolLM2-135M-20260102-030405.json")
        );
        assert_eq!(
            p(&info(10.0, Some(8)), Some("out"), None),
            PathBuf::from("out/openai-10.0qps-concurrency8-SmolLM2-135M-20260102-030405.json")
        );
        let labeled = RunInfo { label: Some("rserve".into()), ramp_up: Some(("linear", 1, 5)), ..info(0.5, None) };
        assert_eq!(
            p(&labeled, None, None),
            PathBuf::from("rserve-ramp-up-linear-1qps-5qps-SmolLM2-135M-20260102-030405.json")
        );
        assert_eq!(p(&labeled, Some("d"), Some("x.json")), PathBuf::from("d/x.json"));
        assert_eq!(py_float(0.5), "0.5");
    }

    /// Expected strings from GNU date: `date -u -d @SECS +%Y%m%d-%H%M%S`.
    #[test]
    fn utc_stamps_match_gnu_date() {
        assert_eq!(utc_stamp(0), "19700101-000000");
        assert_eq!(utc_stamp(951_782_400), "20000229-000000");
        assert_eq!(utc_stamp(1_798_848_000), "20270102-000000");
        assert_eq!(utc_stamp(1_796_215_845), "20261202-125045");
    }
}
