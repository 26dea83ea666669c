//! The HTTP routes, one file each; `crate::app` wires them into the router.

pub mod chat;
pub mod classify;
pub mod completions;
pub mod dev;
pub mod embeddings;
pub mod health;
pub mod metrics;
pub mod models;
pub mod pooling;
pub mod rerank;
pub mod responses;
pub mod score;
pub mod tokenize;

#[cfg(test)]
mod pooling_tests;
