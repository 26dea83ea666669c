//! `ModelRunner`: a model, its backend and its paged KV cache, run one step at a time: the one runner of every
//! backend. A step is checked and flattened once (`FlatBatch`), then either replayed from a recording or run op by op:
//!
//! - On a backend that records (`Backend::records`, CUDA graphs), a decode step (one new token per sequence) is
//!   padded to a batch-size bucket (`FlatBatch::pad_decode`: extra rows write only a reserved KV block past the
//!   scheduler's ones), its bucket's persistent inputs are refilled in place, and the recording of its (bucket,
//!   attention partitions) replays. The first step of a key runs op by op (its result is used, and it leaves the
//!   attention work split cached), then the same step is recorded, greedy token choice included.
//! - Every other step (prefill chunks, mixed steps, batches beyond the largest bucket, `--enforce-eager`, backends
//!   that do not record) uploads its inputs and runs op by op.
//!
//! The engine launches a step (`StepRunner::launch`: the inputs written, the replay or the ops and the token choice
//! queued) and collects it later (`collect`: the ids read), so the host works while the device computes. With async
//! scheduling the engine launches the next step before it collects this one: positions whose ids the step in flight
//! samples come as `TokenId::PLACEHOLDER`, and `Op::FeedTokens` copies those ids into the next step's inputs on the
//! device, in queue order, so no id travels through the host between the two steps. A step's ids are read so that
//! collecting it waits for it alone: through a read-back queued behind it at launch (`Backend::read_u32_later`,
//! CUDA), or else read just before the next step is queued behind it.
//!
//! Either way the token choice happens where the logits are (`sampling::device::sample_on`; a recording's own
//! argmax for plain greedy steps), so only ids come back, unless the step asks for logits.

use super::PoolRows;
use crate::backend::{Backend, Op};
use crate::config::ModelParams;
use crate::engine::phase::Phase;
use crate::error::{EngineError, Result};
use crate::model::shard::NoComm;
use crate::model::{DeviceBatch, DeviceOutput, FlatBatch, KvLayout, LlamaModel, PagedKvCache, RowOwners, ScheduledSeq};
use crate::sampling::device::{queue_sample_on, sample_on, QueuedChoice};
use crate::sampling::prompt::{logit_rows, score_on, PromptLogprobs, PromptRows};
use crate::sampling::{SampledRows, StepSampling};
use crate::weights::Weights;
use rserve_scheduler::{BlockTables, IdMap, RequestId, TokenId};
use std::collections::VecDeque;

use super::recorded::{Recorded, RecordedSteps};
use super::{Launch, ProfileMode, RunnerOptions, StepMasks, StepOutput, StepRunner};

/// What a step reads back.
enum Want<'s> {
    Logits,
    /// Each row's most likely (allowed) token.
    Argmax,
    /// The tokens the step's sampling settings choose, on the device.
    Choose(&'s StepSampling),
}

/// How a step is read: its result, and the grammar masks of a constrained step (computed once its forward pass is
/// queued).
struct Read<'m, 's> {
    want: Want<'s>,
    masks: Option<&'m mut dyn FnMut() -> StepMasks>,
    /// Prompt rows the step scores (`prompt_logprobs`): it runs op by op and scores them before it is read.
    prompt: &'s [PromptRows],
}

impl<'m, 's> Read<'m, 's> {
    fn new(want: Want<'s>, masks: Option<&'m mut dyn FnMut() -> StepMasks>) -> Self {
        Self { want, masks, prompt: &[] }
    }
}

/// A step whose forward pass is queued and whose result is not read yet.
enum Pending<B: Backend> {
    /// A replay of the recording under this key (its logits and ids are the recording's), of `real` sequences.
    Replayed { key: (usize, usize), real: usize },
    /// A step run op by op: its logits.
    Eager { logits: B::Buffer, real: usize },
}

/// Where a launched step's chosen ids are on the device.
enum Chosen<B: Backend> {
    /// The recording's own argmax under this key (a plain greedy replay of `rows` sequences): valid until that
    /// recording replays again (`ModelRunner::keep_ids` copies them out first).
    Recording { key: (usize, usize), rows: usize },
    /// A choice queued at launch, in buffers of its own.
    Queued(QueuedChoice<B>),
    /// The first `rows` ids of a recording's argmax, copied out before the recording replayed again.
    Copied { ids: B::Buffer, rows: usize },
}

