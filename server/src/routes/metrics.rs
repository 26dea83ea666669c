//! `GET /metrics`: the engine's metrics in Prometheus text format under vLLM's names (`vllm:*`), plus rserve's own
//! KV block gauges (`rserve:*`), all labelled with `model_name`.

use std::fmt::Write;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use rserve_engine::api::FinishReason;
use rserve_engine::engine::metrics::Histogram;
use rserve_engine::engine::EngineMetrics;

use crate::state::AppState;

/// Prometheus text exposition format 0.0.4.
pub const CONTENT_TYPE_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

pub async fn handler(State(state): State<AppState>) -> impl IntoResponse {
    ([(CONTENT_TYPE, CONTENT_TYPE_TEXT)], render(state.engine.metrics(), state.primary_model_name()))
}

/// Escapes a label value (backslash, quote, newline).
fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn scalar(out: &mut String, name: &str, kind: &str, help: &str, labels: &str, value: f64) {
    // Counters are declared without the `_total` suffix, as Python's prometheus_client (and so vLLM) does.
    let family = if kind == "counter" { name.strip_suffix("_total").unwrap_or(name) } else { name };
    let _ = writeln!(out, "# HELP {family} {help}");
    let _ = writeln!(out, "# TYPE {family} {kind}");
    let _ = writeln!(out, "{name}{{{labels}}} {value}");
}

fn histogram(out: &mut String, name: &str, help: &str, labels: &str, h: &Histogram) {
    let data = h.snapshot();
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} histogram");
    let mut cumulative = 0u64;
    for (i, bound) in h.bounds().iter().enumerate() {
        cumulative += data.counts.get(i).copied().unwrap_or(0);
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{bound:?}\"}} {cumulative}");
    }
    let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", data.count);
    let _ = writeln!(out, "{name}_sum{{{labels}}} {}", data.sum);
    let _ = writeln!(out, "{name}_count{{{labels}}} {}", data.count);
}

