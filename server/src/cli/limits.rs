//! The HTTP front's limits: how long a client may take to send a request's headers and body and how many connections
//! may be open (rserve only: uvicorn, vLLM's HTTP server, has none of these as `vllm serve` flags), and how large a
//! request head may be (vLLM's `--h11-max-header-count` / `--h11-max-incomplete-event-size`, which it hands to h11).
//! Checked here into `ConnLimits`, which `serve::conn` applies to every connection.

use std::time::Duration;

use clap::Args;

use super::CliError;

/// vLLM's variable for uvicorn's keep-alive timeout (seconds, default 5): the default header timeout here.
pub const KEEP_ALIVE_ENV: &str = "VLLM_HTTP_TIMEOUT_KEEP_ALIVE";
/// uvicorn's keep-alive timeout, which vLLM keeps.
const DEFAULT_KEEP_ALIVE_S: f64 = 5.0;

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Frontend")]
pub struct LimitArgs {
    /// Seconds a client has to send a request's headers, counted from when its connection opens or its previous
    /// response ends: a slower client is disconnected, and so is a keep-alive connection idle that long. Default:
    /// VLLM_HTTP_TIMEOUT_KEEP_ALIVE, else 5 (vLLM's keep-alive timeout).
    #[arg(long, value_name = "SECONDS")]
    pub http_header_timeout: Option<f64>,
    /// Seconds a client has to send a request's whole body; a slower one gets 408 and is disconnected.
    #[arg(long, value_name = "SECONDS", default_value_t = 60.0)]
    pub http_body_timeout: f64,
    /// Most open connections; one more is answered 503 with Retry-After and closed. Default: no limit.
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
    /// Most headers in a request; more is answered 431.
    #[arg(long, value_name = "N", default_value_t = 256)]
    pub h11_max_header_count: usize,
    /// Most bytes of a request's head (request line and headers); more is answered 431.
    #[arg(long, value_name = "BYTES", default_value_t = 4 * 1024 * 1024)]
    pub h11_max_incomplete_event_size: usize,
}

/// The limits, checked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConnLimits {
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub max_connections: Option<usize>,
    pub max_header_count: usize,
    pub max_head_bytes: usize,
}

/// The smallest head limit hyper takes (its read buffer's minimum).
const MIN_HEAD_BYTES: usize = 8192;

impl LimitArgs {
    /// Checks the flags (and `VLLM_HTTP_TIMEOUT_KEEP_ALIVE` when `--http-header-timeout` is not given).
    pub fn limits(&self) -> Result<ConnLimits, CliError> {
        let header = match self.http_header_timeout {
            Some(s) => s,
            None => match std::env::var(KEEP_ALIVE_ENV) {
                Ok(v) => v.trim().parse::<f64>().map_err(|_| CliError::Env(KEEP_ALIVE_ENV, v))?,
                Err(_) => DEFAULT_KEEP_ALIVE_S,
            },
        };
        if self.max_connections == Some(0) {
            return Err(CliError::ZeroLength("max-connections"));
        }
        Ok(ConnLimits {
            header_timeout: seconds("http-header-timeout", Some(header))?.unwrap_or_default(),
            body_timeout: seconds("http-body-timeout", Some(self.http_body_timeout))?.unwrap_or_default(),
            max_connections: self.max_connections,
            max_header_count: self.h11_max_header_count,
            max_head_bytes: self.h11_max_incomplete_event_size.max(MIN_HEAD_BYTES),
        })
    }
}

/// A flag in seconds, checked: positive and finite.
pub fn seconds(flag: &'static str, value: Option<f64>) -> Result<Option<Duration>, CliError> {
    match value {
        None => Ok(None),
        Some(s) if s.is_finite() && s > 0.0 => Ok(Some(Duration::from_secs_f64(s))),
        Some(s) => Err(CliError::Seconds(flag, s)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(header: Option<f64>, body: f64, max: Option<usize>) -> LimitArgs {
        LimitArgs {
            http_header_timeout: header,
            http_body_timeout: body,
            max_connections: max,
            h11_max_header_count: 256,
            h11_max_incomplete_event_size: 100,
        }
    }

    #[test]
    fn limits_are_checked() {
        let l = args(Some(2.5), 3.0, Some(10)).limits().expect("valid");
        assert_eq!(l.header_timeout, Duration::from_millis(2500));
        assert_eq!(l.body_timeout, Duration::from_secs(3));
        assert_eq!(l.max_connections, Some(10));
        assert_eq!((l.max_header_count, l.max_head_bytes), (256, MIN_HEAD_BYTES), "hyper's smallest head limit");
        assert_eq!(args(Some(0.0), 3.0, None).limits(), Err(CliError::Seconds("http-header-timeout", 0.0)));
        assert_eq!(args(Some(1.0), -1.0, None).limits(), Err(CliError::Seconds("http-body-timeout", -1.0)));
        assert_eq!(args(Some(1.0), 1.0, Some(0)).limits(), Err(CliError::ZeroLength("max-connections")));
        assert_eq!(seconds("max-request-time", None), Ok(None));
        assert!(seconds("max-request-time", Some(f64::NAN)).is_err());
    }
}