/// A launched step not collected yet.
struct InFlight<B: Backend> {
    chosen: Chosen<B>,
    /// The ids' read-back, queued at launch where the backend can (`Backend::read_u32_later`): collecting waits for
    /// this step only, not for the step launched behind it.
    read: Option<Box<dyn rserve_backend::PendingRead>>,
    /// The ids, read before the next step was queued behind this one, on a backend without queued read-backs.
    ready: Option<SampledRows>,
    /// Each sequence's row in the step, by request: where a later step's placeholders take their ids from.
    rows: IdMap<RequestId, u32>,
    /// The logits of a step run op by op, which its queued choice reads.
    _logits: Option<B::Buffer>,
    /// A replayed step's key and real rows (`--profile graph`).
    replayed: Option<((usize, usize), usize)>,
    /// The step's prompt scores (read when it was launched).
    prompt: Vec<PromptLogprobs>,
}

/// What `queue` did: the step is read already (a first sight that it recorded, an empty batch), or its forward
/// pass is queued and `read_pending` reads it as the `Read` says.
enum Queued<'m, 's, B: Backend> {
    Done(StepOutput),
    Pending(Pending<B>, Read<'m, 's>),
}

/// A llama-family model on backend `B` with its KV cache.
pub struct ModelRunner<B: Backend> {
    // Field order is drop order: launched steps' buffers and the recordings before the model, the cache and the
    // backend.
    /// Launched steps not collected yet, oldest first (two at most: async scheduling launches one ahead).
    launched: VecDeque<InFlight<B>>,
    /// `0..max_num_seqs` on the device: the rows `keep_ids` copies.
    iota: Option<B::Buffer>,
    /// The prompt scores of the step queued last, until its reader takes them.
    scored: Vec<PromptLogprobs>,
    steps: RecordedSteps<B>,
    /// Each running request's block tables, kept from the scheduler's deltas.
    tables: BlockTables,
    model: LlamaModel<B>,
    cache: PagedKvCache<B>,
    /// Blocks the scheduler may hand out; on a backend that records, block `usable_blocks` is the padding rows' own.
    usable_blocks: usize,
    opts: RunnerOptions,
    backend: B,
}

impl<B: Backend> ModelRunner<B> {
    /// Uploads the weights and allocates `num_blocks` KV blocks of `block_size` tokens, with the default limits
    /// (`RunnerOptions::default`).
    pub fn new(
        backend: B,
        params: &ModelParams,
        weights: &Weights,
        num_blocks: usize,
        block_size: usize,
    ) -> Result<Self> {
        Self::with_options(backend, params, weights, num_blocks, block_size, RunnerOptions::default())
    }

    /// `new` with the engine's limits (the recorded steps' largest batch and context, `--enforce-eager`,
    /// `--profile`). On a backend that records, one more block than `num_blocks` is allocated: the padding rows'.
    pub fn with_options(
        backend: B,
        params: &ModelParams,
        weights: &Weights,
        num_blocks: usize,
        block_size: usize,
        opts: RunnerOptions,
    ) -> Result<Self> {
        let phase = Phase::start("Model weights on the device");
        let model = LlamaModel::load(&backend, params, weights)?;
        phase.done(&format!("{:.2} GiB", weights.total_bytes() as f64 / (1u64 << 30) as f64));
        let phase = Phase::start("KV cache allocated");
        let (layout, dtype) = (KvLayout::of(params), weights.compute_dtype());
        let records = backend.records();
        let allocated = num_blocks + usize::from(records);
        let cache = PagedKvCache::new(&backend, params, &layout, 0..params.num_layers, allocated, block_size, dtype)?;
        phase.done(&format!("{} blocks of {block_size} tokens", cache.num_blocks));
        let steps = RecordedSteps::new(
            opts.max_num_seqs,
            opts.max_model_len.max(1).div_ceil(block_size),
            opts.profile == ProfileMode::Graph,
        );
        if records {
            tracing::info!(
                "{}: decode steps {} (buckets {:?})",
                backend.device_name(),
                if opts.enforce_eager { "run op by op (--enforce-eager)" } else { "replay recordings" },
                steps.buckets
            );
        }
        Ok(Self {
            launched: VecDeque::new(),
            iota: None,
            scored: Vec::new(),
            steps,
            tables: BlockTables::default(),
            model,
            cache,
            usable_blocks: num_blocks,
            opts,
            backend,
        })
    }

