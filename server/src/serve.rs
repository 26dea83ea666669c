//! `rserve serve`: check the front flags (CORS, TLS, root path, connection limits), start the engine (its `-dp`
//! replicas: `dp`), bind the
//! listener (HTTP or HTTPS), serve the API (`conn`) until SIGINT/SIGTERM, then drain running requests (up to
//! `--shutdown-timeout`), stop the engine and return (exit code 0). When the engine dies the server shuts down the same
//! way and returns an error (exit code 1), unless `VLLM_KEEP_ALIVE_ON_ENGINE_DEATH` keeps it up (`engine_watch`).

mod conn;
mod engine_watch;

use crate::openai::tools::ToolSettings;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rserve_engine::engine::EngineConfig;
use tokio::net::TcpListener;
use tower_http::cors::CorsLayer;

use crate::app::{self, AccessLog};
use crate::cli::{self, CliError, ServeArgs};
use crate::cors::CorsSettings;
use crate::dp;
use crate::port::Engine;
use crate::shutdown;
use crate::state::{AppState, ServerInfo, ServerSettings};
use crate::stats_log;
use crate::tls::{TlsFiles, TlsListener};

/// Runs the server to completion.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let model = args.engine.resolve_model(args.model_tag.as_deref())?;
    let mut config = args.engine.engine_config(&model, args.engine.scheduler.max_num_waiting)?;
    let replicas = args.engine.parallel.data_parallel_size;
    rserve_engine::engine::replicas::check(replicas)?;
    // Under `mpiexec`, ranks other than 0 hold their model shard and follow rank 0's steps; only rank 0 serves.
    if rserve_engine::engine::run_if_worker(&config)? {
        return Ok(());
    }
    let served_model_names = args.served_model_names(&model)?;
    // The metrics' `model_name` label, as vLLM's: the first served name.
    config.served_model_name = served_model_names.first().cloned();
    let grace = args.shutdown_timeout()?;
    tracing::info!("rserve {} serving model {model:?} as {served_model_names:?}", env!("CARGO_PKG_VERSION"));
    if args.engine.model.trust_remote_code {
        tracing::info!("--trust-remote-code is accepted for compatibility and changes nothing");
    }
    // One line per vLLM flag accepted without effect, naming it and why (`cli::vllm_flags`).
    for notice in &args.notices {
        tracing::warn!("{notice}");
    }
    let settings = ServerSettings {
        served_model_names,
        api_keys: args.frontend.api_keys()?,
        default_chat_template_kwargs: args.frontend.default_chat_template_kwargs.clone().unwrap_or_default().0,
        max_num_waiting: args.engine.scheduler.max_num_waiting,
        max_num_queued_reqs: args.engine.scheduler.max_num_queued_reqs,
        access_log_skip: args.frontend.access_log_skip(),
        request_id_headers: args.frontend.enable_request_id_headers,
        log_requests: args.frontend.enable_log_requests,
        tools: ToolSettings {
            auto_tool_choice: args.frontend.enable_auto_tool_choice,
            parser: args.frontend.tool_call_parser,
        },
        reasoning: args.frontend.reasoning_parser,
        server_load_tracking: args.frontend.enable_server_load_tracking,
        dev_mode: cli::server_dev_mode()?.then(|| server_info(&args, &config)),
    };
    if args.frontend.enable_auto_tool_choice && args.frontend.tool_call_parser.is_none() {
        anyhow::bail!("--enable-auto-tool-choice needs --tool-call-parser (llama3_json, hermes or mistral)");
    }
    // Every front flag is checked before the model loads: a typo costs no loading time.
    let front = Front::from_args(&args)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting tokio")?;
    let result = runtime.block_on(async move {
        // Watch signals from the start, so that one sent while the model loads still ends in a clean exit.
        let signals = shutdown::watch_signals(grace);
        let engine = tokio::task::spawn_blocking(move || dp::start(config, replicas))
            .await
            .context("the engine start-up task failed")?
            .context("starting the engine")?;
        if *signals.first.borrow() {
            engine.shutdown();
            tracing::info!("Shutdown requested during start-up.");
            tracing::info!("Shutdown complete.");
            return Ok(());
        }
        serve(engine, settings, &args, front, signals, grace).await
    });
    runtime.shutdown_timeout(Duration::from_secs(2));
    result
}

