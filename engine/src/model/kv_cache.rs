//! `PagedKvCache`: the per-layer K and V buffers of the paged cache, `[num_blocks, block_size, kv_heads, head_dim]`
//! each, sized from a byte budget. Block bookkeeping lives in the scheduler; this only owns the memory.

use crate::backend::Backend;
use crate::config::ModelParams;
use crate::error::Result;

/// Device memory of the paged KV cache.
pub struct PagedKvCache<B: Backend> {
    pub layers: Vec<(B::Buffer, B::Buffer)>,
    pub num_blocks: usize,
    pub block_size: usize,
}

/// Bytes of K plus V for one token across all layers, at `elem_bytes` per value.
pub fn bytes_per_token(p: &ModelParams, elem_bytes: usize) -> usize {
    p.num_layers * 2 * p.num_kv_heads * p.head_dim * elem_bytes
}

impl<B: Backend> PagedKvCache<B> {
    /// Allocates `num_blocks` blocks of f32 values for every layer.
    pub fn new(backend: &B, p: &ModelParams, num_blocks: usize, block_size: usize) -> Result<Self> {
        let len = num_blocks * block_size * p.num_kv_heads * p.head_dim;
        let layers = (0..p.num_layers)
            .map(|_| Ok((backend.alloc_f32(len)?, backend.alloc_f32(len)?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { layers, num_blocks, block_size })
    }
}