    /// KV blocks the scheduler may hand out.
    pub fn num_blocks(&self) -> usize {
        self.usable_blocks
    }

    pub fn block_size(&self) -> usize {
        self.cache.block_size
    }

    /// The device the model runs on.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Turns recorded steps off (`true`) or on for the next steps (benchmarks compare the two).
    pub fn set_enforce_eager(&mut self, eager: bool) {
        self.opts.enforce_eager = eager;
    }

    /// Drops every recording, so the next steps record again (benchmarks that change a backend setting between
    /// runs: a recording keeps the kernels it was recorded with).
    pub fn clear_recordings(&mut self) {
        self.steps.recorded.clear();
    }

    /// Recordings made so far.
    pub fn num_recordings(&self) -> usize {
        self.steps.recorded.len()
    }

    /// The bucket a decode batch replays in, if it takes the recorded path.
    fn bucket_for(&self, batch: &[ScheduledSeq]) -> Option<usize> {
        if !self.backend.records() || self.opts.enforce_eager || batch.iter().any(|s| s.token_ids.len() != 1) {
            return None;
        }
        if batch.iter().any(|s| s.num_blocks > self.steps.max_blocks) {
            return None;
        }
        self.steps.buckets.iter().copied().find(|&b| b >= batch.len())
    }

    /// Checks and flattens the step (once: a replayed step checks nothing), then replays it or runs it op by op.
    fn run(&mut self, batch: &[ScheduledSeq], step: Read<'_, '_>) -> Result<StepOutput> {
        let out = match self.queue(batch, step)? {
            Queued::Done(out) => out,
            Queued::Pending(p, step) => self.read_pending(p, step)?,
        };
        Ok(match out {
            StepOutput::Sampled(mut s) => {
                s.prompt = std::mem::take(&mut self.scored);
                StepOutput::Sampled(s)
            }
            other => other,
        })
    }

    /// A step whose choice the device ops cannot make (more log-prob alternatives than they report): its logits are
    /// read back and chosen on the host.
    fn sample_host_step(
        &mut self,
        batch: &[ScheduledSeq],
        sampling: &StepSampling,
        masks: Option<&mut dyn FnMut() -> StepMasks>,
    ) -> Result<SampledRows> {
        let read = Read { want: Want::Logits, masks, prompt: &sampling.prompt };
        let StepOutput::Logits(mut logits) = self.run(batch, read)? else {
            return Err(EngineError::Backend("expected logits".into()));
        };
        let mut rows = crate::sampling::step::sample_host(&mut logits, self.model.params().vocab_size, sampling);
        rows.prompt = std::mem::take(&mut self.scored);
        Ok(rows)
    }

    /// Reads a queued step (waiting for the device).
    fn read_pending(&mut self, p: Pending<B>, step: Read<'_, '_>) -> Result<StepOutput> {
        match p {
            Pending::Eager { logits, real } => self.read(&logits, None, real, step),
            Pending::Replayed { key, real } => {
                let r = self.steps.recorded.get(&key).ok_or_else(|| EngineError::Backend("recording gone".into()))?;
                let got = self.read(&r.logits, Some(&r.ids), real, step)?;
                if let Some(p) = self.steps.profile.as_mut() {
                    let device_ms = self.steps.recorded.get(&key).and_then(|r| self.backend.replay_ms(&r.rec));
                    p.step(real, key.0, device_ms.unwrap_or(0.0));
                }
                Ok(got)
            }
        }
    }

