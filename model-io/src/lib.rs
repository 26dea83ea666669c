//! rserve's model files: resolving a model name to files (`source`: local folders, the Hugging Face cache,
//! downloads), reading them (`config`: `config.json` or GGUF metadata to checked `ModelParams`; `weights`:
//! safetensors and GGUF to tensors under Hugging Face names; `tokenizer`; `chat_template`), one process's share of
//! them (`shard`) and GGUF conversion (`convert`). No engine loop, request or device state: the engine builds on it.

pub mod chat_template;
pub mod config;
pub mod convert;
pub mod error;
pub mod shard;
pub mod source;
pub mod tokenizer;
pub mod weights;

pub use error::{ModelError, Result};
