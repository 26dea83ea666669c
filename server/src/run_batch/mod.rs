//! `rserve run-batch -i IN.jsonl -o OUT.jsonl MODEL [serve flags]`, as `vllm run-batch`: an OpenAI batch file run
//! offline through the continuous-batching engine. `args` (the flags), `source` (where input lines come from),
//! `line` (one input line checked), `driver` (lines through the server's router, in process, many at once; answers
//! written as they complete), `output` (the output lines' shape), `resume` (an existing output file continued),
//! `progress` (bar or periodic line). Every input line gets exactly one output line, across reruns too.

mod args;
mod driver;
mod line;
mod output;
mod progress;
mod resume;
mod source;

pub use args::RunBatchArgs;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::routing::get;
use tokio::sync::mpsc;

use crate::app::{self, AccessLog};
use crate::dp;
use crate::openai::tools::ToolSettings;
use crate::port::Engine;
use crate::routes;
use crate::state::{AppState, ServerSettings};
use crate::stats_log;
use progress::Progress;
use source::Source;

/// Input lines read ahead of the requests in flight.
const READ_AHEAD: usize = 1024;

/// Runs the batch to the end of its input.
pub fn run(args: RunBatchArgs) -> anyhow::Result<()> {
    let model = args.model()?;
    let mut config = args.engine.engine_config(&model, args.engine.scheduler.max_num_waiting)?;
    let replicas = args.engine.parallel.data_parallel_size;
    rserve_engine::engine::replicas::check(replicas)?;
    // Under `mpiexec`, ranks other than 0 hold their model shard and follow rank 0's steps; only rank 0 runs the batch.
    if rserve_engine::engine::run_if_worker(&config)? {
        return Ok(());
    }
    let served_model_names = args.served_model_names(&model)?;
    config.served_model_name = served_model_names.first().cloned();
    let out_path = args.output_path()?;
    for notice in &args.notices {
        tracing::warn!("{notice}");
    }
    if args.output_tmp_dir.is_some() {
        tracing::warn!("Ignoring --output-tmp-dir: rserve writes the output file itself (no upload to a URL)");
    }
    // The input and output are opened before the model loads: a typo costs no loading time.
    let source = Source::new(&args.input_file);
    let reader = source.open().with_context(|| format!("opening the batch input {}", args.input_file))?;
    let (out, done) = resume::open(&out_path).with_context(|| format!("opening {}", out_path.display()))?;
    if done.lines > 0 {
        tracing::info!(
            "Resuming {}: the {} input lines it already answers are skipped",
            out_path.display(),
            done.lines
        );
    }
    let total = source.count_lines().map(|n| n.saturating_sub(done.lines));
    // vLLM's bound: twice the running sequences (of every `-dp` replica), so the next requests wait in the engines'
    // queues, not in ours.
    let concurrency = 2 * args.engine.scheduler.max_num_seqs * replicas;
    let log_requests = args.enable_log_requests;
    tracing::info!(
        "rserve {} batch: {} -> {}, model {model:?}",
        env!("CARGO_PKG_VERSION"),
        args.input_file,
        out_path.display()
    );

    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting tokio")?;
    let result = runtime.block_on(async move {
        let metrics_listener = if args.enable_metrics {
            let bound = tokio::net::TcpListener::bind((args.url.as_str(), args.port)).await;
            Some(bound.with_context(|| format!("--enable-metrics: cannot listen on {}:{}", args.url, args.port))?)
        } else {
            None
        };
        let engine: Arc<dyn Engine> = tokio::task::spawn_blocking(move || dp::start(config, replicas))
            .await
            .context("the engine start-up task failed")?
            .context("starting the engine")?;
        let state = AppState::new(engine.clone(), ServerSettings { log_requests, ..settings(served_model_names) });
        if let Some(listener) = metrics_listener {
            tracing::info!("Prometheus metrics at http://{}/metrics", listener.local_addr()?);
            let metrics =
                axum::Router::new().route("/metrics", get(routes::metrics::handler)).with_state(state.clone());
            tokio::spawn(async move { axum::serve(listener, metrics).await });
        }
        let tokens = {
            let engine = engine.clone();
            Box::new(move || engine.replica_metrics().iter().map(|m| m.generation_tokens.get()).sum())
        };
        let progress = Progress::new(total, tokens);
        let reporter = tokio::spawn(progress.clone().report_periodically());
        let stats = (!args.disable_log_stats && !std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .then(|| tokio::spawn(stats_log::run(engine.clone())));
        let (tx, rx) = mpsc::channel(READ_AHEAD);
        std::thread::Builder::new()
            .name("batch-input".into())
            .spawn(move || source::pump(reader, tx))
            .context("starting the input reader")?;
        let router = app::router(state, AccessLog(false));
        let start = Instant::now();
        let result = driver::run(router, rx, done, out, progress.clone(), concurrency).await;
        progress.finish();
        reporter.abort();
        if let Some(task) = stats {
            task.abort();
        }
        engine.shutdown();
        let summary = result?;
        tracing::info!(
            "Batch complete: {} lines written ({} error lines), {} skipped as already answered, in {:.1} s \
             ({:.1} output tokens/s)",
            summary.written,
            summary.errors,
            summary.skipped,
            start.elapsed().as_secs_f64(),
            progress.tokens_per_s()
        );
        anyhow::Ok(())
    });
    runtime.shutdown_timeout(Duration::from_secs(2));
    result
}

/// The router's settings for a batch: no API key, no admission limits (the driver bounds what is in flight), the
/// served names of `serve`.
fn settings(served_model_names: Vec<String>) -> ServerSettings {
    ServerSettings {
        served_model_names,
        api_keys: Vec::new(),
        default_chat_template_kwargs: serde_json::Map::new(),
        max_num_waiting: usize::MAX,
        access_log_skip: Vec::new(),
        request_id_headers: false,
        max_num_queued_reqs: None,
        log_requests: false,
        tools: ToolSettings { auto_tool_choice: false, parser: None },
        reasoning: None,
        server_load_tracking: false,
        dev_mode: None,
    }
}