    /// Checks and flattens the step, then queues its replay or its ops; `step` says how it will be read.
    fn queue<'m, 's>(&mut self, batch: &[ScheduledSeq], step: Read<'m, 's>) -> Result<Queued<'m, 's, B>> {
        if batch.is_empty() {
            return Ok(Queued::Done(match step.want {
                Want::Logits => StepOutput::Logits(Vec::new()),
                Want::Argmax => StepOutput::Ids(Vec::new()),
                Want::Choose(_) => StepOutput::Sampled(SampledRows::default()),
            }));
        }
        self.scored.clear();
        let bucket = self.bucket_for(batch).filter(|_| step.prompt.is_empty());
        self.tables.apply(batch).map_err(|e| EngineError::InvalidArgument(e.to_string()))?;
        let (mut flat, owners) = match bucket {
            Some(bucket) => self.decode_batch(batch, bucket)?,
            None => {
                let mut flat = self.model.flatten(batch, &self.tables, &self.cache, self.usable_blocks, 0)?;
                if !step.prompt.is_empty() {
                    flat.with_prompt_rows(&logit_rows(step.prompt, &flat.query_start))?;
                }
                (flat, RowOwners::default())
            }
        };
        let feed = placeholders(self.launched.back(), batch, &mut flat)?;
        let vocab = self.model.params().vocab_size;
        if let Some(t) = flat.ids.iter().find(|&&t| t as usize >= vocab) {
            return Err(EngineError::InvalidArgument(format!("token id {t} is outside the vocabulary of {vocab}")));
        }
        if let (Some(p), None) = (self.steps.profile.as_mut(), bucket) {
            p.other_step();
        }
        match bucket {
            Some(bucket) => {
                let queued = self.queue_recorded(&flat, bucket, batch.len(), feed.as_deref(), step)?;
                // Kept for the next step of this bucket, which refills it from its deltas.
                self.steps.hosts.insert(bucket, (flat, owners));
                Ok(queued)
            }
            None => {
                let dev = DeviceBatch::upload(&self.backend, &flat)?;
                if let Some(from) = &feed {
                    self.feed(&dev.ids, from)?;
                }
                let logits = self.forward(&flat, &dev)?;
                if !step.prompt.is_empty() {
                    self.scored = score_on(&self.backend, &logits, flat.num_seqs(), step.prompt, vocab)?;
                }
                Ok(Queued::Pending(Pending::Eager { logits, real: flat.num_seqs() }, step))
            }
        }
    }

    /// The forward pass over uploaded inputs, to the logits.
    fn forward(&self, flat: &FlatBatch, dev: &DeviceBatch<B>) -> Result<B::Buffer> {
        match self.model.forward_device(&self.backend, flat, dev, &self.cache, &NoComm, None)? {
            DeviceOutput::Logits(logits) => Ok(logits),
            DeviceOutput::Hidden { .. } => Err(EngineError::Backend("the model has no LM head".into())),
        }
    }

    /// Reads a step's result from the first `real` rows of `logits`. With `masks` (a constrained step) the grammar
    /// masks are computed now — the forward pass is already queued — and applied on the device. `ids`: the
    /// recording's argmax of every row, valid for a step without masks.
    fn read(&self, logits: &B::Buffer, ids: Option<&B::Buffer>, real: usize, step: Read<'_, '_>) -> Result<StepOutput> {
        let b = &self.backend;
        let vocab = self.model.params().vocab_size;
        let masks = step.masks.map(|m| m());
        match step.want {
            Want::Choose(s) => match ids {
                Some(ids) if masks.is_none() && s.is_plain_greedy() => {
                    Ok(StepOutput::Sampled(SampledRows::of_ids(b.download_u32(ids, real)?)))
                }
                _ => sample_on(b, logits, real, vocab, s, masks).map(StepOutput::Sampled),
            },
            Want::Logits => {
                if let Some(m) = &masks {
                    m.apply_on(b, logits, real, vocab)?;
                }
                let mut all = b.download_f32(logits)?;
                all.truncate(real * vocab);
                Ok(StepOutput::Logits(all))
            }
            Want::Argmax => {
                if let (Some(ids), None) = (ids, &masks) {
                    return Ok(StepOutput::Ids(b.download_u32(ids, real)?));
                }
                if let Some(m) = &masks {
                    m.apply_on(b, logits, real, vocab)?;
                }
                // Masked rows pick again from the masked logits (a recording's own argmax ran before the masks).
                let fresh;
                let out = match ids {
                    Some(ids) => ids,
                    None => {
                        fresh = b.alloc_u32_output(real)?;
                        &fresh
                    }
                };
                b.run(Op::ArgmaxRows { x: logits, out, rows: real, width: vocab })?;
                Ok(StepOutput::Ids(b.download_u32(out, real)?))
            }
        }
    }

