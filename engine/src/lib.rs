//! rserve's engine: everything between validated requests and the model's tokens.
//!
//! Model files, resolved and read by `rserve-model-io` (re-exported here as `source`, `config`, `weights`,
//! `tokenizer`, `chat_template`), run as a `ModelRunner` over a `Backend` of `rserve-backend` under the scheduler of
//! `rserve-scheduler`, on one engine thread (`engine`).

pub mod api;
/// The device seam and its implementations (`rserve-backend`), under the path the engine has always used.
pub use rserve_backend as backend;
/// Model files (`rserve-model-io`), under the paths the engine has always used.
pub use rserve_model_io::{chat_template, config, convert, source, tokenizer, weights};
pub mod dist;
pub mod engine;
pub mod error;
#[cfg(feature = "cuda")]
pub mod model;
pub mod plan;
pub mod pooling;
pub mod runner;
pub mod sampling;
pub mod structured;

pub use error::{EngineError, Result};
/// Token ids as they cross the crate boundaries (scheduler -> engine -> server); re-exported so that the server
/// needs no dependency on the scheduler crate.
pub use rserve_scheduler::TokenId;
/// The scheduler's default token budget of a step (`--max-num-batched-tokens`), stated once.
pub use rserve_scheduler::DEFAULT_MAX_NUM_BATCHED_TOKENS;
