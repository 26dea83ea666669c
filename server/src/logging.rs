//! Logging set-up: `tracing` to stderr, INFO by default. The level comes from `--log-level`, else vLLM's
//! `VLLM_LOGGING_LEVEL`; `VLLM_CONFIGURE_LOGGING=0` leaves only warnings and errors (what Python prints when vLLM
//! configures no handler); `RUST_LOG` overrides all of it. `VLLM_LOGGING_STREAM`, `VLLM_LOGGING_PREFIX`,
//! `VLLM_LOGGING_COLOR` (with `NO_COLOR` / `FORCE_COLOR`) shape the output as in vLLM. The HTTP access log's level
//! follows `--uvicorn-log-level`.

use std::io::{IsTerminal, Write};

use tracing_subscriber::fmt::writer::BoxMakeWriter;
use tracing_subscriber::EnvFilter;

/// The target of the HTTP access log lines.
pub const ACCESS_TARGET: &str = "rserve::access";

/// What the environment and flags ask of the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSettings {
    /// An `EnvFilter` directive string.
    pub filter: String,
    pub stdout: bool,
    pub prefix: String,
    pub ansi: bool,
}

/// A Python logging level name (vLLM's `--log-level` / `VLLM_LOGGING_LEVEL`) as a `tracing` level.
fn tracing_level(python: &str) -> &'static str {
    match python.trim().to_ascii_uppercase().as_str() {
        "CRITICAL" | "FATAL" | "ERROR" => "error",
        "WARNING" | "WARN" => "warn",
        "DEBUG" => "debug",
        "NOTSET" | "TRACE" => "trace",
        _ => "info",
    }
}

/// A uvicorn level name (`--uvicorn-log-level`) as a `tracing` level.
fn access_level(uvicorn: &str) -> &'static str {
    match uvicorn {
        "critical" | "error" => "error",
        "warning" => "warn",
        "debug" => "debug",
        "trace" => "trace",
        _ => "info",
    }
}

impl LogSettings {
    /// Decides from the flags and a variable lookup (the process environment in `init`, a map in tests).
    pub fn from_vars(access: Option<&str>, log_level: Option<&str>, var: impl Fn(&str) -> Option<String>) -> Self {
        let get = |k: &str| var(k).filter(|v| !v.trim().is_empty());
        let configure = get("VLLM_CONFIGURE_LOGGING").map(|v| v.trim() != "0").unwrap_or(true);
        let level = match (log_level, get("VLLM_LOGGING_LEVEL")) {
            (Some(flag), _) => tracing_level(flag),
            (None, _) if !configure => "warn",
            (None, Some(env)) => tracing_level(&env),
            (None, None) => "info",
        };
        let filter = match get("RUST_LOG") {
            Some(v) => v,
            None => format!("{level},{ACCESS_TARGET}={}", access_level(access.unwrap_or("info"))),
        };
        // rserve logs to stderr unless asked otherwise (vLLM's default is stdout; stdout stays `generate`'s).
        let stdout = get("VLLM_LOGGING_STREAM").is_some_and(|s| s.trim() == "ext://sys.stdout");
        let on_terminal = if stdout { std::io::stdout().is_terminal() } else { std::io::stderr().is_terminal() };
        let no_color = get("NO_COLOR").is_some_and(|v| v != "0");
        let force_color = get("FORCE_COLOR").is_some_and(|v| v != "0");
        let ansi = match get("VLLM_LOGGING_COLOR").as_deref().map(str::trim) {
            Some("1") => true,
            Some("0") => false,
            _ => !no_color && (force_color || on_terminal),
        };
        LogSettings { filter, stdout, prefix: get("VLLM_LOGGING_PREFIX").unwrap_or_default(), ansi }
    }
}

/// A writer that starts each log line with `VLLM_LOGGING_PREFIX` (the formatter writes one event per call).
struct Prefixed<W: Write> {
    prefix: std::sync::Arc<str>,
    inner: W,
}

impl<W: Write> Write for Prefixed<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.inner.write_all(self.prefix.as_bytes())?;
        self.inner.write_all(buf)?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Installs the global subscriber. `access_level` is a uvicorn level name (critical … trace), `log_level` vLLM's
/// `--log-level`.
pub fn init(access_level: Option<&str>, log_level: Option<&str>) {
    let s = LogSettings::from_vars(access_level, log_level, |k| std::env::var(k).ok());
    let prefix: std::sync::Arc<str> = s.prefix.into();
    let writer = match (s.stdout, prefix.is_empty()) {
        (true, true) => BoxMakeWriter::new(std::io::stdout),
        (false, true) => BoxMakeWriter::new(std::io::stderr),
        (true, false) => BoxMakeWriter::new(move || Prefixed { prefix: prefix.clone(), inner: std::io::stdout() }),
        (false, false) => BoxMakeWriter::new(move || Prefixed { prefix: prefix.clone(), inner: std::io::stderr() }),
    };
    // A second initialisation (tests) is harmless; ignore it.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::new(s.filter))
        .with_writer(writer)
        .with_ansi(s.ansi)
        .with_target(false)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)], log_level: Option<&str>) -> LogSettings {
        let map: std::collections::HashMap<String, String> =
            vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        LogSettings::from_vars(Some("warning"), log_level, |k| map.get(k).cloned())
    }

    #[test]
    fn level_from_flag_then_vllm_variables_then_info() {
        assert_eq!(with(&[], None).filter, "info,rserve::access=warn");
        assert_eq!(with(&[("VLLM_LOGGING_LEVEL", "debug")], None).filter, "debug,rserve::access=warn");
        assert_eq!(with(&[("VLLM_LOGGING_LEVEL", "DEBUG")], Some("ERROR")).filter, "error,rserve::access=warn");
        assert_eq!(with(&[("VLLM_CONFIGURE_LOGGING", "0")], None).filter, "warn,rserve::access=warn");
        assert_eq!(with(&[("RUST_LOG", "trace"), ("VLLM_LOGGING_LEVEL", "ERROR")], None).filter, "trace");
    }

    #[test]
    fn stream_prefix_and_colour() {
        let s = with(&[("VLLM_LOGGING_STREAM", "ext://sys.stdout"), ("VLLM_LOGGING_PREFIX", "[x] ")], None);
        assert!(s.stdout);
        assert_eq!(s.prefix, "[x] ");
        assert!(!with(&[], None).stdout);
        assert!(with(&[("VLLM_LOGGING_COLOR", "1"), ("NO_COLOR", "1")], None).ansi);
        assert!(!with(&[("VLLM_LOGGING_COLOR", "0"), ("FORCE_COLOR", "1")], None).ansi);
        assert!(with(&[("FORCE_COLOR", "1")], None).ansi);
        assert!(!with(&[("NO_COLOR", "1"), ("FORCE_COLOR", "1")], None).ansi);
    }
}