/// The whole exposition text.
pub fn render(m: &EngineMetrics, model_name: &str) -> String {
    let labels = format!("model_name=\"{}\"", label(model_name));
    let l = labels.as_str();
    let g = |c: &std::sync::atomic::AtomicU64| EngineMetrics::get(c) as f64;
    let mut out = String::with_capacity(8 * 1024);
    scalar(
        &mut out,
        "vllm:num_requests_running",
        "gauge",
        "Number of requests running on the engine.",
        l,
        g(&m.num_requests_running),
    );
    scalar(
        &mut out,
        "vllm:num_requests_waiting",
        "gauge",
        "Number of requests waiting to be scheduled.",
        l,
        g(&m.num_requests_waiting),
    );
    scalar(
        &mut out,
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV cache usage (1 means 100 percent).",
        l,
        m.kv_cache_usage(),
    );
    scalar(
        &mut out,
        "vllm:prompt_tokens_total",
        "counter",
        "Number of prefill tokens processed.",
        l,
        g(&m.prompt_tokens_total),
    );
    scalar(
        &mut out,
        "vllm:generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
        l,
        g(&m.generation_tokens_total),
    );
    scalar(
        &mut out,
        "vllm:num_preemptions_total",
        "counter",
        "Cumulative number of preemptions.",
        l,
        g(&m.num_preemptions_total),
    );
    scalar(
        &mut out,
        "vllm:prefix_cache_queries_total",
        "counter",
        "Prompt tokens looked up in the prefix cache.",
        l,
        g(&m.prefix_cache_queries_total),
    );
    scalar(
        &mut out,
        "vllm:prefix_cache_hits_total",
        "counter",
        "Prompt tokens found in the prefix cache.",
        l,
        g(&m.prefix_cache_hits_total),
    );
    let _ = writeln!(out, "# HELP vllm:request_success Count of successfully processed requests.");
    let _ = writeln!(out, "# TYPE vllm:request_success counter");
    for r in FinishReason::ALL {
        let _ = writeln!(out, "vllm:request_success_total{{{l},finished_reason=\"{}\"}} {}", r.as_str(), m.finished(r));
    }
    histogram(&mut out, "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", l, &m.ttft);
    histogram(&mut out, "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", l, &m.itl);
    histogram(
        &mut out,
        "vllm:e2e_request_latency_seconds",
        "Histogram of end-to-end request latency in seconds.",
        l,
        &m.e2e,
    );
    scalar(&mut out, "rserve:kv_blocks_used", "gauge", "KV cache blocks held by requests.", l, g(&m.kv_blocks_used));
    scalar(&mut out, "rserve:kv_blocks_total", "gauge", "KV cache blocks in the pool.", l, g(&m.kv_blocks_total));
    scalar(
        &mut out,
        "rserve:computed_tokens_total",
        "counter",
        "Tokens run through the model (prefill and decode).",
        l,
        g(&m.computed_tokens_total),
    );
    out
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;

    #[test]
    fn exposition_has_vllm_names_and_cumulative_buckets() {
        let m = EngineMetrics::default();
        m.kv_blocks_total.store(8, Ordering::Relaxed);
        m.kv_blocks_used.store(2, Ordering::Relaxed);
        m.prompt_tokens_total.store(42, Ordering::Relaxed);
        m.count_finished(FinishReason::Stop);
        m.count_finished(FinishReason::Stop);
        m.count_finished(FinishReason::Length);
        m.ttft.observe(0.003);
        m.ttft.observe(0.05);
        m.ttft.observe(1000.0);
        let text = render(&m, "my\"model");
        let l = "model_name=\"my\\\"model\"";
        assert!(text.contains(&format!("vllm:kv_cache_usage_perc{{{l}}} 0.25\n")), "{text}");
        assert!(text.contains(&format!("vllm:prompt_tokens_total{{{l}}} 42\n")));
        assert!(text.contains("# TYPE vllm:prompt_tokens counter\n"));
        assert!(text.contains("# TYPE vllm:request_success counter\n"));
        assert!(text.contains(&format!("vllm:request_success_total{{{l},finished_reason=\"stop\"}} 2\n")), "{text}");
        assert!(text.contains(&format!("vllm:request_success_total{{{l},finished_reason=\"length\"}} 1\n")));
        assert!(text.contains(&format!("vllm:request_success_total{{{l},finished_reason=\"abort\"}} 0\n")));
        assert!(text.contains(&format!("rserve:kv_blocks_used{{{l}}} 2\n")));
        assert!(text.contains(&format!("rserve:kv_blocks_total{{{l}}} 8\n")));
        assert!(text.contains(&format!("vllm:time_to_first_token_seconds_bucket{{{l},le=\"0.001\"}} 0\n")));
        assert!(text.contains(&format!("vllm:time_to_first_token_seconds_bucket{{{l},le=\"0.005\"}} 1\n")));
        assert!(text.contains(&format!("vllm:time_to_first_token_seconds_bucket{{{l},le=\"0.06\"}} 2\n")));
        assert!(text.contains(&format!("vllm:time_to_first_token_seconds_bucket{{{l},le=\"80.0\"}} 2\n")));
        assert!(text.contains(&format!("vllm:time_to_first_token_seconds_bucket{{{l},le=\"+Inf\"}} 3\n")));
        assert!(text.contains(&format!("vllm:time_to_first_token_seconds_count{{{l}}} 3\n")));
        for name in [
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:generation_tokens_total",
            "vllm:num_preemptions_total",
            "vllm:prefix_cache_hits_total",
            "vllm:prefix_cache_queries_total",
            "vllm:inter_token_latency_seconds_bucket",
            "vllm:e2e_request_latency_seconds_sum",
        ] {
            assert!(text.contains(&format!("{name}{{")), "missing {name}");
        }
    }
}
