//! `BenchError`: everything that can stop a `bench serve` run (bad flags, an unreachable server, an unreadable
//! dataset or tokenizer). A single failed request is not an error: it is counted in the report.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("invalid value for {flag}: {message}")]
    InvalidArg { flag: &'static str, message: String },
    #[error("HTTP request to {url} failed: {message}")]
    Http { url: String, message: String },
    #[error("{url} answered {status}: {body}")]
    Status { url: String, status: u16, body: String },
    #[error("unexpected response from {url}: {message}")]
    BadResponse { url: String, message: String },
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("dataset {}: {message}", path.display())]
    Dataset { path: PathBuf, message: String },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("could not start the async runtime: {0}")]
    Runtime(std::io::Error),
}

impl BenchError {
    pub(crate) fn arg(flag: &'static str, message: impl Into<String>) -> Self {
        BenchError::InvalidArg { flag, message: message.into() }
    }
}
