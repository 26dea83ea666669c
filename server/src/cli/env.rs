//! The `VLLM_*` environment variables of `vllm serve` that matter to users, and what rserve does with each (README's
//! table is written from `ENV_VARS`). The readers live where the value is used (`logging`, `auth` through clap's
//! `env`, `dev_mode`); this file holds the table and the small readers without a better home.

use std::time::Duration;

/// One variable and what rserve does with it.
#[derive(Debug, Clone, Copy)]
pub struct EnvVar {
    pub name: &'static str,
    /// Whether rserve reads it.
    pub read: bool,
    pub what: &'static str,
}

/// The table, in README's order.
pub static ENV_VARS: &[EnvVar] = &[
    EnvVar { name: "VLLM_API_KEY", read: true, what: "the API key when --api-key is not given" },
    EnvVar {
        name: "VLLM_LOGGING_LEVEL",
        read: true,
        what: "log level (DEBUG, INFO, WARNING, ERROR, CRITICAL) when --log-level is not given; default INFO",
    },
    EnvVar {
        name: "VLLM_CONFIGURE_LOGGING",
        read: true,
        what: "0: rserve sets no level of its own and logs warnings and errors only (Python's default)",
    },
    EnvVar {
        name: "VLLM_LOGGING_STREAM",
        read: true,
        what: "ext://sys.stdout logs to stdout; default stderr (vLLM's default is stdout)",
    },
    EnvVar { name: "VLLM_LOGGING_PREFIX", read: true, what: "text put before every log line" },
    EnvVar {
        name: "VLLM_LOGGING_COLOR",
        read: true,
        what: "1 always colours the log, 0 never; default: on a terminal, unless NO_COLOR (FORCE_COLOR forces it)",
    },
    EnvVar {
        name: "VLLM_LOG_STATS_INTERVAL",
        read: true,
        what: "seconds between the throughput log lines (default 5)",
    },
    EnvVar {
        name: "VLLM_SERVER_DEV_MODE",
        read: true,
        what: "1 serves the development routes (/server_info, /reset_prefix_cache)",
    },
    EnvVar {
        name: "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH",
        read: true,
        what: "1 keeps the server up after its engine died (/health and new requests answer 503); by default the \
               server shuts down and exits with code 1, so that a supervisor restarts it, as vLLM does",
    },
    EnvVar {
        name: "VLLM_HTTP_TIMEOUT_KEEP_ALIVE",
        read: true,
        what: "seconds an idle keep-alive connection stays open (default 5): the default of --http-header-timeout",
    },
    EnvVar {
        name: "VLLM_HOST_IP",
        read: false,
        what: "vLLM's address for its distributed rendezvous; rserve's ranks meet through MPI, and the server \
               listens on --host",
    },
    EnvVar {
        name: "VLLM_PORT",
        read: false,
        what: "vLLM's first internal communication port, not the API port; rserve's ranks use MPI, the API --port",
    },
    EnvVar {
        name: "VLLM_NO_USAGE_STATS",
        read: false,
        what: "rserve sends no usage statistics anywhere (also VLLM_DO_NOT_TRACK, DO_NOT_TRACK)",
    },
    EnvVar {
        name: "HF_TOKEN, HF_HOME, HF_HUB_CACHE, HF_HUB_OFFLINE, HF_ENDPOINT",
        read: true,
        what: "the Hugging Face Hub settings, as huggingface_hub reads them (--download-dir and --hf-token win)",
    },
];

/// `VLLM_LOG_STATS_INTERVAL` (seconds, > 0) or the default.
pub fn log_stats_interval(default: Duration) -> Duration {
    std::env::var("VLLM_LOG_STATS_INTERVAL")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .map(Duration::from_secs_f64)
        .unwrap_or(default)
}

/// vLLM's `VLLM_KEEP_ALIVE_ON_ENGINE_DEATH` (an integer, 0 by default, read as `bool(int(value))`): nonzero keeps
/// the server up after its engine died.
pub const KEEP_ALIVE_ON_ENGINE_DEATH: &str = "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH";

/// Reads `VLLM_KEEP_ALIVE_ON_ENGINE_DEATH`.
pub fn keep_alive_on_engine_death() -> Result<bool, super::CliError> {
    match std::env::var(KEEP_ALIVE_ON_ENGINE_DEATH) {
        Err(_) => Ok(false),
        Ok(v) => {
            v.trim().parse::<i64>().map(|n| n != 0).map_err(|_| super::CliError::Env(KEEP_ALIVE_ON_ENGINE_DEATH, v))
        }
    }
}
