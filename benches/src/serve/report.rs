//! The human-readable result table (laid out like `vllm bench serve`'s) and the JSON result file (vLLM's key
//! names: `request_throughput`, `output_throughput`, `mean_ttft_ms`, `p99_itl_ms`, ...).

use serde_json::{json, Map, Value};

use super::metrics::{BenchmarkMetrics, RequestOutcome};
use super::stats::Summary;

/// Facts about the run that go into the JSON result next to the metrics.
#[derive(Debug, Clone)]
pub struct RunInfo {
    pub date: String,
    pub base_url: String,
    pub endpoint: String,
    pub model: String,
    pub dataset: String,
    pub num_prompts: usize,
    pub request_rate: f64,
    pub max_concurrency: Option<usize>,
    pub ignore_eos: bool,
    pub seed: u64,
    pub random_input_len: Option<usize>,
    pub random_output_len: Option<usize>,
    pub random_range_ratio: Option<f64>,
}

/// `99` -> "99", `99.9` -> "99.9" (vLLM's key spelling).
fn pct_word(p: f64) -> String {
    if p.fract() == 0.0 {
        format!("{}", p as i64)
    } else {
        format!("{p}")
    }
}

const METRICS: [(&str, &str, &str); 4] = [
    ("ttft", "TTFT", "Time to First Token"),
    ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
    ("itl", "ITL", "Inter-token Latency"),
    ("e2el", "E2EL", "End-to-end Latency"),
];

fn summary<'a>(m: &'a BenchmarkMetrics, key: &str) -> &'a Summary {
    match key {
        "ttft" => &m.ttft_ms,
        "tpot" => &m.tpot_ms,
        "itl" => &m.itl_ms,
        _ => &m.e2el_ms,
    }
}

/// The result table printed at the end of a run.
pub fn render_table(m: &BenchmarkMetrics, max_concurrency: Option<usize>, request_rate: f64) -> String {
    let mut s = String::new();
    let line = |s: &mut String, k: &str, v: String| s.push_str(&format!("{k:<40} {v:<10}\n"));
    s.push_str(&format!("{:=^50}\n", " Serving Benchmark Result "));
    line(&mut s, "Successful requests:", m.completed.to_string());
    line(&mut s, "Failed requests:", m.failed.to_string());
    if let Some(c) = max_concurrency {
        line(&mut s, "Maximum request concurrency:", c.to_string());
    }
    line(
        &mut s,
        "Request rate configured (RPS):",
        if request_rate.is_finite() { format!("{request_rate:.2}") } else { "inf".into() },
    );
    line(&mut s, "Benchmark duration (s):", format!("{:.2}", m.duration_s));
    line(&mut s, "Total input tokens:", m.total_input.to_string());
    line(&mut s, "Total generated tokens:", m.total_output.to_string());
    line(&mut s, "Request throughput (req/s):", format!("{:.2}", m.request_throughput));
    if let Some(g) = m.request_goodput {
        line(&mut s, "Request goodput (req/s):", format!("{g:.2}"));
    }
    line(&mut s, "Output token throughput (tok/s):", format!("{:.2}", m.output_throughput));
    line(&mut s, "Total Token throughput (tok/s):", format!("{:.2}", m.total_token_throughput));
    for (key, short, long) in METRICS {
        let sm = summary(m, key);
        s.push_str(&format!("{:-^50}\n", format!("{long}")));
        line(&mut s, &format!("Mean {short} (ms):"), format!("{:.2}", sm.mean));
        line(&mut s, &format!("Median {short} (ms):"), format!("{:.2}", sm.median));
        for (p, v) in &sm.percentiles {
            line(&mut s, &format!("P{} {short} (ms):", pct_word(*p)), format!("{v:.2}"));
        }
    }
    s.push_str(&"=".repeat(50));
    s.push('\n');
    s
}

/// The JSON result; per-request arrays only when `detailed`.
pub fn result_json(info: &RunInfo, m: &BenchmarkMetrics, outcomes: &[RequestOutcome], detailed: bool) -> Value {
    let mut o = Map::new();
    let rate = if info.request_rate.is_finite() { json!(info.request_rate) } else { json!("inf") };
    for (k, v) in [
        ("date", json!(info.date)),
        ("backend", json!("openai")),
        ("base_url", json!(info.base_url)),
        ("endpoint", json!(info.endpoint)),
        ("model_id", json!(info.model)),
        ("dataset_name", json!(info.dataset)),
        ("num_prompts", json!(info.num_prompts)),
        ("request_rate", rate),
        ("max_concurrency", json!(info.max_concurrency)),
        ("ignore_eos", json!(info.ignore_eos)),
        ("seed", json!(info.seed)),
        ("random_input_len", json!(info.random_input_len)),
        ("random_output_len", json!(info.random_output_len)),
        ("random_range_ratio", json!(info.random_range_ratio)),
        ("duration", json!(m.duration_s)),
        ("completed", json!(m.completed)),
        ("failed", json!(m.failed)),
        ("total_input_tokens", json!(m.total_input)),
        ("total_output_tokens", json!(m.total_output)),
        ("request_throughput", json!(m.request_throughput)),
        ("request_goodput", json!(m.request_goodput)),
        ("output_throughput", json!(m.output_throughput)),
        ("total_token_throughput", json!(m.total_token_throughput)),
    ] {
        o.insert(k.into(), v);
    }
    for (key, _, _) in METRICS {
        let sm = summary(m, key);
        o.insert(format!("mean_{key}_ms"), json!(sm.mean));
        o.insert(format!("median_{key}_ms"), json!(sm.median));
        o.insert(format!("std_{key}_ms"), json!(sm.std));
        for (p, v) in &sm.percentiles {
            o.insert(format!("p{}_{key}_ms", pct_word(*p)), json!(v));
        }
    }
    if detailed {
        o.insert("input_lens".into(), json!(outcomes.iter().map(|r| r.prompt_len).collect::<Vec<_>>()));
        o.insert("output_lens".into(), json!(m.output_lens));
        o.insert("ttfts".into(), json!(outcomes.iter().map(|r| r.ttft).collect::<Vec<_>>()));
        o.insert("itls".into(), json!(outcomes.iter().map(|r| r.itl.clone()).collect::<Vec<_>>()));
        o.insert("start_offsets".into(), json!(outcomes.iter().map(|r| r.start_offset).collect::<Vec<_>>()));
        o.insert(
            "generated_texts".into(),
            json!(outcomes.iter().map(|r| r.generated_text.clone()).collect::<Vec<_>>()),
        );
        o.insert("errors".into(), json!(outcomes.iter().map(|r| r.error.clone()).collect::<Vec<_>>()));
    }
    Value::Object(o)
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

    /// Expected strings from GNU date: `date -u -d @SECS +%Y%m%d-%H%M%S`.
    #[test]
    fn utc_stamps_match_gnu_date() {
        assert_eq!(utc_stamp(0), "19700101-000000");
        assert_eq!(utc_stamp(951_782_400), "20000229-000000");
        assert_eq!(utc_stamp(1_798_848_000), "20270102-000000");
        assert_eq!(utc_stamp(1_796_215_845), "20261202-125045");
    }
}
