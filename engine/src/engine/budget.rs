//! KV cache sizing at start-up: how many blocks the budget buys, and the start-up numbers users look for.
//!
//! The arithmetic is the planner's (`crate::plan::memory`), so `rserve plan` and the start-up log agree. On a
//! device with its own memory the budget is `utilization x device memory - weights` minus any activations beyond
//! the `(1 - utilization)` headroom (none at the engine's step sizes). On the CPU backend the "device memory" is
//! the host's available memory: the budget is `--kv-cache-memory-bytes` exactly when given, else
//! `min(4 GiB, utilization x available - weights)` (vLLM's CPU backend also defaults to a 4 GiB KV space).

use crate::config::ModelParams;
use crate::error::{EngineError, Result};
use crate::plan::memory::{self, KvGroups, MemoryPool, StepShape, CPU_DEFAULT_KV_BYTES};
use crate::plan::ModelShape;

pub use crate::plan::device::host_available_bytes;

pub const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// The sizing outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct KvBudget {
    pub kv_bytes: u64,
    /// Blocks of the pool, the reserved null block of sliding-window groups included.
    pub num_blocks: usize,
    /// KV bytes of one token over every layer (what a model without sliding-window layers holds per token).
    pub bytes_per_token: usize,
    pub max_model_len: usize,
    /// The model's KV cache groups.
    pub groups: KvGroups,
    /// Most tokens of one step (`--max-num-batched-tokens`): a sliding-window group holds a step's chunk too.
    pub chunk: usize,
}

impl KvBudget {
    /// Tokens of context the cache holds (vLLM's "GPU KV cache size").
    pub fn num_tokens(&self, block_size: usize) -> usize {
        self.groups.kv_tokens(self.num_blocks as u64, block_size) as usize
    }

    /// How many requests of `max_model_len` tokens fit at once.
    pub fn max_concurrency(&self, block_size: usize) -> f64 {
        self.groups.max_concurrency(self.num_blocks as u64, self.max_model_len, block_size, self.chunk)
    }
}

/// Sizes the cache. Errors name the numbers and the flag to change. On the CPU (`device_memory` None) the host's
/// available memory is measured now: `plan_with_host` takes it measured before the weights were loaded.
#[allow(clippy::too_many_arguments)] // each is one independent input of the budget rule
pub fn plan(
    p: &ModelParams,
    kv_elem_bytes: usize,
    block_size: usize,
    requested_len: Option<usize>,
    kv_cache_memory_bytes: Option<u64>,
    utilization: f64,
    weights_bytes: u64,
    device_memory: Option<u64>,
    max_num_batched_tokens: usize,
) -> Result<KvBudget> {
    let host = device_memory.is_none().then(host_available_bytes).flatten();
    plan_with_host(
        host,
        p,
        kv_elem_bytes,
        block_size,
        requested_len,
        kv_cache_memory_bytes,
        utilization,
        weights_bytes,
        device_memory,
        max_num_batched_tokens,
    )
}

/// `plan` with the host's available memory `host_available` (None: unknown, twice vLLM's 4 GiB CPU default).
#[allow(clippy::too_many_arguments)]
pub fn plan_with_host(
    host_available: Option<u64>,
    p: &ModelParams,
    kv_elem_bytes: usize,
    block_size: usize,
    requested_len: Option<usize>,
    kv_cache_memory_bytes: Option<u64>,
    utilization: f64,
    weights_bytes: u64,
    device_memory: Option<u64>,
    max_num_batched_tokens: usize,
) -> Result<KvBudget> {
    if block_size == 0 {
        return Err(EngineError::InvalidArgument("--block-size must be positive".into()));
    }
    if !(0.0..=1.0).contains(&utilization) || utilization == 0.0 {
        return Err(EngineError::InvalidArgument(format!(
            "--gpu-memory-utilization must be in (0, 1], got {utilization}"
        )));
    }
    let max_model_len = match requested_len {
        Some(0) => return Err(EngineError::InvalidArgument("--max-model-len must be positive".into())),
        Some(l) if l > p.max_position_embeddings => {
            return Err(EngineError::InvalidArgument(format!(
                "--max-model-len {l} exceeds the model's max_position_embeddings {}",
                p.max_position_embeddings
            )))
        }
        Some(l) => l,
        None => p.max_position_embeddings,
    };
    let shape = ModelShape::from_params(p);
    // The activations of one engine step at the engine's default step sizes, on one device.
    let activations = memory::activation_bytes(&shape, StepShape::default(), 1);
    let pool = match (kv_cache_memory_bytes, device_memory) {
        (Some(_), _) => MemoryPool::Device(0),
        (None, Some(total)) => MemoryPool::Device(total),
        (None, None) => MemoryPool::Host(host_available.unwrap_or(CPU_DEFAULT_KV_BYTES * 2)),
    };
    let kv_bytes = memory::kv_budget_bytes(pool, utilization, weights_bytes, activations, kv_cache_memory_bytes);
    let per_token = memory::kv_bytes_per_token(&shape, kv_elem_bytes) as usize;
    // A block spans the layers of one KV cache group.
    let groups = KvGroups::of(&shape);
    let block_token = memory::kv_bytes_per_token_on(&shape, groups.block_layers(shape.kv_layers()), 1, kv_elem_bytes);
    let per_block = block_token * block_size as u64;
    let num_blocks = memory::kv_blocks(kv_bytes, block_token, block_size) as usize;
    // The scheduler's own minimum (`SchedulerConfig::min_num_blocks`): one request of max_model_len tokens.
    let chunk = max_num_batched_tokens;
    let need_blocks = (groups.reserved_blocks() + groups.blocks_per_request(max_model_len, block_size, chunk)) as usize;
    if num_blocks < need_blocks {
        return Err(EngineError::InvalidArgument(format!(
            "to serve at least one request with the max seq len ({max_model_len}), {:.3} GiB KV cache is needed, \
             which is larger than the available KV cache memory ({:.3} GiB); increase --kv-cache-memory-bytes or \
             decrease --max-model-len",
            (need_blocks as u64 * per_block) as f64 / GIB,
            kv_bytes as f64 / GIB
        )));
    }
    Ok(KvBudget { kv_bytes, num_blocks, bytes_per_token: per_token, max_model_len, groups, chunk })
}
