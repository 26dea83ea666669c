//! `PagedKvCache`: the per-layer K and V buffers of the paged cache, `[num_blocks, block_size, kv_heads, head_dim]`
//! each, sized from a byte budget, in the backend's cache type (f32, or the model's 16-bit type on CUDA). Block
//! bookkeeping lives in the scheduler; this only owns the memory.

use crate::backend::{Backend, WeightDType};
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
    /// Allocates `num_blocks` blocks for every layer, in the backend's cache type for a model computing in
    /// `compute`.
    pub fn new(
        backend: &B,
        p: &ModelParams,
        num_blocks: usize,
        block_size: usize,
        compute: WeightDType,
    ) -> Result<Self> {
        let len = num_blocks * block_size * p.num_kv_heads * p.head_dim;
        let dtype = backend.kv_cache_dtype(compute);
        let layers = (0..p.num_layers)
            .map(|_| Ok((backend.alloc_kv_cache(len, dtype)?, backend.alloc_kv_cache(len, dtype)?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { layers, num_blocks, block_size })
    }
}
