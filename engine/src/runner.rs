//! `ModelRunner`: a model, its backend and its paged KV cache memory, run one flattened batch at a time.
//! The engine thread holds it as `Box<dyn StepRunner>` so it need not be generic over the backend.

use crate::backend::Backend;
use crate::config::ModelParams;
use crate::error::Result;
use crate::model::{LlamaModel, PagedKvCache, ScheduledSeq};
use crate::weights::Weights;

/// What the engine thread needs from a runner.
pub trait StepRunner: Send {
    /// Runs one step over the scheduler's sequences as they are (checked and flattened once, here); returns
    /// `[num_seqs, vocab]` logits of each sequence's last token.
    fn execute(&mut self, batch: &[ScheduledSeq]) -> Result<Vec<f32>>;
    /// Runs one step and picks each sequence's most likely next token on the device (the lowest id among equal
    /// maxima, as the host sampler does), so only ids are read back. None: this runner cannot (nothing was run);
    /// call `execute` and sample on the host.
    fn execute_greedy(&mut self, batch: &[ScheduledSeq]) -> Result<Option<Vec<u32>>> {
        let _ = batch;
        Ok(None)
    }
    fn vocab_size(&self) -> usize;
    fn device_name(&self) -> String;
}

/// A llama-family model on backend `B` with its KV cache.
pub struct ModelRunner<B: Backend> {
    backend: B,
    model: LlamaModel<B>,
    cache: PagedKvCache<B>,
}

impl<B: Backend> ModelRunner<B> {
    /// Uploads the weights and allocates `num_blocks` KV blocks of `block_size` tokens.
    pub fn new(
        backend: B,
        params: &ModelParams,
        weights: &Weights,
        num_blocks: usize,
        block_size: usize,
    ) -> Result<Self> {
        let model = LlamaModel::load(&backend, params, weights)?;
        let cache = PagedKvCache::new(&backend, params, num_blocks, block_size, weights.compute_dtype())?;
        Ok(Self { backend, model, cache })
    }

    pub fn num_blocks(&self) -> usize {
        self.cache.num_blocks
    }

    pub fn block_size(&self) -> usize {
        self.cache.block_size
    }

    /// The device the model runs on.
    pub fn backend(&self) -> &B {
        &self.backend
    }
}

impl<B: Backend + Send> StepRunner for ModelRunner<B>
where
    B::Buffer: Send,
{
    fn execute(&mut self, batch: &[ScheduledSeq]) -> Result<Vec<f32>> {
        self.model.forward(&self.backend, batch, &self.cache)
    }

    fn vocab_size(&self) -> usize {
        self.model.params().vocab_size
    }

    fn device_name(&self) -> String {
        self.backend.device_name()
    }
}
