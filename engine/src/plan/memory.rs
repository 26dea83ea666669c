//! The memory arithmetic shared by `rserve plan` and the server's start-up KV sizing (`engine::budget`), so the
//! plan and the start-up log agree: KV bytes per token, the activation estimate, the KV budget of one device, and
//! the blocks it buys.
//!
//! Activation rule: one engine step holds the activations of one decoder layer for `max_num_batched_tokens`
//! tokens plus f32 logits for `max_num_seqs` sequences (estimated by `activation_bytes`). They live in the
//! headroom `--gpu-memory-utilization` leaves (`(1 - U) x memory`); only the part that does not fit there is
//! taken from the KV budget. With the defaults (the scheduler's 2048 tokens, U = 0.9) the estimate is a few hundred MB per device
//! against GBs of headroom, so the budget is `U x memory - weights`, the rule the server has always used: for
//! Llama-3.1-405B on 16 PVC tiles that is 16 x 61.85 GB - 811.7 GB = 177.9 GB.

use serde::Serialize;

use super::shape::{Attention, ModelShape};

/// The CPU backend's KV space when `--kv-cache-memory-bytes` is not given (vLLM's CPU backend default).
pub const CPU_DEFAULT_KV_BYTES: u64 = 4 << 30;

/// The engine's step sizes that bound activations (`--max-num-batched-tokens`, `--max-num-seqs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct StepShape {
    pub max_num_batched_tokens: usize,
    pub max_num_seqs: usize,
}

impl Default for StepShape {
    /// The engine's defaults: the scheduler's batched tokens, 256 sequences (`EngineConfig::new`).
    fn default() -> Self {
        StepShape {
            max_num_batched_tokens: rserve_scheduler::DEFAULT_MAX_NUM_BATCHED_TOKENS,
            max_num_seqs: rserve_scheduler::DEFAULT_MAX_NUM_SEQS,
        }
    }
}

/// What the memory of one device is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryPool {
    /// A device with its own memory of this many bytes.
    Device(u64),
    /// The host's available memory (CPU backend): the budget is capped at `CPU_DEFAULT_KV_BYTES`.
    Host(u64),
}

/// KV heads each of `tp` ranks holds: the KV heads are split, or replicated when there are fewer than ranks.
pub fn kv_heads_per_rank(shape: &ModelShape, tp: usize) -> usize {
    shape.num_kv_heads.div_ceil(tp.max(1)).max(1)
}

/// KV cache bytes one token needs on one device holding `layers` layers at tensor-parallel size `tp`.
/// Standard attention: `layers x 2 x KV heads per rank x head dim x bytes`; latent attention: the compressed
/// latent `layers x (kv_lora_rank + qk_rope_head_dim) x bytes`, the same on every TP rank.
pub fn kv_bytes_per_token_on(shape: &ModelShape, layers: usize, tp: usize, elem_bytes: usize) -> u64 {
    let per_layer = match shape.attention {
        Attention::Standard => 2 * kv_heads_per_rank(shape, tp) * shape.head_dim,
        Attention::Latent(m) => m.kv_lora_rank + m.qk_rope_head_dim,
    };
    (layers * per_layer * elem_bytes) as u64
}

/// KV cache bytes of one token for the whole model (TP = 1, every KV layer).
pub fn kv_bytes_per_token(shape: &ModelShape, elem_bytes: usize) -> u64 {
    kv_bytes_per_token_on(shape, shape.kv_layers(), 1, elem_bytes)
}

/// The KV cache groups of a model, from its layer counts: `model::KvLayout`'s grouping of that many global and
/// sliding-window layers (it depends on the counts only). Global and sliding-window layers form groups of
/// `group_size` layers (the smaller kind's count; one group of every layer when the model has one kind), a block
/// spans `group_size` layers, and a request holds every block of a full group but only its window's blocks of a
/// sliding group (the scheduler frees the rest; the pool keeps one null block for them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct KvGroups {
    pub group_size: usize,
    pub full_groups: usize,
    pub sliding_groups: usize,
    pub window: Option<usize>,
}

impl KvGroups {
    pub fn of(shape: &ModelShape) -> Self {
        let layers = shape.kv_layers();
        let (sliding, window) = match shape.sliding {
            Some(s) => (s.sliding_layers.min(layers), Some(s.window)),
            None => (0, None),
        };
        let mut windows = vec![None; layers - sliding];
        windows.resize(layers, window);
        let layout = crate::model::KvLayout::new(&windows);
        let sliding_groups = layout.groups.iter().filter(|g| g.window.is_some()).count();
        KvGroups {
            group_size: layout.group_size,
            full_groups: layout.groups.len() - sliding_groups,
            sliding_groups,
            window: window.filter(|_| sliding > 0),
        }
    }

    pub fn num_groups(&self) -> usize {
        self.full_groups + self.sliding_groups
    }

    /// Blocks the pool keeps (the null block of sliding groups).
    pub fn reserved_blocks(&self) -> u64 {
        u64::from(self.sliding_groups > 0)
    }

    /// The most blocks one request of `tokens` tokens holds over all groups at any step, with prefill chunks of
    /// `chunk` tokens (`KvGroupSpec::max_blocks`: the scheduler's own rule for the smallest cache).
    pub fn blocks_per_request(&self, tokens: usize, block_size: usize, chunk: usize) -> u64 {
        (self.sliding_blocks(tokens, block_size, chunk) + tokens.div_ceil(block_size) * self.full_groups) as u64
    }

