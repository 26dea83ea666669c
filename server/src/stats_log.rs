//! The periodic throughput line (like vLLM's): every interval while there is activity, running / waiting requests,
//! KV cache usage, prefix cache hit rate, and prompt / generation tokens per second over the interval.

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
        Self {
            prompt_tokens: m.prompt_tokens.get(),
            generation_tokens: m.generation_tokens.get(),
            prefix_queries: m.prefix_cache_queries.get(),
            prefix_hits: m.prefix_cache_hits.get(),
        }
    }
}

/// The line for one interval, or `None` when nothing happened (no tokens, nothing running or waiting).
pub fn line(m: &EngineMetrics, before: Snapshot, now: Snapshot, elapsed: Duration) -> Option<String> {
    let running = m.num_requests_running.get();
    let waiting = m.num_requests_waiting.get();
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

/// Logs the line every `INTERVAL` until the task is dropped: one per data-parallel replica, then prefixed with
/// `Engine 000: ` as vLLM's are.
pub async fn run(engine: std::sync::Arc<dyn Engine>) {
    let snapshots = || engine.replica_metrics().into_iter().map(Snapshot::take).collect::<Vec<_>>();
    let mut before = snapshots();
    let mut t0 = Instant::now();
    let mut ticker = tokio::time::interval(crate::cli::env::log_stats_interval(INTERVAL));
    ticker.tick().await;
    loop {
        ticker.tick().await;
        let now = snapshots();
        let replicas = engine.replica_metrics();
        for (i, m) in replicas.iter().enumerate() {
            if let Some(l) = line(m, before[i], now[i], t0.elapsed()) {
                match replicas.len() {
                    1 => tracing::info!("{l}"),
                    _ => tracing::info!("Engine {i:03}: {l}"),
                }
            }
        }
        before = now;
        t0 = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quiet_when_idle_and_rates_when_busy() {
        let m = EngineMetrics::default();
        let s0 = Snapshot::take(&m);
        assert_eq!(line(&m, s0, Snapshot::take(&m), Duration::from_secs(5)), None);
        m.prompt_tokens.inc_by(100);
        m.generation_tokens.inc_by(50);
        m.set_scheduler_state(2, 0, 1, 4);
        let l = line(&m, s0, Snapshot::take(&m), Duration::from_secs(5)).expect("a line");
        assert!(l.contains("Avg prompt throughput: 20.0 tokens/s"), "{l}");
        assert!(l.contains("Avg generation throughput: 10.0 tokens/s"), "{l}");
        assert!(l.contains("Running: 2 reqs, Waiting: 0 reqs, KV cache usage: 25.0%"), "{l}");
    }
}
