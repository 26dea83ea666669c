//! The human-readable result table, line for line as `vllm bench serve` prints it (labels, `{:<40} {:<10}`
//! layout, two decimals), and which metric sections a run reports (`--percentile-metrics`).

use super::metrics::BenchmarkMetrics;
use super::stats::Summary;

/// `99` -> "99", `99.9` -> "99.9" (vLLM's key spelling).
pub fn pct_word(p: f64) -> String {
    if p.fract() == 0.0 {
        format!("{}", p as i64)
    } else {
        format!("{p}")
    }
}

/// The metrics percentiles can be reported for: (key, short name, section header), in vLLM's order.
pub const METRICS: [(&str, &str, &str); 6] = [
    ("ttft", "TTFT", "Time to First Token"),
    ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
    ("itl", "ITL", "Inter-token Latency"),
    ("e2el", "E2EL", "End-to-end Latency"),
    ("client_queue_time", "Client Queue Time", "Client-side Queueing"),
    ("e2el_including_client_queue", "E2EL incl. Client Queue", "Queue-inclusive End-to-end Latency"),
];

/// vLLM's default `--percentile-metrics` for generative models.
pub const DEFAULT_PERCENTILE_METRICS: &str = "ttft,tpot,itl";

/// Parses `--percentile-metrics` (comma-separated names of [`METRICS`]).
pub fn parse_percentile_metrics(text: &str) -> Result<Vec<&'static str>, String> {
    let names: Vec<&str> = text.split(',').map(str::trim).filter(|n| !n.is_empty()).collect();
    for n in &names {
        if !METRICS.iter().any(|(k, _, _)| k == n) {
            let known: Vec<&str> = METRICS.iter().map(|(k, _, _)| *k).collect();
            return Err(format!("unknown metric '{n}' (known: {})", known.join(", ")));
        }
    }
    Ok(METRICS.iter().map(|(k, _, _)| *k).filter(|k| names.contains(k)).collect())
}

/// One metric section of the report.
#[derive(Debug, Clone, Copy)]
pub struct MetricRow<'a> {
    pub key: &'static str,
    pub short: &'static str,
    pub header: &'static str,
    pub summary: &'a Summary,
}

/// The sections reported, as vLLM decides: the selected metrics, except that the client-queue ones exist only with
/// `--max-concurrency` (and the queue-inclusive latency only at a finite request rate).
pub fn metric_rows<'a>(
    m: &'a BenchmarkMetrics,
    selected: &[&str],
    max_concurrency: Option<usize>,
    finite_rate: bool,
) -> Vec<MetricRow<'a>> {
    METRICS
        .iter()
        .filter(|(key, _, _)| selected.contains(key))
        .filter_map(|&(key, short, header)| {
            let summary = match key {
                "ttft" => &m.ttft_ms,
                "tpot" => &m.tpot_ms,
                "itl" => &m.itl_ms,
                "e2el" => &m.e2el_ms,
                "client_queue_time" if max_concurrency.is_some() => &m.client_queue_time_ms,
                "e2el_including_client_queue" if max_concurrency.is_some() && finite_rate => {
                    &m.e2el_including_client_queue_ms
                }
                _ => return None,
            };
            Some(MetricRow { key, short, header, summary })
        })
        .collect()
}

/// The result table printed at the end of a run (vLLM's lines, labels and number formats).
pub fn render_table(
    m: &BenchmarkMetrics,
    rows: &[MetricRow<'_>],
    max_concurrency: Option<usize>,
    request_rate: f64,
) -> String {
    let mut s = String::new();
    let line = |s: &mut String, k: &str, v: String| s.push_str(&format!("{k:<40} {v:<10}\n"));
    s.push_str(&format!("{:=^50}\n", " Serving Benchmark Result "));
    line(&mut s, "Successful requests:", m.completed.to_string());
    line(&mut s, "Failed requests:", m.failed.to_string());
    if let Some(c) = max_concurrency {
        line(&mut s, "Maximum request concurrency:", c.to_string());
    }
    if request_rate.is_finite() {
        line(&mut s, "Request rate configured (RPS):", format!("{request_rate:.2}"));
    }
    line(&mut s, "Benchmark duration (s):", format!("{:.2}", m.duration_s));
    line(&mut s, "Total input tokens:", m.total_input.to_string());
    line(&mut s, "Total generated tokens:", m.total_output.to_string());
    line(&mut s, "Request throughput (req/s):", format!("{:.2}", m.request_throughput));
    if let Some(g) = m.request_goodput {
        line(&mut s, "Request goodput (req/s):", format!("{g:.2}"));
    }
    line(&mut s, "Output token throughput (tok/s):", format!("{:.2}", m.output_throughput));
    line(&mut s, "Peak output token throughput (tok/s):", format!("{:.2}", m.max_output_tokens_per_s));
    line(&mut s, "Peak concurrent requests:", format!("{:.2}", m.max_concurrent_requests as f64));
    line(&mut s, "Total token throughput (tok/s):", format!("{:.2}", m.total_token_throughput));
    for r in rows {
        s.push_str(&format!("{:-^50}\n", r.header));
        line(&mut s, &format!("Mean {} (ms):", r.short), format!("{:.2}", r.summary.mean));
        line(&mut s, &format!("Median {} (ms):", r.short), format!("{:.2}", r.summary.median));
        for (p, v) in &r.summary.percentiles {
            line(&mut s, &format!("P{} {} (ms):", pct_word(*p), r.short), format!("{v:.2}"));
        }
    }
    s.push_str(&"=".repeat(50));
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_metrics_parse_in_vllms_order() {
        assert_eq!(parse_percentile_metrics("itl,ttft"), Ok(vec!["ttft", "itl"]));
        assert!(parse_percentile_metrics("ttft,latency").is_err());
    }
}
