//! The paged KV cache's memory and its layout over KV cache groups.
//!
//! `KvLayout` partitions the layers into the scheduler's KV cache groups (vLLM v1's hybrid layout): global and
//! sliding-window layers in groups of `group_size` layers each (a kind whose layer count is not a multiple is
//! padded in its last group), so a block is the same size in every group. The cache holds `group_size` K/V tensor
//! pairs, `[num_blocks, block_size, kv_heads, head_dim]` each; layer `l` of group `g` uses tensor pair
//! `slot(l)` with group `g`'s block table, and since a block belongs to one group at a time, the groups share the
//! tensors without overlapping. A model without sliding-window layers has one group of all its layers: one tensor
//! pair per layer, as before. Block bookkeeping lives in the scheduler; this only owns the memory.

use rserve_scheduler::KvGroupSpec;

use crate::backend::{Backend, WeightDType};
use crate::config::ModelParams;
use crate::error::Result;

/// How the layers map onto KV cache groups and cache tensors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvLayout {
    /// The scheduler's groups, in order.
    pub groups: Vec<KvGroupSpec>,
    /// Layers per group: the number of K/V tensor pairs.
    pub group_size: usize,
    /// Per layer: (group, tensor slot).
    pub layer: Vec<(usize, usize)>,
}

impl KvLayout {
    /// The layout of a model's layers (`windows[l]`: layer `l`'s sliding window, or none).
    pub fn new(windows: &[Option<usize>]) -> Self {
        // Layers by attention kind, in order of first appearance (global layers first when a model has both).
        let mut kinds: Vec<(Option<usize>, Vec<usize>)> = Vec::new();
        let mut order: Vec<Option<usize>> = windows.to_vec();
        order.sort();
        order.dedup();
        for w in order {
            kinds.push((w, (0..windows.len()).filter(|&l| windows[l] == w).collect()));
        }
        let group_size = kinds.iter().map(|(_, l)| l.len()).min().unwrap_or(0).max(1);
        let mut groups = Vec::new();
        let mut layer = vec![(0, 0); windows.len()];
        for (window, layers) in kinds {
            for chunk in layers.chunks(group_size) {
                for (slot, &l) in chunk.iter().enumerate() {
                    layer[l] = (groups.len(), slot);
                }
                groups.push(KvGroupSpec { window });
            }
        }
        if groups.is_empty() {
            groups.push(KvGroupSpec::FULL);
        }
        Self { groups, group_size, layer }
    }

    /// The layout of `p`'s layers.
    pub fn of(p: &ModelParams) -> Self {
        Self::new(&p.layers.iter().map(|l| l.window).collect::<Vec<_>>())
    }

    /// Whether any group slides (the pool then reserves its null block).
    pub fn has_sliding(&self) -> bool {
        self.groups.iter().any(|g| g.window.is_some())
    }
}

/// Device memory of the paged KV cache.
pub struct PagedKvCache<B: Backend> {
    /// One K/V pair per tensor slot of a group (`KvLayout::group_size`); `None` for slots no layer of this
    /// pipeline stage uses.
    tensors: Vec<Option<(B::Buffer, B::Buffer)>>,
    /// Per layer of this stage: (group, tensor slot).
    layer: Vec<(usize, usize)>,
    pub num_groups: usize,
    pub num_blocks: usize,
    pub block_size: usize,
}

impl<B: Backend> PagedKvCache<B> {
    /// Allocates `num_blocks` blocks for every tensor slot that `layers` (this stage's layers, as global layer
    /// indices into `layout`) use, in the backend's cache type for a model computing in `compute`; `p` gives the
    /// KV heads (this rank's share) and head dim.
    pub fn new(
        backend: &B,
        p: &ModelParams,
        layout: &KvLayout,
        layers: std::ops::Range<usize>,
        num_blocks: usize,
        block_size: usize,
        compute: WeightDType,
    ) -> Result<Self> {
        let len = num_blocks * block_size * p.num_kv_heads * p.head_dim;
        let dtype = backend.kv_cache_dtype(compute);
        let layer: Vec<(usize, usize)> = layout.layer[layers].to_vec();
        let mut tensors = Vec::with_capacity(layout.group_size);
        for slot in 0..layout.group_size {
            tensors.push(if layer.iter().any(|&(_, s)| s == slot) {
                Some((backend.alloc_kv_cache(len, dtype)?, backend.alloc_kv_cache(len, dtype)?))
            } else {
                None
            });
        }
        Ok(Self { tensors, layer, num_groups: layout.groups.len(), num_blocks, block_size })
    }

    /// The KV cache group and the K/V buffers of this stage's layer `li`.
    pub fn layer(&self, li: usize) -> Result<(usize, &B::Buffer, &B::Buffer)> {
        let bad = || crate::EngineError::Backend(format!("KV cache: no tensors for layer {li}"));
        let &(group, slot) = self.layer.get(li).ok_or_else(bad)?;
        let (k, v) = self.tensors.get(slot).and_then(Option::as_ref).ok_or_else(bad)?;
        Ok((group, k, v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_of_the_shelf() {
        // Llama: one group of every layer.
        let l = KvLayout::new(&[None; 32]);
        assert_eq!((l.groups.len(), l.group_size, l.layer[31]), (1, 32, (0, 31)));
        assert!(!l.has_sliding());
        // Mistral: one sliding group.
        let m = KvLayout::new(&[Some(4096); 32]);
        assert_eq!((m.groups, m.group_size), (vec![KvGroupSpec::sliding(4096)], 32));
        // Gemma 2 (42 layers, even ones local): a global group and a local group of 21.
        let g2: Vec<_> = (0..42).map(|i| if i % 2 == 0 { Some(4096) } else { None }).collect();
        let g2 = KvLayout::new(&g2);
        assert_eq!((g2.groups.len(), g2.group_size), (2, 21));
        assert_eq!((g2.layer[0], g2.layer[1], g2.layer[41]), ((1, 0), (0, 0), (0, 20)));
        // Gemma 3 27B (62 layers, every 6th global): 10 global layers, 52 local in 6 groups (the last holds 2).
        let g3: Vec<_> = (0..62).map(|i| if (i + 1) % 6 == 0 { None } else { Some(1024) }).collect();
        let g3 = KvLayout::new(&g3);
        assert_eq!((g3.groups.len(), g3.group_size), (7, 10));
        assert_eq!(g3.groups[0], KvGroupSpec::FULL);
        assert_eq!((g3.layer[5], g3.layer[0], g3.layer[61]), ((0, 0), (1, 0), (6, 1)));
        // Every (group, slot) is used by one layer at most.
        let mut seen = std::collections::HashSet::new();
        assert!(g3.layer.iter().all(|ls| seen.insert(*ls)));
        // One request of 8192 tokens, blocks of 16: 512 global blocks and at most 65 in each local group.
        let held: usize = g3.groups.iter().map(|g| g.blocks_held(8192, 16)).sum();
        assert_eq!(held, 512 + 6 * 64);
    }
}
