//! The pooling APIs (vLLM's embeddings, pooling, classification, score and rerank): wire types (`types.rs`), their
//! rules (`error.rs`, `validate.rs`), pair scoring by cross-encoder or cosine similarity (`score.rs`), running a
//! request's inputs together (`gather.rs`) and rendering the results (`render.rs`). The routes are
//! `crate::routes::{embeddings, pooling, classify, score, rerank}`.

pub mod error;
pub mod gather;
pub mod render;
pub mod score;
pub mod types;
pub mod validate;

#[cfg(test)]
mod tests;

pub use error::{Api, PoolingError};
