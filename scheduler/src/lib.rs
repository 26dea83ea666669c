//! `rserve-scheduler`: the paged KV-cache block pool with its prefix cache, the per-request KV cache manager and the
//! continuous-batching scheduler (vLLM v1 shape: no prefill/decode phases, chunked prefill, preemption by recompute).
//!
//! The crate is pure bookkeeping: no async, IO, devices or serde. The engine thread owns one [`Scheduler`] and
//! drives it:
//! ```
//! use rserve_scheduler::{NewRequest, RequestId, Scheduler, SchedulerConfig, TokenId};
//! let mut sched = Scheduler::new(SchedulerConfig::new(64, 512)).unwrap();
//! sched.add_request(NewRequest {
//!     id: RequestId(1),
//!     prompt_token_ids: vec![TokenId(1), TokenId(2), TokenId(3)],
//!     max_tokens: 2,
//!     min_tokens: 0,
//!     stop_token_ids: vec![TokenId(0)],
//!     skip_prefix_cache: false,
//!     whole_prompt: false,
//! }).unwrap();
//! while sched.has_unfinished() {
//!     let step = sched.schedule();
//!     // ... run the model on `step`, sample one token per seq with `sample == true` ...
//!     let sampled: Vec<_> = step.seqs.iter().filter(|s| s.sample).map(|s| (s.request_id, TokenId(7))).collect();
//!     for out in sched.update_from_output(&step, &sampled) {
//!         println!("{:?}", out);
//!     }
//!     sched.recycle(step); // optional: the next step reuses the output's buffers
//! }
//! ```
//!
//! KV cache groups ([`KvGroupSpec`], `SchedulerConfig::kv_groups`): a model with sliding-window layers has its
//! layers partitioned into groups of equal layer count (vLLM v1's hybrid KV cache manager); all groups allocate from
//! the one [`BlockPool`] and every request holds one block table per group, all of the same length. A sliding group
//! returns the blocks that fall before its window to the pool as the request advances (their table entries point at
//! the reserved [`NULL_BLOCK`], block 0, then), and each group has its own prefix-cache keys; a hit is the longest
//! prefix every group can serve. [`ScheduledSeq`] carries one block table (whole on a first schedule, the appended ids after: a runner keeps the
//! tables in a [`BlockTables`]) and one slot mapping per group. A model
//! without sliding layers has one full group and behaves as before. `SchedulerConfig::min_num_blocks` is the
//! smallest cache that one request of `max_model_len` tokens can run in (what `SchedulerConfig::validate` checks).
//! The engine reads held blocks through `Scheduler::kv()` ([`KvCacheManager::blocks_held`],
//! [`KvCacheManager::block_tables`]).
//!
//! Modules: [`ids`] (newtype ids), `config` ([`SchedulerConfig`]), `error` ([`SchedulerError`]), `block_hash`
//! (chained block keys), `block_pool` ([`BlockPool`]: ref counts, LRU free queue, prefix cache), `kv_cache_manager`
//! ([`KvCacheManager`]: block tables per KV cache group), `kv_groups` ([`KvGroupSpec`]: global or sliding-window
//! groups of layers), `request` ([`Request`]), `output` (step in/out types), `block_tables` ([`BlockTables`]: the runner's side of the
//! block-table deltas), `prefill_limits` ([`PrefillLimits`]: how many
//! requests prefill per step, how many of them long, the longest chunk), `scheduler` ([`Scheduler`]).

mod block_hash;
mod block_pool;
mod block_tables;
mod config;
mod error;
mod free_queue;
mod id_map;
pub mod ids;
mod kv_cache_manager;
mod kv_groups;
mod output;
mod prefill_limits;
mod request;
mod scheduler;

pub use block_hash::BlockHasher;
pub use block_pool::BlockPool;
pub use block_tables::BlockTables;
pub use config::{SchedulerConfig, DEFAULT_BLOCK_SIZE, DEFAULT_MAX_NUM_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS};
pub use error::SchedulerError;
pub use id_map::{IdMap, IdSet};
pub use ids::{BlockHash, BlockId, RequestId, TokenId};
pub use kv_cache_manager::{KvCacheManager, RequestBlocks};
pub use kv_groups::{KvGroupSpec, NULL_BLOCK};
pub use output::{FinishStatus, RequestOutput, ScheduledSeq, SchedulerOutput, SchedulerStats};
pub use prefill_limits::PrefillLimits;
pub use request::{NewRequest, Request, RequestStatus};
pub use scheduler::{PrefixCacheReset, Scheduler};
