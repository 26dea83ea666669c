//! Engine-side counters, gauges and latency histograms, updated by the engine thread and read by the server's
//! `/metrics` route and its periodic log line. Lock-free for counters and gauges; histograms take a short mutex.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::api::FinishReason;

/// A cumulative histogram with fixed upper bounds (Prometheus style).
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    inner: Mutex<HistogramData>,
}

/// A copy of a histogram's state.
#[derive(Debug, Clone, Default)]
pub struct HistogramData {
    /// Per-bucket counts (not cumulative), one per bound, plus the +Inf bucket last.
    pub counts: Vec<u64>,
    pub sum: f64,
    pub count: u64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Self { bounds, inner: Mutex::new(HistogramData { counts: vec![0; bounds.len() + 1], sum: 0.0, count: 0 }) }
    }

    pub fn observe(&self, v: f64) {
        let i = self.bounds.iter().position(|&b| v <= b).unwrap_or(self.bounds.len());
        let mut d = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        d.counts[i] += 1;
        d.sum += v;
        d.count += 1;
    }

    pub fn bounds(&self) -> &'static [f64] {
        self.bounds
    }

    pub fn snapshot(&self) -> HistogramData {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// vLLM's buckets for time to first token (seconds).
pub const TTFT_BUCKETS: &[f64] =
    &[0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0];
/// vLLM's buckets for inter-token latency (seconds).
pub const ITL_BUCKETS: &[f64] =
    &[0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0];
/// vLLM's buckets for end-to-end request latency (seconds).
pub const E2E_BUCKETS: &[f64] =
    &[0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0];

/// All engine metrics. Gauges are set after every step; counters only grow.
#[derive(Debug)]
pub struct EngineMetrics {
    pub num_requests_running: AtomicU64,
    pub num_requests_waiting: AtomicU64,
    /// KV blocks in use by requests (cached-but-free blocks not counted).
    pub kv_blocks_used: AtomicU64,
    pub kv_blocks_total: AtomicU64,
    pub prompt_tokens_total: AtomicU64,
    pub generation_tokens_total: AtomicU64,
    pub num_preemptions_total: AtomicU64,
    /// Prompt tokens looked up in the prefix cache, and those found.
    pub prefix_cache_queries_total: AtomicU64,
    pub prefix_cache_hits_total: AtomicU64,
    /// Tokens actually run through the model (prefill + decode), for the "computed tokens" checks.
    pub computed_tokens_total: AtomicU64,
    /// Finished requests by `FinishReason` (indexed by `FinishReason::index`): vLLM's `finished_reason` label.
    pub requests_finished: [AtomicU64; 3],
    pub ttft: Histogram,
    pub itl: Histogram,
    pub e2e: Histogram,
}

impl Default for EngineMetrics {
    fn default() -> Self {
        Self {
            num_requests_running: AtomicU64::new(0),
            num_requests_waiting: AtomicU64::new(0),
            kv_blocks_used: AtomicU64::new(0),
            kv_blocks_total: AtomicU64::new(0),
            prompt_tokens_total: AtomicU64::new(0),
            generation_tokens_total: AtomicU64::new(0),
            num_preemptions_total: AtomicU64::new(0),
            prefix_cache_queries_total: AtomicU64::new(0),
            prefix_cache_hits_total: AtomicU64::new(0),
            computed_tokens_total: AtomicU64::new(0),
            requests_finished: Default::default(),
            ttft: Histogram::new(TTFT_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
            e2e: Histogram::new(E2E_BUCKETS),
        }
    }
}

impl EngineMetrics {
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    /// Counts one finished request.
    pub fn count_finished(&self, reason: FinishReason) {
        self.requests_finished[reason.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Requests that finished for `reason`.
    pub fn finished(&self, reason: FinishReason) -> u64 {
        Self::get(&self.requests_finished[reason.index()])
    }

    /// Fraction of KV blocks in use, 0..=1.
    pub fn kv_cache_usage(&self) -> f64 {
        let total = Self::get(&self.kv_blocks_total);
        if total == 0 {
            0.0
        } else {
            Self::get(&self.kv_blocks_used) as f64 / total as f64
        }
    }
}
