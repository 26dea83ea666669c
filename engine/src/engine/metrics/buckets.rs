//! vLLM v1's histogram bucket families (`vllm/v1/metrics/buckets.py`): each histogram of `/metrics` takes its upper
//! bounds from one of these, so a Grafana panel that reads vLLM's buckets reads ours the same way. The server crate's
//! test checks every family against `tests/fixtures/vllm/metrics.json`, which the reference script read from vLLM.

/// e2e, queue, inference, prefill and decode times (seconds).
pub const REQUEST_LATENCY: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
    1920.0, 7680.0,
];
/// Time to first token (seconds).
pub const TIME_TO_FIRST_TOKEN: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    160.0, 640.0, 2560.0,
];
/// Inter-token latency and a request's mean time per output token (seconds).
pub const INTER_TOKEN_LATENCY: &[f64] =
    &[0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0];
/// Tokens per engine step.
pub const ITERATION_TOKENS: &[f64] =
    &[1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0];
/// The `n` request parameter.
pub const REQUEST_PARAMS_N: &[f64] = &[1.0, 2.0, 5.0, 10.0, 20.0];
/// Preemptions of one request.
pub const REQUEST_NUM_PREEMPTIONS: &[f64] = &[1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0];

/// Token counts of one request (prompt, generation, `max_tokens`): vLLM's 1-2-5 series up to `max_model_len`
/// (`build_1_2_5_buckets`): 1, 2, 5, 10, 20, 50, ... while the value is at most `max_model_len`.
pub fn request_tokens(max_model_len: usize) -> Vec<f64> {
    let mut out = Vec::new();
    let mut scale = 1usize;
    loop {
        for m in [1usize, 2, 5] {
            match m.checked_mul(scale) {
                Some(v) if v <= max_model_len => out.push(v as f64),
                _ => return out,
            }
        }
        scale = match scale.checked_mul(10) {
            Some(s) => s,
            None => return out,
        };
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn request_tokens_is_the_1_2_5_series_up_to_the_model_length() {
        assert_eq!(super::request_tokens(100), vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]);
        assert_eq!(super::request_tokens(1024), vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0]);
        assert_eq!(super::request_tokens(0), Vec::<f64>::new());
    }
}
