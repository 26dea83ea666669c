//! Runs the load: sends each prompt at its arrival time (Poisson or all at once), at most `max_concurrency` in
//! flight, each as a streaming request on its own task, with a progress bar; returns the outcomes in prompt order
//! and the wall-clock duration.

use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use tokio::sync::Semaphore;

use super::arrival::{arrival_times, RequestRate};
use super::client::{Client, RequestSettings, RequestSpec};
use super::dataset::SampleRequest;
use super::metrics::RequestOutcome;

/// How the load is offered.
#[derive(Debug, Clone)]
pub struct LoadShape {
    pub request_rate: RequestRate,
    /// `None`: unbounded.
    pub max_concurrency: Option<usize>,
    pub seed: u64,
    pub show_progress: bool,
}

/// Sends every request of `requests` and waits for all of them.
pub async fn run_load(
    client: &Client,
    settings: &RequestSettings,
    requests: &[SampleRequest],
    shape: &LoadShape,
) -> (Vec<RequestOutcome>, Duration) {
    let arrivals = arrival_times(requests.len(), shape.request_rate, shape.seed);
    let permits = Arc::new(Semaphore::new(shape.max_concurrency.unwrap_or(Semaphore::MAX_PERMITS).max(1)));
    let bar = if shape.show_progress {
        let bar = ProgressBar::new(requests.len() as u64);
        if let Ok(style) =
            ProgressStyle::with_template("{bar:40} {pos}/{len} requests [{elapsed_precise}<{eta_precise}]")
        {
            bar.set_style(style);
        }
        bar
    } else {
        ProgressBar::hidden()
    };
    let settings = Arc::new(settings.clone());
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(requests.len());
    for (req, at) in requests.iter().zip(arrivals) {
        tokio::time::sleep_until((start + Duration::from_secs_f64(at)).into()).await;
        let spec =
            RequestSpec { prompt: req.prompt.clone(), prompt_len: req.prompt_len, max_tokens: req.expected_output_len };
        let (client, settings, permits, bar) = (client.clone(), settings.clone(), permits.clone(), bar.clone());
        tasks.push(tokio::spawn(async move {
            // The semaphore is never closed, so acquiring can only fail if it were; run unthrottled then.
            let _permit = permits.acquire_owned().await.ok();
            let out = client.stream_request(&settings, &spec, start).await;
            bar.inc(1);
            out
        }));
    }
    let mut outcomes = Vec::with_capacity(tasks.len());
    for (t, req) in tasks.into_iter().zip(requests) {
        outcomes.push(t.await.unwrap_or_else(|e| RequestOutcome {
            prompt_len: req.prompt_len,
            error: format!("request task failed: {e}"),
            ..Default::default()
        }));
    }
    let duration = start.elapsed();
    bar.finish_and_clear();
    (outcomes, duration)
}