    /// A decode step through its bucket: refill the bucket's inputs, then replay the key's recording, or — first
    /// sight of the key — run the step op by op and record it for the next steps.
    fn queue_recorded<'m, 's>(
        &mut self,
        flat: &FlatBatch,
        bucket: usize,
        real: usize,
        feed: Option<&[u32]>,
        step: Read<'m, 's>,
    ) -> Result<Queued<'m, 's, B>> {
        let longest = flat.context_lens.iter().map(|&c| c as usize).max().unwrap_or(1);
        let key = (bucket, self.backend.decode_partitions(longest, bucket));
        self.steps.inputs_for(&self.backend, bucket, flat)?;
        let dev = &self.steps.inputs[&bucket].dev;
        if let Some(from) = feed {
            self.feed(&dev.ids, from)?;
        }
        if self.steps.unrecordable.contains(&key) {
            if let Some(p) = self.steps.profile.as_mut() {
                p.other_step();
            }
            let logits = self.forward(flat, dev)?;
            return Ok(Queued::Pending(Pending::Eager { logits, real }, step));
        }
        if !self.steps.recorded.contains_key(&key) {
            if let Some(p) = self.steps.profile.as_mut() {
                p.other_step();
            }
            // First sight of this shape: run it op by op (this step's result; it also caches the attention work
            // split), then record the same ops for the next steps.
            let logits = self.forward(flat, dev)?;
            let got = self.read(&logits, None, real, step)?;
            drop(logits);
            self.record(flat, key)?;
            return Ok(Queued::Done(got));
        }
        let timed = self.steps.profile.is_some();
        self.keep_ids(key)?;
        let r = &self.steps.recorded[&key];
        self.backend.replay(&r.rec, timed)?;
        Ok(Queued::Pending(Pending::Replayed { key, real }, step))
    }

    /// A decode step in bucket `bucket`: the bucket's host inputs refilled from the step's deltas, or (first sight,
    /// or after a failed step) flattened anew and padded to the bucket.
    fn decode_batch(&mut self, batch: &[ScheduledSeq], bucket: usize) -> Result<(FlatBatch, RowOwners)> {
        let (block_size, pad) = (self.cache.block_size, self.usable_blocks as u32);
        if let Some((mut flat, mut owners)) = self.steps.hosts.remove(&bucket) {
            flat.refill_decode(&mut owners, batch, &self.tables, block_size, self.usable_blocks, pad)?;
            self.model.mark(&mut flat);
            return Ok((flat, owners));
        }
        let width = self.steps.max_blocks;
        let mut flat = self.model.flatten(batch, &self.tables, &self.cache, self.usable_blocks, width)?;
        flat.pad_decode(bucket, pad, block_size);
        let owners = RowOwners::of(&flat, batch, &self.tables);
        Ok((flat, owners))
    }

    /// Feeds the last launched step's chosen ids into `ids` where `from` names one of its rows (`Op::FeedTokens`).
    fn feed(&self, ids: &B::Buffer, from: &[u32]) -> Result<()> {
        let prev = self.launched.back().ok_or_else(|| EngineError::Backend("no launched step to feed from".into()))?;
        let (chosen, rows) = match &prev.chosen {
            Chosen::Recording { key, rows } => {
                let r = self.steps.recorded.get(key).ok_or_else(|| EngineError::Backend("recording gone".into()))?;
                (&r.ids, *rows)
            }
            Chosen::Queued(c) => (&c.ids, c.rows()),
            Chosen::Copied { ids, rows } => (ids, *rows),
        };
        let from_buf = self.backend.upload_u32(from)?;
        let op = Op::FeedTokens { ids, prev: chosen, from: &from_buf, count: from.len(), prev_len: rows };
        Ok(self.backend.run(op)?)
    }

