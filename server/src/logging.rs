//! Logging set-up: `tracing` to stderr, INFO by default, `RUST_LOG` respected; the HTTP access log's level follows
//! `--uvicorn-log-level`.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// The target of the HTTP access log lines.
pub const ACCESS_TARGET: &str = "rserve::access";

/// Installs the global subscriber. `access_level` is a uvicorn level name (critical … trace).
pub fn init(access_level: Option<&str>) {
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.trim().is_empty() => EnvFilter::new(v),
        _ => {
            let access = match access_level.unwrap_or("info") {
                "critical" | "error" => "error",
                "warning" => "warn",
                "debug" => "debug",
                "trace" => "trace",
                _ => "info",
            };
            EnvFilter::new(format!("info,{ACCESS_TARGET}={access}"))
        }
    };
    // A second initialisation (tests) is harmless; ignore it.
    // Colours only on a terminal (and never with NO_COLOR), so that logs written to files stay plain text.
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_target(false)
        .try_init();
}
