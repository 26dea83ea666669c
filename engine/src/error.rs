//! `EngineError`: every error the engine crate returns, by source (a backend's `BackendError` arrives with its message kept). No panics cross this crate's API.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
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
    #[error("backend: {0}")]
    Backend(String),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("the engine has stopped")]
    EngineStopped,
    #[error("io error on {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

impl From<rserve_backend::BackendError> for EngineError {
    fn from(e: rserve_backend::BackendError) -> Self {
        use rserve_backend::BackendError as B;
        match e {
            B::Device(m) => EngineError::Backend(m),
            B::InvalidArgument(m) => EngineError::InvalidArgument(m),
            B::Weights(m) => EngineError::Weights(m),
            B::Candle(e) => EngineError::Candle(e),
        }
    }
}

impl From<rserve_model_io::ModelError> for EngineError {
    fn from(e: rserve_model_io::ModelError) -> Self {
        use rserve_model_io::ModelError as M;
        match e {
            M::ModelNotFound { model, searched } => EngineError::ModelNotFound { model, searched },
            M::Download { model, message } => EngineError::Download { model, message },
            M::UnsupportedArchitecture(a) => EngineError::UnsupportedArchitecture(a),
            M::Config(m) => EngineError::Config(m),
            M::Weights(m) => EngineError::Weights(m),
            M::Tokenizer(m) => EngineError::Tokenizer(m),
            M::ChatTemplate(m) => EngineError::ChatTemplate(m),
            M::InvalidArgument(m) => EngineError::InvalidArgument(m),
            M::Io { path, source } => EngineError::Io { path, source },
            M::Candle(e) => EngineError::Candle(e),
            M::Backend(e) => e.into(),
        }
    }
}