    /// Before the recording under `key` replays: a launched step whose ids are still that recording's argmax gets
    /// them copied into a buffer of its own, which the replay does not overwrite.
    fn keep_ids(&mut self, key: (usize, usize)) -> Result<()> {
        for i in 0..self.launched.len() {
            let Chosen::Recording { key: k, rows } = self.launched[i].chosen else { continue };
            // A step whose read-back is queued already has its ids copied before the replay.
            if k != key || self.launched[i].read.is_some() || self.launched[i].ready.is_some() {
                continue;
            }
            if self.iota.is_none() {
                let all: Vec<u32> = (0..self.steps.buckets.last().copied().unwrap_or(1) as u32).collect();
                self.iota = Some(self.backend.upload_u32(&all)?);
            }
            let (b, r) = (&self.backend, &self.steps.recorded[&key]);
            let (ids, iota) = (b.alloc_u32_output(rows)?, self.iota.as_ref().expect("set above"));
            b.run(Op::FeedTokens { ids: &ids, prev: &r.ids, from: iota, count: rows, prev_len: rows })?;
            self.launched[i].chosen = Chosen::Copied { ids, rows };
        }
        Ok(())
    }

    /// Reads a launched step's ids (waiting for the device).
    fn read_in_flight(&mut self, mut f: InFlight<B>) -> Result<SampledRows> {
        let mut got = match (&f.chosen, f.read.take()) {
            _ if f.ready.is_some() => f.ready.take().unwrap_or_default(),
            (_, Some(read)) => {
                let ids = read.wait()?;
                SampledRows::of_ids(ids)
            }
            (chosen, None) => self.read_chosen(chosen)?,
        };
        got.prompt = std::mem::take(&mut f.prompt);
        if let (Some((key, real)), Some(p)) = (f.replayed, self.steps.profile.as_mut()) {
            let device_ms = self.steps.recorded.get(&key).and_then(|r| self.backend.replay_ms(&r.rec));
            p.step(real, key.0, device_ms.unwrap_or(0.0));
        }
        Ok(got)
    }

    /// Reads a launched step's ids from the device (waiting for every op queued).
    fn read_chosen(&self, chosen: &Chosen<B>) -> Result<SampledRows> {
        let b = &self.backend;
        Ok(match chosen {
            Chosen::Queued(c) => c.read(b)?,
            Chosen::Recording { key, rows } => {
                let r = self.steps.recorded.get(key).ok_or_else(|| EngineError::Backend("recording gone".into()))?;
                SampledRows::of_ids(b.download_u32(&r.ids, *rows)?)
            }
            Chosen::Copied { ids, rows } => SampledRows::of_ids(b.download_u32(ids, *rows)?),
        })
    }

    /// Records the forward pass and argmax of `flat` (already in its bucket's inputs) under `key`; a key that cannot
    /// be recorded runs op by op from now on.
    fn record(&mut self, flat: &FlatBatch, key: (usize, usize)) -> Result<()> {
        let (b, bucket) = (&self.backend, key.0);
        let dev = &self.steps.inputs[&bucket].dev;
        let t0 = std::time::Instant::now();
        b.begin_recording()?;
        let ops = (|| -> Result<(B::Buffer, B::Buffer)> {
            let logits = self.forward(flat, dev)?;
            let ids = b.alloc_u32_output(bucket)?;
            let vocab = self.model.params().vocab_size;
            b.run(Op::ArgmaxRows { x: &logits, out: &ids, rows: bucket, width: vocab })?;
            Ok((logits, ids))
        })();
        let rec = b.end_recording().map_err(EngineError::from);
        match (ops, rec) {
            (Ok((logits, ids)), Ok(rec)) => {
                tracing::debug!(
                    "recorded the decode step of batch {bucket} x {} partition(s) in {:.1} ms",
                    key.1,
                    t0.elapsed().as_secs_f64() * 1e3
                );
                self.steps.recorded.insert(key, Recorded { rec, logits, ids });
            }
            // The step itself ran (op by op, before): a shape that cannot be recorded runs op by op from now on.
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!("recording the decode step of batch {bucket} failed ({e}); it runs op by op");
                self.steps.unrecordable.insert(key);
            }
        }
        Ok(())
    }
}

