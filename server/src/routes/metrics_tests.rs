//! `/metrics` against vLLM's own definitions (`tests/fixtures/vllm/metrics.json`, read from vLLM's source by
//! `scripts/reference/vllm_grafana_refs.py`): every metric vLLM exports by default is exported with its type, help
//! string, labels and histogram buckets, or is listed in `NOT_EXPORTED` with the reason.

use std::collections::{BTreeMap, BTreeSet};

use rserve_engine::engine::metrics::{CacheInfo, MetricsSetup, NOT_EXPORTED};
use serde_json::Value;

use super::*;

const MAX_MODEL_LEN: usize = 1024;

/// One metric family of the exposition text.
#[derive(Debug, Default)]
struct Family {
    help: String,
    kind: String,
    labels: BTreeSet<String>,
    /// `le` bounds of a histogram, +Inf left out.
    buckets: Vec<f64>,
}

fn fixture() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/vllm/metrics.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("read the fixture")).expect("parse the fixture")
}

/// `name{a="x",b="y"}` -> (name, [(a, x), (b, y)]), for label values without commas or quotes.
fn sample(line: &str) -> (String, Vec<(String, String)>) {
    let series = line.rsplit_once(' ').map_or(line, |(s, _)| s);
    let Some((name, rest)) = series.split_once('{') else { return (series.to_owned(), Vec::new()) };
    let labels = rest
        .trim_end_matches('}')
        .split("\",")
        .filter_map(|kv| kv.split_once("=\""))
        .map(|(k, v)| (k.to_owned(), v.trim_end_matches('"').to_owned()))
        .collect();
    (name.to_owned(), labels)
}

fn parse(text: &str) -> BTreeMap<String, Family> {
    let mut out: BTreeMap<String, Family> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').expect("help");
            out.entry(name.to_owned()).or_default().help = help.to_owned();
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("type");
            out.entry(name.to_owned()).or_default().kind = kind.to_owned();
        } else if !line.is_empty() {
            let (name, labels) = sample(line);
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|f| out.get(*f).is_some_and(|f| f.kind == "histogram")))
                .unwrap_or(&name)
                .to_owned();
            let f = out.get_mut(&family).unwrap_or_else(|| panic!("sample {name} before its TYPE"));
            for (k, v) in labels {
                if k == "le" {
                    if v != "+Inf" {
                        f.buckets.push(v.parse().expect("le"));
                    }
                } else {
                    f.labels.insert(k);
                }
            }
        }
    }
    out
}

/// vLLM's 1-2-5 rule from the fixture's mantissas, capped at `max`.
fn series(mantissas: &[f64], max: f64) -> Vec<f64> {
    let mut out = Vec::new();
    let mut scale = 1.0;
    loop {
        for m in mantissas {
            if m * scale > max {
                return out;
            }
            out.push(m * scale);
        }
        scale *= 10.0;
    }
}

#[test]
fn every_default_vllm_metric_is_exported_as_vllm_defines_it() {
    let m = EngineMetrics::new(MetricsSetup {
        model_name: "m".into(),
        max_model_len: MAX_MODEL_LEN,
        cache: CacheInfo::default(),
        engine: 0,
    })
    .expect("metrics");
    let ours = parse(&render(&m).expect("render"));
    let fixture = fixture();
    let cache_fields: BTreeSet<&str> =
        fixture["cache_config_fields"].as_array().expect("fields").iter().filter_map(Value::as_str).collect();
    let mut checked = BTreeSet::new();
    for (name, def) in fixture["metrics"].as_object().expect("metrics") {
        if let Some((_, why)) = NOT_EXPORTED.iter().find(|(n, _)| n == name) {
            assert!(!ours.contains_key(name.as_str()), "{name} is exported but listed as not exported ({why})");
            continue;
        }
        let kind = def["type"].as_str().expect("type");
        // Python's client writes a counter's family with `_total` in the 0.0.4 text format, as we register it.
        let exposed = if kind == "counter" { format!("{name}_total") } else { name.clone() };
        let f = ours.get(&exposed).unwrap_or_else(|| panic!("{exposed} is not exported"));
        assert_eq!(f.kind, kind, "{exposed}: type");
        assert_eq!(Some(f.help.as_str()), def["help"].as_str(), "{exposed}: help");
        match &def["labels"] {
            Value::Array(labels) => {
                let want: BTreeSet<String> = labels.iter().filter_map(|l| l.as_str().map(str::to_owned)).collect();
                assert_eq!(f.labels, want, "{exposed}: labels");
            }
            _ => {
                // The info gauge: `engine` plus some of CacheConfig's fields.
                assert!(f.labels.contains("engine"), "{exposed}: labels {:?}", f.labels);
                for l in f.labels.iter().filter(|l| *l != "engine") {
                    assert!(cache_fields.contains(l.as_str()), "{exposed}: {l} is not a CacheConfig field");
                }
            }
        }
        match &def["buckets"] {
            Value::Array(b) => {
                let want: Vec<f64> = b.iter().filter_map(Value::as_f64).collect();
                assert_eq!(f.buckets, want, "{exposed}: buckets");
            }
            Value::Object(rule) => {
                let mantissas: Vec<f64> =
                    rule["mantissas"].as_array().expect("m").iter().filter_map(Value::as_f64).collect();
                assert_eq!(rule["max"], "max_model_len");
                assert_eq!(f.buckets, series(&mantissas, MAX_MODEL_LEN as f64), "{exposed}: buckets");
            }
            _ => assert!(f.buckets.is_empty(), "{exposed}: buckets on a {kind}"),
        }
        checked.insert(exposed);
    }
    for (n, _) in NOT_EXPORTED {
        assert!(fixture["metrics"].get(n).is_some(), "NOT_EXPORTED names {n}, which vLLM does not define");
    }
    // Nothing under vLLM's prefix that vLLM does not define.
    for name in ours.keys().filter(|n| n.starts_with("vllm:")) {
        assert!(checked.contains(name), "{name} is exported but vLLM defines no such metric");
    }
}

