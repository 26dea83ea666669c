//! Runs the load: sends each request at its arrival time (see [`super::arrival`]), at most `max_concurrency` in
//! flight, each as a streaming request on its own task, with a progress bar; returns the outcomes in request order
//! (each with the time it waited for a slot) and the wall-clock duration. Also the untimed warm-up requests.

use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use tokio::sync::Semaphore;

use super::arrival::{arrival_times, ArrivalShape};
use super::client::{Client, RequestSettings, RequestSpec};
use super::error::BenchError;
use super::metrics::RequestOutcome;

/// How the load is offered.
#[derive(Debug, Clone)]
pub struct LoadShape {
    pub arrivals: ArrivalShape,
    /// `None`: unbounded.
    pub max_concurrency: Option<usize>,
    pub seed: u64,
    pub show_progress: bool,
}

fn progress_bar(n: usize, show: bool) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(n as u64);
    if let Ok(style) = ProgressStyle::with_template("{bar:40} {pos}/{len} requests [{elapsed_precise}<{eta_precise}]") {
        bar.set_style(style);
    }
    bar
}

/// Sends `n` copies of `spec` (vLLM's warm-up: the first prompt), at most `max_concurrency` at a time, and waits
/// for them; their outcomes are dropped.
pub async fn warm_up(
    client: &Client,
    settings: &RequestSettings,
    spec: &RequestSpec,
    n: usize,
    max_concurrency: Option<usize>,
) {
    let permits = Arc::new(Semaphore::new(max_concurrency.unwrap_or(Semaphore::MAX_PERMITS).max(1)));
    let settings = Arc::new(settings.clone());
    let start = Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (client, settings, permits, spec) = (client.clone(), settings.clone(), permits.clone(), spec.clone());
            tokio::spawn(async move {
                let _permit = permits.acquire_owned().await.ok();
                client.stream_request(&settings, &spec, start).await
            })
        })
        .collect();
    for t in tasks {
        // A warm-up request's result (or a failed task) does not matter.
        let _ = t.await;
    }
}

/// Sends every request of `specs` and waits for all of them.
pub async fn run_load(
    client: &Client,
    settings: &RequestSettings,
    specs: &[RequestSpec],
    shape: &LoadShape,
) -> Result<(Vec<RequestOutcome>, Duration), BenchError> {
    let arrivals = arrival_times(specs.len(), &shape.arrivals, shape.seed)
        .map_err(|m| BenchError::arg("--request-rate/--burstiness/--ramp-up-*", m))?;
    let permits = Arc::new(Semaphore::new(shape.max_concurrency.unwrap_or(Semaphore::MAX_PERMITS).max(1)));
    let bar = progress_bar(specs.len(), shape.show_progress);
    let settings = Arc::new(settings.clone());
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(specs.len());
    for (spec, at) in specs.iter().zip(arrivals) {
        tokio::time::sleep_until((start + Duration::from_secs_f64(at)).into()).await;
        let arrived = Instant::now();
        let (client, settings, permits, bar, spec) =
            (client.clone(), settings.clone(), permits.clone(), bar.clone(), spec.clone());
        tasks.push(tokio::spawn(async move {
            // The semaphore is never closed, so acquiring can only fail if it were; run unthrottled then.
            let _permit = permits.acquire_owned().await.ok();
            let queue_time = arrived.elapsed().as_secs_f64();
            let mut out = client.stream_request(&settings, &spec, start).await;
            out.queue_time = queue_time;
            bar.inc(1);
            out
        }));
    }
    let mut outcomes = Vec::with_capacity(tasks.len());
    for (t, spec) in tasks.into_iter().zip(specs) {
        outcomes.push(t.await.unwrap_or_else(|e| RequestOutcome {
            prompt_len: spec.prompt_len,
            error: format!("request task failed: {e}"),
            ..Default::default()
        }));
    }
    let duration = start.elapsed();
    bar.finish_and_clear();
    Ok((outcomes, duration))
}
