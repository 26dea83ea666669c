//! The periodic throughput line (like vLLM's): every interval while there is activity, running / waiting requests,
//! KV cache usage, prefix cache hit rate, and prompt / generation tokens per second over the interval.

use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use rserve_engine::engine::EngineMetrics;

use crate::port::Engine;

/// How often the line is logged.
pub const INTERVAL: Duration = Duration::from_secs(5);

/// Counter values at the start of an interval.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Snapshot {
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    pub prefix_queries: u64,
    pub prefix_hits: u64,
}

impl Snapshot {
    pub fn take(m: &EngineMetrics) -> Self {
        let g = |c: &AtomicU64| EngineMetrics::get(c);
        Self {
            prompt_tokens: g(&m.prompt_tokens_total),
            generation_tokens: g(&m.generation_tokens_total),
            prefix_queries: g(&m.prefix_cache_queries_total),
            prefix_hits: g(&m.prefix_cache_hits_total),
        }
    }
}

/// The line for one interval, or `None` when nothing happened (no tokens, nothing running or waiting).
pub fn line(m: &EngineMetrics, before: Snapshot, now: Snapshot, elapsed: Duration) -> Option<String> {
    let running = EngineMetrics::get(&m.num_requests_running);
    let waiting = EngineMetrics::get(&m.num_requests_waiting);
    let prompt = now.prompt_tokens.saturating_sub(before.prompt_tokens);
    let generation = now.generation_tokens.saturating_sub(before.generation_tokens);
    if running == 0 && waiting == 0 && prompt == 0 && generation == 0 {
        return None;
    }
    let secs = elapsed.as_secs_f64().max(1e-3);
    let queries = now.prefix_queries.saturating_sub(before.prefix_queries);
    let hits = now.prefix_hits.saturating_sub(before.prefix_hits);
    let hit_rate = if queries == 0 { 0.0 } else { 100.0 * hits as f64 / queries as f64 };
    Some(format!(
        "Avg prompt throughput: {:.1} tokens/s, Avg generation throughput: {:.1} tokens/s, Running: {running} reqs, \
         Waiting: {waiting} reqs, KV cache usage: {:.1}%, Prefix cache hit rate: {hit_rate:.1}%",
        prompt as f64 / secs,
        generation as f64 / secs,
        100.0 * m.kv_cache_usage(),
    ))
}

/// Logs the line every `INTERVAL` until the task is dropped.
pub async fn run(engine: std::sync::Arc<dyn Engine>) {
    let mut before = Snapshot::take(engine.metrics());
    let mut t0 = Instant::now();
    let mut ticker = tokio::time::interval(crate::cli::env::log_stats_interval(INTERVAL));
    ticker.tick().await;
    loop {
        ticker.tick().await;
        let now = Snapshot::take(engine.metrics());
        if let Some(l) = line(engine.metrics(), before, now, t0.elapsed()) {
            tracing::info!("{l}");
        }
        before = now;
        t0 = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;

    #[test]
    fn quiet_when_idle_and_rates_when_busy() {
        let m = EngineMetrics::default();
        let s0 = Snapshot::take(&m);
        assert_eq!(line(&m, s0, Snapshot::take(&m), Duration::from_secs(5)), None);
        m.prompt_tokens_total.store(100, Ordering::Relaxed);
        m.generation_tokens_total.store(50, Ordering::Relaxed);
        m.num_requests_running.store(2, Ordering::Relaxed);
        m.kv_blocks_total.store(4, Ordering::Relaxed);
        m.kv_blocks_used.store(1, Ordering::Relaxed);
        let l = line(&m, s0, Snapshot::take(&m), Duration::from_secs(5)).expect("a line");
        assert!(l.contains("Avg prompt throughput: 20.0 tokens/s"), "{l}");
        assert!(l.contains("Avg generation throughput: 10.0 tokens/s"), "{l}");
        assert!(l.contains("Running: 2 reqs, Waiting: 0 reqs, KV cache usage: 25.0%"), "{l}");
    }
}