#[test]
fn finished_requests_and_tokens_reach_the_exposition() {
    let m = EngineMetrics::default();
    m.kv_blocks_total.set(8);
    m.set_scheduler_state(1, 2, 2, 8);
    let mut stats = rserve_engine::engine::metrics::RequestStats::new(std::time::Instant::now(), 16);
    let t = stats.token(std::time::Instant::now());
    m.observe_token(t, 42, 10);
    let end = rserve_engine::engine::metrics::Finished {
        reason: "stop",
        stats: &stats,
        prompt_tokens: 42,
        cached_tokens: 10,
    };
    m.observe_finished(end, std::time::Instant::now());
    m.parent_observer().observe(2, 7);
    let text = render(&m).expect("render");
    let l = "model_name=\"\",engine=\"0\"";
    for want in [
        format!("vllm:kv_cache_usage_perc{{{l}}} 0.25\n"),
        format!("vllm:num_requests_waiting{{{l}}} 2\n"),
        format!("vllm:prompt_tokens_total{{{l}}} 42\n"),
        format!("vllm:prompt_tokens_cached_total{{{l}}} 10\n"),
        format!("vllm:prompt_tokens_by_source_total{{{l},source=\"local_compute\"}} 32\n"),
        format!("vllm:request_success_total{{{l},finished_reason=\"stop\"}} 1\n"),
        format!("vllm:request_success_total{{{l},finished_reason=\"error\"}} 0\n"),
        format!("vllm:request_params_n_count{{{l}}} 1\n"),
        format!("vllm:request_max_num_generation_tokens_sum{{{l}}} 7\n"),
        format!("vllm:request_params_max_tokens_sum{{{l}}} 16\n"),
        format!("vllm:time_to_first_token_seconds_count{{{l}}} 1\n"),
        format!("rserve:kv_blocks_used{{{l}}} 2\n"),
        format!("rserve:kv_blocks_total{{{l}}} 8\n"),
        "# TYPE vllm:prompt_tokens_total counter\n".to_owned(),
        "vllm:cache_config_info{block_size=\"16\",".to_owned(),
        "kv_cache_memory_bytes=\"None\",engine=\"0\"} 1\n".to_owned(),
    ] {
        assert!(text.contains(&want), "missing {want:?} in\n{text}");
    }
}

#[test]
fn data_parallel_replicas_are_one_family_each_with_a_series_per_engine_label() {
    let setup = |engine| MetricsSetup { model_name: "m".into(), engine, ..MetricsSetup::default() };
    let (a, b) = (EngineMetrics::new(setup(0)).expect("metrics"), EngineMetrics::new(setup(1)).expect("metrics"));
    a.set_scheduler_state(3, 0, 1, 4);
    b.set_scheduler_state(5, 2, 2, 4);
    let text = super::render_replicas(&[&a, &b]).expect("render");
    assert_eq!(text.matches("# TYPE vllm:num_requests_running gauge").count(), 1, "{text}");
    assert!(text.contains("vllm:num_requests_running{model_name=\"m\",engine=\"0\"} 3"), "{text}");
    assert!(text.contains("vllm:num_requests_running{model_name=\"m\",engine=\"1\"} 5"), "{text}");
    assert!(text.contains("vllm:kv_cache_usage_perc{model_name=\"m\",engine=\"1\"} 0.5"), "{text}");
    // One replica's text is the single engine's, byte for byte.
    assert_eq!(super::render_replicas(&[&a]).expect("render"), render(&a).expect("render"));
}