/// The HTTP front's flags, checked: CORS, TLS, root path.
pub struct Front {
    cors: CorsLayer,
    tls: Option<Arc<rustls::ServerConfig>>,
    /// The files to watch for `--enable-ssl-refresh`.
    tls_refresh: Option<TlsFiles>,
    root_path: Option<String>,
    /// `--http-header-timeout`, `--http-body-timeout`, `--max-connections`.
    limits: cli::limits::ConnLimits,
    /// `VLLM_KEEP_ALIVE_ON_ENGINE_DEATH`: stay up (answering 503) after the engine died.
    keep_alive_on_engine_death: bool,
}

impl Front {
    /// Checks the flags and reads the TLS files (a bad path or file is a start-up error naming the flag).
    pub fn from_args(args: &ServeArgs) -> anyhow::Result<Self> {
        let f = &args.frontend;
        let cors = CorsSettings {
            allowed_origins: f.allowed_origins.0.clone(),
            allowed_methods: f.allowed_methods.0.clone(),
            allowed_headers: f.allowed_headers.0.clone(),
            allow_credentials: f.allow_credentials,
        }
        .layer()?;
        let mut tls_refresh = None;
        let tls = match (&f.ssl_keyfile, &f.ssl_certfile) {
            (Some(keyfile), Some(certfile)) => {
                if f.ssl_cert_reqs != 0 && f.ssl_ca_certs.is_none() {
                    return Err(CliError::SslCertReqsWithoutCa(f.ssl_cert_reqs).into());
                }
                let files = TlsFiles {
                    keyfile: keyfile.clone(),
                    certfile: certfile.clone(),
                    ca_certs: f.ssl_ca_certs.clone(),
                    cert_reqs: f.ssl_cert_reqs,
                };
                let config = files.server_config()?;
                tls_refresh = f.enable_ssl_refresh.then_some(files);
                Some(config)
            }
            (None, None) if f.ssl_ca_certs.is_some() || f.ssl_cert_reqs != 0 => {
                return Err(CliError::SslWithoutHttps.into())
            }
            (None, None) => None,
            _ => return Err(CliError::SslPair.into()),
        };
        if f.enable_ssl_refresh && tls.is_none() {
            tracing::warn!("Ignoring --enable-ssl-refresh: HTTPS is off (no --ssl-keyfile / --ssl-certfile)");
        }
        Ok(Self {
            cors,
            tls,
            tls_refresh,
            root_path: args.root_path()?,
            limits: f.limits.limits()?,
            keep_alive_on_engine_death: cli::env::keep_alive_on_engine_death()?,
        })
    }
}

/// What `/server_info` reports as the configuration (the flags that shape serving, never the API key).
fn server_info(args: &ServeArgs, config: &EngineConfig) -> ServerInfo {
    use serde_json::json;
    let config = vec![
        ("model", json!(config.model)),
        ("tokenizer", json!(config.tokenizer.as_deref().unwrap_or(&config.model))),
        ("revision", json!(config.revision)),
        ("dtype", json!(format!("{:?}", config.dtype).to_lowercase())),
        ("max_model_len", json!(config.max_model_len)),
        ("device", json!(config.device)),
        ("tensor_parallel_size", json!(config.tensor_parallel_size)),
        ("pipeline_parallel_size", json!(config.pipeline_parallel_size)),
        ("data_parallel_size", json!(args.engine.parallel.data_parallel_size)),
        ("seed", json!(config.seed)),
        ("served_model_name", json!(args.engine.model.served_model_name)),
        ("enable_prefix_caching", json!(config.enable_prefix_caching)),
        ("block_size", json!(config.block_size)),
        ("gpu_memory_utilization", json!(config.gpu_memory_utilization)),
        ("kv_cache_memory_bytes", json!(config.kv_cache_memory_bytes)),
        ("max_num_seqs", json!(config.max_num_seqs)),
        ("max_num_batched_tokens", json!(config.max_num_batched_tokens)),
        ("enforce_eager", json!(config.enforce_eager)),
        ("async_scheduling", json!(config.async_scheduling)),
        ("generation_config", json!(config.generation_config)),
    ];
    ServerInfo { config }
}

