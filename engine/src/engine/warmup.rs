//! The start-up warm-up: one short prefill and a few decode steps of a dummy sequence through the model runner,
//! before the engine thread takes requests, so that one-time costs are paid before "Application startup complete."
//! rather than by the first user's request.
//!
//! What the first forward passes pay once: the CPU backend's packed weights rearranged for its kernels on first use
//! (`backend/cpu/quant/rows16.rs`), the first touch of every weight page (a GGUF file's blocks are read on demand),
//! the compute pool's threads waking and their buffers growing, activation scratch on every backend, and on CUDA the
//! kernels' first launches and the decode graph's capture.
//!
//! Boundary: the warm-up runs on the runner alone, before the engine loop exists. Its blocks are free blocks of the
//! scheduler's pool, read from the pool and left free (nothing has been scheduled yet, so no block holds a prefix
//! hash; a block is always written before a request reads it, so what the warm-up leaves in them is never seen). No
//! request, metric or prefix-cache entry records it.

use rserve_scheduler::{BlockId, KvCacheManager, RequestId, ScheduledSeq, TokenId};

use crate::error::{EngineError, Result};
use crate::runner::StepRunner;
use crate::sampling::{RowParams, StepSampling};

/// Prompt tokens of the warm-up prefill: more than the 16 rows up to which the CPU's matmuls take their decode kernels,
/// so the prefill kernels run too; small enough to cost a few milliseconds on SmolLM2.
const PREFILL_TOKENS: usize = 32;
/// Decode steps after the prefill (one token each): the first may still pay for the decode kernels' first launch or
/// a graph capture; the next ones run as every later step does.
const DECODE_STEPS: usize = 3;

/// The limits a warm-up sequence must respect.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WarmupLimits {
    pub block_size: usize,
    pub max_model_len: usize,
    pub max_num_batched_tokens: usize,
    pub vocab_size: usize,
}

