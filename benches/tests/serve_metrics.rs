//! `bench serve` statistics and metric aggregation against numpy: `fixtures/serve_metrics_numpy.json` was made by
//! `benches/reference/serve_metrics_numpy.py` with np.mean / np.std / np.median / np.percentile and vLLM's
//! `calculate_metrics` formulas (TPOT, pooled ITL, throughputs, goodput).

use rserve_benches::serve::metrics::{compute, RequestOutcome, Slo};
use rserve_benches::serve::stats::Summary;
use serde_json::Value;

fn fixture() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/serve_metrics_numpy.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("json")
}

fn f(v: &Value) -> f64 {
    v.as_f64().expect("number")
}

fn close(a: f64, b: f64, what: &str) {
    assert!((a - b).abs() <= 1e-9 * b.abs().max(1.0), "{what}: {a} vs numpy {b}");
}

#[test]
fn summaries_match_numpy() {
    let fx = fixture();
    let samples = fx["samples"].as_array().expect("samples");
    assert!(samples.len() >= 5);
    for s in samples {
        let xs: Vec<f64> = s["values"].as_array().expect("values").iter().map(f).collect();
        let ps: Vec<f64> = s["percentiles"].as_array().expect("pcts").iter().map(|p| f(&p[0])).collect();
        let sm = Summary::of(&xs, &ps);
        let n = xs.len();
        close(sm.mean, f(&s["mean"]), &format!("mean of {n}"));
        close(sm.std, f(&s["std"]), &format!("std of {n}"));
        close(sm.median, f(&s["median"]), &format!("median of {n}"));
        for (p, (q, v)) in s["percentiles"].as_array().expect("pcts").iter().zip(&sm.percentiles) {
            assert_eq!(f(&p[0]), *q);
            close(*v, f(&p[1]), &format!("p{q} of {n}"));
        }
    }
}

#[test]
fn run_metrics_match_numpy() {
    let fx = fixture();
    let run = &fx["run"];
    let outcomes: Vec<RequestOutcome> = run["requests"]
        .as_array()
        .expect("requests")
        .iter()
        .map(|r| RequestOutcome {
            success: r["success"].as_bool().expect("bool"),
            prompt_len: r["prompt_len"].as_u64().expect("int") as usize,
            usage_completion_tokens: Some(r["output_len"].as_u64().expect("int") as usize),
            ttft: f(&r["ttft"]),
            latency: f(&r["latency"]),
            itl: r["itl"].as_array().expect("itl").iter().map(f).collect(),
            ..Default::default()
        })
        .collect();
    let slo = Slo { ttft_ms: Some(f(&run["slo_ms"]["ttft"])), tpot_ms: Some(f(&run["slo_ms"]["tpot"])), e2el_ms: None };
    let m = compute(&outcomes, f(&run["duration_s"]), &slo, &[99.0], None);
    let e = &run["expected"];
    assert_eq!(m.completed as u64, e["completed"].as_u64().expect("int"));
    assert!(m.failed > 0, "the fixture has failed requests");
    assert_eq!(m.total_input as u64, e["total_input"].as_u64().expect("int"));
    assert_eq!(m.total_output as u64, e["total_output"].as_u64().expect("int"));
    close(m.request_throughput, f(&e["request_throughput"]), "request throughput");
    close(m.request_goodput.expect("slo given"), f(&e["request_goodput"]), "goodput");
    close(m.output_throughput, f(&e["output_throughput"]), "output throughput");
    close(m.total_token_throughput, f(&e["total_token_throughput"]), "total throughput");
    for (name, sm) in [("ttft_ms", &m.ttft_ms), ("tpot_ms", &m.tpot_ms), ("itl_ms", &m.itl_ms), ("e2el_ms", &m.e2el_ms)]
    {
        close(sm.mean, f(&e[name]["mean"]), &format!("mean {name}"));
        close(sm.std, f(&e[name]["std"]), &format!("std {name}"));
        close(sm.median, f(&e[name]["median"]), &format!("median {name}"));
        close(sm.percentile(99.0).expect("p99"), f(&e[name]["p99"]), &format!("p99 {name}"));
    }
    // Without SLOs there is no goodput.
    assert_eq!(compute(&outcomes, 1.0, &Slo::default(), &[99.0], None).request_goodput, None);
}
