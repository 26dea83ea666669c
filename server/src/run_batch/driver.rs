//! The batch run: each input line goes through the server's own router, in process (`tower::ServiceExt::oneshot`),
//! so a line's answer is what `POST /v1/chat/completions` or `/v1/completions` answers over HTTP: the same
//! validation, sampling defaults, chat template and response building, with no second code path to drift. Up to
//! `concurrency` requests are in flight at once (vLLM's `2 * max_num_seqs`), which keeps the continuous-batching
//! engine full while a million-line file holds only that many requests in memory. Answers are written as they
//! complete, one flushed line each, by one writer thread; lines that never reach a route are answered by the reading
//! loop, in input order (which `resume` relies on).

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, HeaderValue, Method, Request, StatusCode, Uri};
use axum::Router;
use tokio::sync::{mpsc, Semaphore};
use tower::ServiceExt;

use super::line::BatchRequest;
use super::output;
use super::progress::Progress;
use super::resume::Done;
use super::source::Item;

/// What ends a batch before its input does.
#[derive(Debug, thiserror::Error)]
pub enum RunBatchError {
    #[error("reading the batch input: {0}")]
    Input(io::Error),
    #[error("writing the batch output: {0}")]
    Output(io::Error),
    /// The engine is gone: the lines not yet answered are left for a rerun, not written as errors.
    #[error("the engine stopped ({0}); rerun the same command to resume")]
    EngineStopped(String),
    #[error("the output writer failed: {0}")]
    Writer(String),
}

/// How a batch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// Lines written by this run, and of them error lines.
    pub written: u64,
    pub errors: u64,
    /// Input lines answered by an earlier run.
    pub skipped: u64,
}

/// A finished line for the writer, or the reason to stop.
enum Finished {
    Line { text: String, error: bool },
    Fatal(RunBatchError),
}

/// Runs every line `input` yields (skipping those in `done`) and appends the answers to `out`.
pub async fn run(
    router: Router,
    mut input: mpsc::Receiver<Item>,
    mut done: Done,
    out: File,
    progress: Arc<Progress>,
    concurrency: usize,
) -> Result<Summary, RunBatchError> {
    let concurrency = concurrency.max(1);
    let (tx, rx) = mpsc::channel::<Finished>(2 * concurrency);
    let writer = {
        let progress = progress.clone();
        tokio::task::spawn_blocking(move || write_lines(rx, out, &progress))
    };
    let permits = Arc::new(Semaphore::new(concurrency));
    let mut skipped = 0;
    let mut input_error = None;
    while let Some(item) = input.recv().await {
        if tx.is_closed() {
            break; // the writer stopped: its error is the run's
        }
        let parsed = match item {
            Item::Line(parsed) => parsed,
            Item::Failed(e) => {
                input_error = Some(e);
                break;
            }
        };
        let custom_id = match &parsed {
            Ok(request) => Some(request.custom_id.as_str()),
            Err(failure) => failure.custom_id.as_deref(),
        };
        if done.take(custom_id) {
            skipped += 1;
            continue;
        }
        match parsed {
            Err(failure) => {
                let line = Finished::Line { text: output::failure_line(&failure), error: true };
                if tx.send(line).await.is_err() {
                    break;
                }
            }
            Ok(request) => {
                let Ok(permit) = permits.clone().acquire_owned().await else { break };
                let (router, tx) = (router.clone(), tx.clone());
                tokio::spawn(async move {
                    let finished = answer(router, request).await;
                    drop(permit);
                    // A closed channel means the writer already stopped with the run's error.
                    let _ = tx.send(finished).await;
                });
            }
        }
    }
    drop(input); // ends the reader thread if it is still reading
    drop(tx);
    let written = writer.await.map_err(|e| RunBatchError::Writer(e.to_string()))?;
    written?;
    if let Some(e) = input_error {
        return Err(RunBatchError::Input(e));
    }
    let (written, errors) = progress.counts();
    Ok(Summary { written, errors, skipped })
}

/// One request through the router, as its output line.
async fn answer(router: Router, request: BatchRequest) -> Finished {
    let mut http = Request::new(Body::from(request.body));
    *http.method_mut() = Method::POST;
    *http.uri_mut() = Uri::from_static(request.url);
    http.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    let response = match router.oneshot(http).await {
        Ok(response) => response,
        Err(never) => match never {},
    };
    let status = response.status();
    let body = match axum::body::to_bytes(response.into_body(), usize::MAX).await {
        Ok(body) => body,
        Err(e) => return Finished::Fatal(RunBatchError::EngineStopped(format!("reading an answer failed: {e}"))),
    };
    // 503 is the engine gone (admission limits are off in a batch, and nothing shuts the router down).
    if status == StatusCode::SERVICE_UNAVAILABLE {
        return Finished::Fatal(RunBatchError::EngineStopped(String::from_utf8_lossy(&body).into_owned()));
    }
    let text = output::answer_line(Some(&request.custom_id), status.as_u16(), &body);
    Finished::Line { text, error: status != StatusCode::OK }
}

/// The writer thread: appends each line with its newline and flushes it, so a killed run loses at most the line
/// being written (which `resume` cuts off).
fn write_lines(mut rx: mpsc::Receiver<Finished>, out: File, progress: &Progress) -> Result<(), RunBatchError> {
    let mut out = BufWriter::new(out);
    while let Some(finished) = rx.blocking_recv() {
        match finished {
            Finished::Fatal(e) => return Err(e),
            Finished::Line { mut text, error } => {
                text.push('\n');
                out.write_all(text.as_bytes()).and_then(|()| out.flush()).map_err(RunBatchError::Output)?;
                progress.line_done(error);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "driver_tests.rs"]
mod tests;