    fn sliding_blocks(&self, tokens: usize, block_size: usize, chunk: usize) -> usize {
        match self.window {
            Some(w) => {
                rserve_scheduler::KvGroupSpec::sliding(w).max_blocks(tokens, block_size, chunk) * self.sliding_groups
            }
            None => 0,
        }
    }

    /// Tokens of context the cache holds: its usable blocks shared evenly by the groups (vLLM's "GPU KV cache
    /// size" for hybrid models; every block for one group).
    pub fn kv_tokens(&self, blocks: u64, block_size: usize) -> u64 {
        blocks.saturating_sub(self.reserved_blocks()) / self.num_groups().max(1) as u64 * block_size as u64
    }

    /// Requests of `tokens` tokens the cache holds at once (vLLM's "Maximum concurrency"): usable blocks over the
    /// blocks a request holds (`blocks_per_request`), its global groups counted at `tokens / block_size` (so one
    /// global group gives `blocks x block_size / tokens`).
    pub fn max_concurrency(&self, blocks: u64, tokens: usize, block_size: usize, chunk: usize) -> f64 {
        let usable = blocks.saturating_sub(self.reserved_blocks()) as f64;
        let full = self.full_groups as f64 * tokens.max(1) as f64 / block_size as f64;
        usable / (full + self.sliding_blocks(tokens, block_size, chunk) as f64)
    }

    /// Layers one block spans on a device holding `kv_layers` of the model's KV layers (a pipeline stage).
    pub fn block_layers(&self, kv_layers: usize) -> usize {
        self.group_size.min(kv_layers).max(1)
    }
}

/// Values live per token during one decoder layer on one TP rank: the residual stream, the normed input and the
/// layer output (3 x hidden), q / k / v and the attention output, and the MLP's gate, up and product.
pub fn activation_values_per_token(shape: &ModelShape, tp: usize) -> u64 {
    let tp = tp.max(1);
    let h = shape.hidden_size;
    let attn = match shape.attention {
        Attention::Standard => (2 * shape.num_heads.div_ceil(tp) + 2 * kv_heads_per_rank(shape, tp)) * shape.head_dim,
        Attention::Latent(m) => {
            let heads = shape.num_heads.div_ceil(tp);
            heads * (m.qk_nope_head_dim + m.qk_rope_head_dim)
                + m.kv_lora_rank
                + m.qk_rope_head_dim
                + heads * (m.qk_nope_head_dim + m.v_head_dim)
                + heads * m.v_head_dim
        }
    };
    let mlp_width = match &shape.moe {
        Some(m) => (m.experts_per_token * m.expert_intermediate + m.shared_intermediate).max(shape.intermediate_size),
        None => shape.intermediate_size,
    };
    (3 * h + attn + 3 * mlp_width.div_ceil(tp)) as u64
}

/// Bytes of one activation value, for every weight dtype: most activations are f32 on every backend (the residual
/// stream, the matmul outputs, the logits); the 16-bit matmul inputs of a 16-bit model are counted at 4 bytes too,
/// on the safe side, so the plan and the start-up sizing agree whatever the dtype.
pub const ACTIVATION_BYTES: u64 = 4;

/// Peak activation bytes of one step on one device: `tokens x values per token x 4 + seqs x vocab / TP x 4`.
pub fn activation_bytes(shape: &ModelShape, step: StepShape, tp: usize) -> u64 {
    let seqs = step.max_num_seqs.min(step.max_num_batched_tokens) as u64;
    let logits = seqs * shape.vocab_size.div_ceil(tp.max(1)) as u64 * 4;
    step.max_num_batched_tokens as u64 * activation_values_per_token(shape, tp) * ACTIVATION_BYTES + logits
}

/// `utilization x memory`, rounded down to a byte.
pub fn usable_bytes(memory: u64, utilization: f64) -> u64 {
    (memory as f64 * utilization) as u64
}

/// The part of the activations that does not fit the `(1 - utilization)` headroom.
pub fn activation_reserve(memory: u64, utilization: f64, activations: u64) -> u64 {
    activations.saturating_sub(memory - usable_bytes(memory, utilization).min(memory))
}

/// Bytes of KV cache one device gets: exactly `exact` when given, else `utilization x memory - weights - the
/// activations beyond the headroom`, capped at `CPU_DEFAULT_KV_BYTES` on the host.
pub fn kv_budget_bytes(pool: MemoryPool, utilization: f64, weights: u64, activations: u64, exact: Option<u64>) -> u64 {
    if let Some(bytes) = exact {
        return bytes;
    }
    let (memory, cap) = match pool {
        MemoryPool::Device(m) => (m, u64::MAX),
        MemoryPool::Host(m) => (m, CPU_DEFAULT_KV_BYTES),
    };
    let reserve = activation_reserve(memory, utilization, activations);
    usable_bytes(memory, utilization).saturating_sub(weights).saturating_sub(reserve).min(cap)
}

/// KV blocks of `block_size` tokens that `kv_bytes` buy at `per_token` bytes a token.
pub fn kv_blocks(kv_bytes: u64, per_token: u64, block_size: usize) -> u64 {
    kv_bytes.checked_div(per_token * block_size as u64).unwrap_or(0)
}
