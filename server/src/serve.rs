//! `rserve serve`: start the engine, bind the listener, serve the API until SIGINT/SIGTERM, then drain running
//! requests (up to `--shutdown-timeout`), stop the engine and return (exit code 0).

use crate::openai::tools::ToolSettings;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;

use crate::app::{self, AccessLog};
use crate::cli::ServeArgs;
use crate::live::LiveEngine;
use crate::port::Engine;
use crate::shutdown;
use crate::state::{AppState, ServerSettings};
use crate::stats_log;

/// Runs the server to completion.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let model = args.engine.resolve_model(args.model_tag.as_deref())?;
    let config = args.engine.engine_config(&model, args.engine.scheduler.max_num_waiting)?;
    // Under `mpiexec`, ranks other than 0 hold their model shard and follow rank 0's steps; only rank 0 serves.
    if rserve_engine::engine::run_if_worker(&config)? {
        return Ok(());
    }
    let served_model_names = args.served_model_names(&model)?;
    let grace = args.shutdown_timeout()?;
    tracing::info!("rserve {} serving model {model:?} as {served_model_names:?}", env!("CARGO_PKG_VERSION"));
    if args.engine.model.trust_remote_code {
        tracing::info!("--trust-remote-code is accepted for compatibility and changes nothing");
    }
    let settings = ServerSettings {
        served_model_names,
        api_key: args.frontend.api_key.clone().filter(|k| !k.is_empty()),
        max_num_waiting: args.engine.scheduler.max_num_waiting,
        log_requests: args.frontend.enable_log_requests,
        tools: ToolSettings {
            auto_tool_choice: args.frontend.enable_auto_tool_choice,
            parser: args.frontend.tool_call_parser,
        },
    };
    if args.frontend.enable_auto_tool_choice && args.frontend.tool_call_parser.is_none() {
        anyhow::bail!("--enable-auto-tool-choice needs --tool-call-parser (llama3_json, hermes or mistral)");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting tokio")?;
    let result = runtime.block_on(async move {
        // Watch signals from the start, so that one sent while the model loads still ends in a clean exit.
        let signals = shutdown::watch_signals(grace);
        let engine = tokio::task::spawn_blocking(move || LiveEngine::start(config))
            .await
            .context("the engine start-up task failed")?
            .context("starting the engine")?;
        if *signals.first.borrow() {
            engine.shutdown();
            tracing::info!("Shutdown requested during start-up.");
            tracing::info!("Shutdown complete.");
            return Ok(());
        }
        serve(Arc::new(engine), settings, &args, signals, grace).await
    });
    runtime.shutdown_timeout(Duration::from_secs(2));
    result
}

/// Serves `engine` until a shutdown signal, then drains and stops it.
pub async fn serve(
    engine: Arc<dyn Engine>,
    settings: ServerSettings,
    args: &ServeArgs,
    signals: shutdown::Signals,
    grace: Duration,
) -> anyhow::Result<()> {
    let state = AppState::new(engine.clone(), settings);
    let access = AccessLog(!args.frontend.disable_uvicorn_access_log);
    let router = app::router(state.clone(), access);
    let host = args.frontend.host.as_str();
    let listener = TcpListener::bind((host, args.frontend.port))
        .await
        .with_context(|| format!("cannot listen on {host}:{}", args.frontend.port))?;
    let addr = listener.local_addr().context("reading the bound address")?;
    // vLLM's lines: scripts wait for the first and read the address from it.
    tracing::info!("Starting vLLM API server 0 on http://{addr}");
    tracing::info!("Available routes are:");
    for (path, methods) in app::ROUTES {
        tracing::info!("Route: {path}, Methods: {methods}");
    }
    let stats = (!args.frontend.disable_log_stats).then(|| tokio::spawn(stats_log::run(engine.clone())));

    let first = signals.first.clone();
    let draining = state.clone();
    let server = axum::serve(listener, router.into_make_service_with_connect_info::<SocketAddr>())
        .with_graceful_shutdown(async move {
            shutdown::flag(first).await;
            draining.begin_shutdown();
        });
    let mut server = Box::pin(std::future::IntoFuture::into_future(server));
    tracing::info!("Application startup complete.");

    let deadline = async {
        shutdown::flag(signals.first.clone()).await;
        tokio::select! {
            _ = tokio::time::sleep(grace) => "the shutdown timeout passed",
            _ = shutdown::flag(signals.second.clone()) => "a second signal arrived",
        }
    };
    tokio::select! {
        result = &mut server => result.context("the HTTP server failed")?,
        why = deadline => tracing::warn!("{why}: aborting {} unfinished requests", state.in_flight()),
    }
    drop(server);
    if let Some(task) = stats {
        task.abort();
    }
    engine.shutdown();
    tracing::info!("Shutdown complete.");
    Ok(())
}
