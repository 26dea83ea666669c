//! `BackendError`: what a backend's calls fail with. The engine turns it into its own error (`EngineError`) at the
//! crate boundary, keeping the message.

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// A device call failed or an op's arguments do not fit its buffers.
    #[error("{0}")]
    Device(String),
    /// A caller's value the backend cannot honour (a device index, a tuning choice).
    #[error("{0}")]
    InvalidArgument(String),
    /// A weight the backend cannot take in (an unknown packed format, a shape it cannot hold).
    #[error("{0}")]
    Weights(String),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

pub type Result<T, E = BackendError> = std::result::Result<T, E>;