/// Runs the warm-up through `runner` on free blocks of `kv`; returns the tokens it computed (0 when the KV cache is too
/// small to hold even one token per group, which only tests configure).
pub(crate) fn warm_up(runner: &mut dyn StepRunner, kv: &KvCacheManager, limits: WarmupLimits) -> Result<usize> {
    let groups = kv.groups().len().max(1);
    let free = kv.pool().free_blocks().count();
    let blocks_per_group = free / groups;
    // Tokens that fit: the KV blocks each group may take, the model length and one step's token budget.
    let fit = (blocks_per_group * limits.block_size).min(limits.max_model_len);
    let prefill = PREFILL_TOKENS.min(limits.max_num_batched_tokens).min(fit);
    if prefill == 0 || limits.vocab_size == 0 {
        return Ok(0);
    }
    let decode = DECODE_STEPS.min(fit - prefill);
    let needed = (prefill + decode).div_ceil(limits.block_size);
    // Distinct free blocks for each group, in the pool's hand-out order.
    let mut free_blocks = kv.pool().free_blocks();
    let tables: Vec<Vec<BlockId>> = (0..groups).map(|_| free_blocks.by_ref().take(needed).collect()).collect();
    // Ordinary token ids spread over the vocabulary (no special token needed: the logits are thrown away).
    let token = |i: usize| TokenId(((1 + i * 7919) % limits.vocab_size) as u32);
    let step = |tokens: Vec<TokenId>, start: usize| {
        // Whole tables every step (each a first schedule), under an id no request has (the handle numbers requests
        // from 1); the runner forgets it after the warm-up.
        let mut seq = ScheduledSeq::with_groups(tokens, start, tables.clone(), limits.block_size);
        seq.request_id = RequestId(0);
        vec![seq]
    };
    let fail = |what: &str, e: EngineError| EngineError::Backend(format!("start-up warm-up ({what}): {e}"));
    runner.execute(&step((0..prefill).map(token).collect(), 0)).map_err(|e| fail("prefill", e))?;
    // The engine's own paths, greedy and sampled in turn: the token choice on the device (its kernels' first
    // launches and compilation, a greedy decode graph's capture), as requests will take them.
    let greedy = StepSampling::greedy(1);
    let sampled = StepSampling {
        params: RowParams { temperature: 1.0, top_p: 0.9, ..RowParams::GREEDY }.pack().to_vec(),
        ..StepSampling::default()
    };
    for (i, pos) in (prefill..prefill + decode).enumerate() {
        let batch = step(vec![token(pos)], pos);
        let choice = if i % 2 == 0 { &greedy } else { &sampled };
        runner.execute_sampled(&batch, choice, None).map_err(|e| fail("decode", e))?;
    }
    runner.finished(&[RequestId(0)]);
    Ok(prefill + decode)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rserve_scheduler::KvGroupSpec;

    /// Records each step's sequences; returns `vocab` zero logits per sequence.
    struct Recorder {
        steps: Vec<Vec<ScheduledSeq>>,
        vocab: usize,
    }

    impl StepRunner for Recorder {
        fn execute(&mut self, batch: &[ScheduledSeq]) -> Result<Vec<f32>> {
            self.steps.push(batch.to_vec());
            Ok(vec![0.0; batch.len() * self.vocab])
        }
        fn vocab_size(&self) -> usize {
            self.vocab
        }
        fn device_name(&self) -> String {
            "recorder".into()
        }
    }

    fn limits(block_size: usize) -> WarmupLimits {
        WarmupLimits { block_size, max_model_len: 1024, max_num_batched_tokens: 2048, vocab_size: 100 }
    }

    #[test]
    fn one_prefill_then_decodes_on_free_blocks_of_each_group() {
        let kv = KvCacheManager::new(64, 16, true, &[KvGroupSpec::FULL, KvGroupSpec::sliding(8)]);
        let free_before: Vec<BlockId> = kv.pool().free_blocks().collect();
        let mut r = Recorder { steps: Vec::new(), vocab: 100 };
        assert_eq!(warm_up(&mut r, &kv, limits(16)).unwrap(), PREFILL_TOKENS + DECODE_STEPS);
        assert_eq!(r.steps.len(), 1 + DECODE_STEPS);
        let prefill = &r.steps[0][0];
        assert_eq!((prefill.token_ids.len(), prefill.start_position), (PREFILL_TOKENS, 0));
        assert!(prefill.is_first_schedule && prefill.sample);
        assert!(prefill.token_ids.iter().all(|t| (t.0 as usize) < 100));
        for (i, step) in r.steps[1..].iter().enumerate() {
            assert_eq!((step[0].token_ids.len(), step[0].start_position), (1, PREFILL_TOKENS + i));
            // Whole tables each step: the warm-up sends no deltas.
            assert!(step[0].is_first_schedule && step[0].block_tables == prefill.block_tables);
        }
        // Each group has its own free blocks (none shared), and the pool is left as it was.
        let tables = &prefill.block_tables;
        assert_eq!(tables.len(), 2);
        assert!(tables.iter().flatten().all(|b| free_before.contains(b)));
        assert!(tables[0].iter().all(|b| !tables[1].contains(b)));
        assert_eq!(kv.pool().free_blocks().collect::<Vec<_>>(), free_before);
    }

    #[test]
    fn a_small_cache_or_step_budget_shortens_the_warm_up() {
        // Two blocks of 8 tokens: the prefill takes 16 tokens and leaves no room for a decode step.
        let kv = KvCacheManager::new(2, 8, true, &[KvGroupSpec::FULL]);
        let mut r = Recorder { steps: Vec::new(), vocab: 100 };
        assert_eq!(warm_up(&mut r, &kv, limits(8)).unwrap(), 16);
        assert_eq!(r.steps.len(), 1);
        // A step budget of 4 tokens caps the prefill.
        let kv = KvCacheManager::new(64, 16, true, &[KvGroupSpec::FULL]);
        let mut r = Recorder { steps: Vec::new(), vocab: 100 };
        let l = WarmupLimits { max_num_batched_tokens: 4, ..limits(16) };
        assert_eq!(warm_up(&mut r, &kv, l).unwrap(), 4 + DECODE_STEPS);
        // No block at all: nothing runs.
        let kv = KvCacheManager::new(0, 16, true, &[KvGroupSpec::FULL]);
        let mut r = Recorder { steps: Vec::new(), vocab: 100 };
        assert_eq!(warm_up(&mut r, &kv, limits(16)).unwrap(), 0);
        assert!(r.steps.is_empty());
    }
}
