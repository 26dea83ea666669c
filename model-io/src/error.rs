//! `ModelError`: what reading a model's files fails with, by source. The engine turns it into its own error
//! (`EngineError`) at the crate boundary, variant for variant.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("model '{model}' was not found; searched: {}", searched.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "))]
    ModelNotFound { model: String, searched: Vec<PathBuf> },
    #[error("download of '{model}' failed: {message}")]
    Download { model: String, message: String },
    #[error("unsupported architecture '{0}' (supported: {list})", list = crate::config::Architecture::supported_list())]
    UnsupportedArchitecture(String),
    #[error("invalid model config: {0}")]
    Config(String),
    #[error("weights: {0}")]
    Weights(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    ChatTemplate(String),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("io error on {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    /// Packing a weight for the CPU backend at load.
    #[error(transparent)]
    Backend(#[from] rserve_backend::BackendError),
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;