/// Replaces each placeholder of `flat` (a position whose id `prev`, the last launched step, samples) by 0 and returns,
/// per token, the row of that step to feed it from (`u32::MAX`: the host's id), or None without placeholders.
fn placeholders<B: Backend>(
    prev: Option<&InFlight<B>>,
    batch: &[ScheduledSeq],
    flat: &mut FlatBatch,
) -> Result<Option<Vec<u32>>> {
    if !flat.ids.contains(&TokenId::PLACEHOLDER.0) {
        return Ok(None);
    }
    let mut from = vec![u32::MAX; flat.ids.len()];
    let mut at = 0;
    for s in batch {
        for k in 0..s.token_ids.len() {
            if flat.ids[at + k] != TokenId::PLACEHOLDER.0 {
                continue;
            }
            let row = prev.and_then(|p| p.rows.get(&s.request_id)).ok_or_else(|| {
                EngineError::InvalidArgument(format!(
                    "request {}: a token to compute whose id no launched step samples",
                    s.request_id.0
                ))
            })?;
            from[at + k] = *row;
            flat.ids[at + k] = 0;
        }
        at += s.token_ids.len();
    }
    Ok(Some(from))
}

impl<B: Backend + Send> StepRunner for ModelRunner<B>
where
    B::Buffer: Send,
    B::Recording: Send,
{
    fn execute(&mut self, batch: &[ScheduledSeq]) -> Result<Vec<f32>> {
        match self.run(batch, Read::new(Want::Logits, None))? {
            StepOutput::Logits(l) => Ok(l),
            _ => Err(EngineError::Backend("expected logits".into())),
        }
    }

    fn execute_greedy(&mut self, batch: &[ScheduledSeq]) -> Result<Option<Vec<u32>>> {
        match self.run(batch, Read::new(Want::Argmax, None))? {
            StepOutput::Ids(ids) => Ok(Some(ids)),
            _ => Err(EngineError::Backend("expected ids".into())),
        }
    }

    fn execute_masked(
        &mut self,
        batch: &[ScheduledSeq],
        greedy: bool,
        masks: &mut dyn FnMut() -> StepMasks,
    ) -> Result<StepOutput> {
        let want = if greedy { Want::Argmax } else { Want::Logits };
        self.run(batch, Read::new(want, Some(masks)))
    }

    fn execute_sampled(
        &mut self,
        batch: &[ScheduledSeq],
        sampling: &StepSampling,
        masks: Option<&mut dyn FnMut() -> StepMasks>,
    ) -> Result<SampledRows> {
        if !sampling.logprobs_fit_device() {
            // More alternatives than the device op reports (`--max-logprobs` above 20): the host sampler.
            return self.sample_host_step(batch, sampling, masks);
        }
        match self.run(batch, Read { want: Want::Choose(sampling), masks, prompt: &sampling.prompt })? {
            StepOutput::Sampled(s) => Ok(s),
            _ => Err(EngineError::Backend("expected sampled ids".into())),
        }
    }

    fn launch(&mut self, batch: &[ScheduledSeq], sampling: &StepSampling) -> Result<Launch> {
        if !sampling.logprobs_fit_device() {
            return Ok(Launch::Done(self.sample_host_step(batch, sampling, None)?));
        }
        // Without a queued read-back, the step in flight is read before this one is queued behind it: read at collect,
        // it would wait for this step too, and the host's work on its tokens would no longer overlap this step.
        if let Some(i) = self.launched.len().checked_sub(1) {
            if self.launched[i].read.is_none() && self.launched[i].ready.is_none() {
                let got = self.read_chosen(&self.launched[i].chosen)?;
                self.launched[i].ready = Some(got);
            }
        }
        let rows: IdMap<RequestId, u32> = batch.iter().enumerate().map(|(i, s)| (s.request_id, i as u32)).collect();
        let vocab = self.model.params().vocab_size;
        // The choice is queued now, behind the forward pass: a step launched after this one may replay the same
        // recording (overwriting its logits) or feed on these ids before this one is collected.
        let read = Read { want: Want::Choose(sampling), masks: None, prompt: &sampling.prompt };
        let (chosen, logits, replayed) = match self.queue(batch, read)? {
            Queued::Done(StepOutput::Sampled(mut s)) => {
                s.prompt = std::mem::take(&mut self.scored);
                return Ok(Launch::Done(s));
            }
            Queued::Done(_) => return Err(EngineError::Backend("expected sampled ids".into())),
            Queued::Pending(Pending::Eager { logits, real }, _) => {
                let c = queue_sample_on(&self.backend, &logits, real, vocab, sampling, None)?;
                (Chosen::Queued(c), Some(logits), None)
            }
            Queued::Pending(Pending::Replayed { key, real }, _) if sampling.is_plain_greedy() => {
                (Chosen::Recording { key, rows: real }, None, Some((key, real)))
            }
            Queued::Pending(Pending::Replayed { key, real }, _) => {
                let r = self.steps.recorded.get(&key).ok_or_else(|| EngineError::Backend("recording gone".into()))?;
                let c = queue_sample_on(&self.backend, &r.logits, real, vocab, sampling, None)?;
                (Chosen::Queued(c), None, Some((key, real)))
            }
        };
        let read = match &chosen {
            Chosen::Queued(c) if !c.has_logprobs() => self.backend.read_u32_later(&c.ids, c.rows())?,
            Chosen::Recording { key, rows } => match self.steps.recorded.get(key) {
                Some(r) => self.backend.read_u32_later(&r.ids, *rows)?,
                None => None,
            },
            _ => None,
        };
        let prompt = std::mem::take(&mut self.scored);
        self.launched.push_back(InFlight { chosen, read, ready: None, rows, _logits: logits, replayed, prompt });
        Ok(Launch::Running)
    }

    fn collect(&mut self, _sampling: &StepSampling) -> Result<SampledRows> {
        let f = self.launched.pop_front().ok_or_else(|| EngineError::Backend("no step was launched".into()))?;
        self.read_in_flight(f)
    }

    fn overlaps(&self) -> bool {
        self.opts.async_scheduling
    }

    fn pool(&mut self, batch: &[ScheduledSeq], rows: &[PoolRows], _segments: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
        if batch.len() != rows.len() {
            return Err(EngineError::InvalidArgument(format!(
                "{} pooling rows for {} sequences",
                rows.len(),
                batch.len()
            )));
        }
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        self.tables.apply(batch).map_err(|e| EngineError::InvalidArgument(e.to_string()))?;
        let mut flat = self.model.flatten(batch, &self.tables, &self.cache, self.usable_blocks, 0)?;
        let vocab = self.model.params().vocab_size;
        if let Some(t) = flat.ids.iter().find(|&&t| t as usize >= vocab) {
            return Err(EngineError::InvalidArgument(format!("token id {t} is outside the vocabulary of {vocab}")));
        }
        let spans: Vec<std::ops::Range<u32>> =
            rows.iter().enumerate().map(|(i, r)| r.range(flat.query_start[i], flat.query_start[i + 1])).collect();
        flat.with_output_rows(spans.iter().flat_map(|r| r.clone()).collect())?;
        let dev = DeviceBatch::upload(&self.backend, &flat)?;
        let hidden = self.model.forward_hidden(&self.backend, &flat, &dev, &self.cache)?;
        let all = self.backend.download_f32(&hidden)?;
        Ok(super::split_pooled(&all, spans.iter().map(|r| r.len()), self.model.params().hidden_size))
    }

    fn abandon(&mut self) {
        self.launched.clear();
    }

    fn finished(&mut self, ids: &[RequestId]) {
        self.tables.forget(ids.iter().copied());
    }

    fn vocab_size(&self) -> usize {
        self.model.params().vocab_size
    }

    fn device_name(&self) -> String {
        self.backend.device_name()
    }
}
