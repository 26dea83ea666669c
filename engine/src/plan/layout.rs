//! Parallel layouts: which TP and PP sizes are valid for a model on a device profile, what one TP x PP layout
//! leaves for the KV cache on each device, and the choice of the smallest layout that serves a full-context
//! sequence.
//!
//! Rules: TP must divide the attention heads and be a size the node allows (TP stays inside a node); it should
//! also divide the KV heads, else KV heads are replicated on several ranks (allowed only when TP is a multiple of
//! the KV heads, as vLLM requires). PP must divide the layers evenly. Each device holds its stage's weights / TP,
//! and the tightest stage (the one with the embeddings or the output head) bounds the KV tokens of every device.

use serde::Serialize;

use super::device::DeviceProfile;
use super::memory::{self, MemoryPool, StepShape};
use super::params::ParamCount;
use super::shape::{Attention, ModelShape};

/// Everything a layout's memory depends on.
#[derive(Debug, Clone)]
pub struct Sizing<'a> {
    pub shape: &'a ModelShape,
    pub params: &'a ParamCount,
    /// Bytes of all weights (parameters x bytes per element).
    pub weights_bytes: u64,
    pub kv_elem_bytes: usize,
    pub device: &'a DeviceProfile,
    pub utilization: f64,
    pub block_size: usize,
    pub step: StepShape,
    /// `--kv-cache-memory-bytes`: the exact KV bytes of every device.
    pub kv_cache_memory_bytes: Option<u64>,
}

/// One TP x PP layout and what it holds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LayoutPlan {
    pub tp: usize,
    pub pp: usize,
    pub devices: usize,
    pub nodes: usize,
    pub layers_per_stage: usize,
    /// Weights on the most loaded device.
    pub weights_per_device_bytes: u64,
    pub activation_bytes_per_device: u64,
    /// Activations beyond the utilization headroom, taken from the KV budget.
    pub activation_reserve_per_device: u64,
    /// KV memory of each device (the tightest device's).
    pub kv_bytes_per_device: u64,
    pub kv_bytes_total: u64,
    /// Bytes of one token slot of a block (a block spans one KV cache group's layers: `memory::KvGroups`).
    pub kv_bytes_per_token_per_device: u64,
    pub num_blocks_per_device: u64,
    /// Tokens the cache holds (every device holds its layers' share of the same tokens; with sliding-window groups,
    /// the usable blocks shared evenly by the groups, `KvGroups::kv_tokens`).
    pub kv_tokens: u64,
    pub max_model_len: usize,
    pub full_context_requests: u64,
    /// vLLM's "Maximum concurrency" (`KvGroups::max_concurrency`: `kv_tokens / max_model_len` for a model without
    /// sliding-window layers).
    pub max_concurrency: f64,
    pub kv_heads_replicated: bool,
}

impl LayoutPlan {
    pub fn fits(&self) -> bool {
        self.full_context_requests >= 1
    }
}

/// TP sizes that divide the attention heads, are allowed in a node, and split (or evenly replicate) the KV heads.
pub fn valid_tp(shape: &ModelShape, device: &DeviceProfile) -> Vec<usize> {
    device
        .tp_sizes
        .iter()
        .copied()
        .filter(|&t| {
            shape.num_heads.is_multiple_of(t)
                && match shape.attention {
                    Attention::Standard => shape.num_kv_heads.is_multiple_of(t) || t.is_multiple_of(shape.num_kv_heads),
                    Attention::Latent(_) => true,
                }
        })
        .collect()
}

/// Valid TP sizes that do not replicate KV heads.
pub fn preferred_tp(shape: &ModelShape, valid: &[usize]) -> Vec<usize> {
    valid.iter().copied().filter(|&t| !replicates_kv(shape, t)).collect()
}

fn replicates_kv(shape: &ModelShape, tp: usize) -> bool {
    matches!(shape.attention, Attention::Standard) && !shape.num_kv_heads.is_multiple_of(tp)
}

