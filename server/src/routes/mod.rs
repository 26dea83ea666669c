//! The HTTP routes, one file each; `crate::app` wires them into the router.

pub mod chat;
pub mod completions;
pub mod dev;
pub mod health;
pub mod metrics;
pub mod models;
pub mod responses;
pub mod tokenize;
