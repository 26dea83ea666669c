//! The OpenAI wire format: request/response types (`types`), validation into engine requests (`validate`), and the
//! conversion of engine events into response bodies and stream chunks (`render`, `logprobs`).

pub mod logprobs;
pub mod render;
pub mod structured;
pub mod types;
pub mod validate;