/// Serves `engine` until a shutdown signal, then drains and stops it.
pub async fn serve(
    engine: Arc<dyn Engine>,
    settings: ServerSettings,
    args: &ServeArgs,
    front: Front,
    signals: shutdown::Signals,
    grace: Duration,
) -> anyhow::Result<()> {
    let dev_mode = settings.dev_mode.is_some();
    if dev_mode {
        tracing::warn!("SECURITY WARNING: Development endpoints are enabled! This should NOT be used in production!");
    }
    let state = AppState::new(engine.clone(), settings);
    let access = AccessLog(!args.frontend.disable_uvicorn_access_log);
    let router = app::front(app::router(state.clone(), access), front.cors, front.root_path);
    let host = args.frontend.host.as_str();
    let listener = TcpListener::bind((host, args.frontend.port))
        .await
        .with_context(|| format!("cannot listen on {host}:{}", args.frontend.port))?;
    let addr = listener.local_addr().context("reading the bound address")?;
    let scheme = if front.tls.is_some() { "https" } else { "http" };
    // vLLM's lines: scripts wait for the first and read the address from it.
    tracing::info!("Starting vLLM API server 0 on {scheme}://{addr}");
    tracing::info!("Available routes are:");
    for (path, methods) in app::listed_routes(dev_mode) {
        tracing::info!("Route: {path}, Methods: {methods}");
    }
    let stats = (!args.frontend.disable_log_stats).then(|| tokio::spawn(stats_log::run(engine.clone())));

    let first = signals.first.clone();
    let draining = state.clone();
    let died = Arc::new(AtomicBool::new(false));
    let (watched, died_flag, keep_alive) = (engine.clone(), died.clone(), front.keep_alive_on_engine_death);
    // Set when the shutdown begins, for a signal or the engine's death: the grace period runs from then.
    let (begun_tx, begun) = tokio::sync::watch::channel(false);
    let until_shutdown = async move {
        tokio::select! {
            () = shutdown::flag(first) => {}
            () = engine_watch::died(watched), if !keep_alive => {
                died_flag.store(true, Ordering::SeqCst);
                tracing::error!(
                    "The engine died: shutting down the API server so that its supervisor can restart it \
                     (VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1 keeps it up, answering 503)"
                );
            }
        }
        draining.begin_shutdown();
        let _ = begun_tx.send(true);
    };
    let limits = front.limits;
    let mut server: Pin<Box<dyn Future<Output = ()> + Send>> = match front.tls {
        Some(config) => {
            let listener =
                TlsListener::new(listener, config, front.tls_refresh).context("starting the TLS listener")?;
            Box::pin(conn::serve(listener, router, limits, until_shutdown))
        }
        None => Box::pin(conn::serve(listener, router, limits, until_shutdown)),
    };
    tracing::info!("Application startup complete.");

    let deadline = async {
        shutdown::flag(begun).await;
        tokio::select! {
            _ = tokio::time::sleep(grace) => "the shutdown timeout passed",
            _ = shutdown::flag(signals.second.clone()) => "a second signal arrived",
        }
    };
    tokio::select! {
        () = &mut server => {}
        why = deadline => tracing::warn!("{why}: aborting {} unfinished requests", state.in_flight()),
    }
    drop(server);
    if let Some(task) = stats {
        task.abort();
    }
    engine.shutdown();
    tracing::info!("Shutdown complete.");
    if died.load(Ordering::SeqCst) {
        anyhow::bail!("the engine died (see the error above); exiting so that the server is restarted");
    }
    Ok(())
}
