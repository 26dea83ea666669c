//! The OpenAI wire format: request/response types (`types`), validation into engine requests (`validate`), and the
//! conversion of engine events into response bodies and stream chunks (`render`, `logprobs`); the Responses API on top of chat (`responses`).

pub mod logprobs;
pub mod pooling;
pub mod reasoning;
pub mod render;
pub mod request_extras;
pub mod responses;
pub mod structured;
pub mod tool_parsers;
pub mod tool_stream;
pub mod tools;
pub mod types;
pub mod validate;