/// PP sizes that divide the layers evenly.
pub fn valid_pp(layers: usize) -> Vec<usize> {
    (1..=layers).filter(|p| layers.is_multiple_of(*p)).collect()
}

impl Sizing<'_> {
    /// What layout `tp x pp` leaves for the KV cache at `max_model_len` tokens per request.
    pub fn evaluate(&self, tp: usize, pp: usize, max_model_len: usize) -> LayoutPlan {
        let (tp, pp) = (tp.max(1), pp.max(1));
        let layers_per_stage = self.shape.num_layers.div_ceil(pp);
        let kv_layers_per_stage = self.shape.kv_layers().div_ceil(pp);
        let stage_max = self.params.stages(pp).into_iter().max().unwrap_or(0);
        let total = self.params.total.max(1);
        let stage_bytes = (self.weights_bytes as u128 * stage_max as u128 / total as u128) as u64;
        let weights = stage_bytes.div_ceil(tp as u64);
        let activations = memory::activation_bytes(self.shape, self.step, tp);
        let mem = self.device.memory_bytes;
        let pool = if self.device.host { MemoryPool::Host(mem) } else { MemoryPool::Device(mem) };
        let reserve = match self.kv_cache_memory_bytes {
            Some(_) => 0,
            None => memory::activation_reserve(mem, self.utilization, activations),
        };
        let kv = memory::kv_budget_bytes(pool, self.utilization, weights, activations, self.kv_cache_memory_bytes);
        // A block spans a KV cache group's layers (all of the stage's for a model without sliding-window layers).
        let groups = memory::KvGroups::of(self.shape);
        let block_layers = groups.block_layers(kv_layers_per_stage);
        let per_token = memory::kv_bytes_per_token_on(self.shape, block_layers, tp, self.kv_elem_bytes);
        let blocks = memory::kv_blocks(kv, per_token, self.block_size);
        let kv_tokens = groups.kv_tokens(blocks, self.block_size);
        let chunk = self.step.max_num_batched_tokens;
        let blocks_per_request = groups.blocks_per_request(max_model_len, self.block_size, chunk).max(1);
        let devices = tp * pp;
        let stages_per_node = (self.device.devices_per_node / tp).max(1);
        LayoutPlan {
            tp,
            pp,
            devices,
            nodes: pp.div_ceil(stages_per_node),
            layers_per_stage,
            weights_per_device_bytes: weights,
            activation_bytes_per_device: activations,
            activation_reserve_per_device: reserve,
            kv_bytes_per_device: kv,
            kv_bytes_total: kv * devices as u64,
            kv_bytes_per_token_per_device: per_token,
            num_blocks_per_device: blocks,
            kv_tokens,
            max_model_len,
            full_context_requests: blocks.saturating_sub(groups.reserved_blocks()) / blocks_per_request,
            max_concurrency: groups.max_concurrency(blocks, max_model_len, self.block_size, chunk),
            kv_heads_replicated: replicates_kv(self.shape, tp),
        }
    }

    /// The smallest valid layout of at least `min_devices` devices that holds one full-context sequence; among
    /// equal sizes, one that does not replicate KV heads, then the larger TP (fewer pipeline stages).
    pub fn choose(&self, tps: &[usize], pps: &[usize], min_devices: usize, max_model_len: usize) -> Option<LayoutPlan> {
        let mut candidates: Vec<(usize, usize)> =
            tps.iter().flat_map(|&t| pps.iter().map(move |&p| (t, p))).filter(|(t, p)| t * p >= min_devices).collect();
        candidates.sort_by_key(|&(t, p)| (t * p, replicates_kv(self.shape, t), std::cmp::Reverse(t)));
        candidates.into_iter().map(|(t, p)| self.evaluate(t, p, max_model_len)).find(LayoutPlan::fits)
    }
}
