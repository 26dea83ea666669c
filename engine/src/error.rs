//! `EngineError`: every error the engine crate returns, by source. A model file's `ModelError` arrives whole
//! (`Model`); a backend's `BackendError` with its message kept. No panics cross this crate's API.

pub use rserve_model_io::ModelError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Resolving or reading the model's files (config, weights, tokenizer, chat template).
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("backend: {0}")]
    Backend(String),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("the engine has stopped")]
    EngineStopped,
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
            B::Weights(m) => EngineError::Model(ModelError::Weights(m)),
            B::Candle(e) => EngineError::Candle(e),
        }
    }
}
