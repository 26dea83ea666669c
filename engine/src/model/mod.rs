//! Models written once against the `Backend` ops: the llama family (Llama 3.x, SmolLM2, Mistral, Qwen2), its rotary
//! tables, the paged KV cache buffers, and the flattened batch a forward step takes.

pub mod batch;
pub mod flat;
pub mod kv_cache;
pub mod llama;
pub mod rope;
pub mod shard;

pub use batch::{BatchInput, SeqInput};
pub use flat::{DeviceBatch, FlatBatch};
pub use kv_cache::PagedKvCache;
pub use llama::{DeviceOutput, LlamaModel, StageOutput};
