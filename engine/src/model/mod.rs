//! Models written once against the `Backend` ops: the decoder of every architecture rserve serves, the encoders
//! served for pooling (`bert.rs`), its rotary
//! tables, the paged KV cache buffers and their layout over KV cache groups, and the flattened batch a forward step takes (from the scheduler's
//! `ScheduledSeq`s, re-exported here for runners driven without a scheduler).

pub mod bert;
pub mod flat;
pub mod kv_cache;
pub mod llama;
pub mod rope;
pub mod shard;

pub use flat::{DeviceBatch, FlatBatch, RowOwners};
pub use kv_cache::{KvLayout, PagedKvCache};
pub use llama::{DeviceOutput, LlamaModel, StageOutput};
pub use rserve_scheduler::{BlockId, ScheduledSeq, TokenId};
