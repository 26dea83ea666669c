//! `CudaGraphRunner`: the CUDA backend's step runner. Decode steps (one new token per sequence) are padded to a
//! batch-size bucket and replayed from a CUDA graph captured once per (bucket, split-KV partitions); everything
//! else (prefill chunks, mixed steps, batches beyond the largest bucket, `--enforce-eager`) runs op by op.
//!
//! A step through a graph: flatten the batch, pad it to the bucket (`FlatBatch::pad_decode`: extra rows write only a
//! reserved KV block past the scheduler's ones), overwrite the bucket's fixed input buffers, replay, read back the
//! logits or — for greedy steps — the argmax ids (a u32 per sequence instead of `vocab` floats). The first step of
//! a key runs eagerly (its result is used, and it leaves the attention work split cached), then the same step is
//! captured; later steps replay. The graph reads only device memory that outlives it: weights, KV cache, the
//! bucket's inputs, and what the capture allocated from the graphs' own free list (see `backend/cuda/buffer.rs`).
//!
//! `--profile graph` prints, every 64 graph decode steps, the wall time per step and the GPU time of the
//! replays (CUDA events around each replay), whose ratio is the share of a decode step the GPU is busy.

use std::collections::HashMap;
use std::time::Instant;

use crate::backend::cuda::{CuBuffer, CudaBackend, Graph};
use crate::backend::Backend;
use crate::config::ModelParams;
use crate::engine::phase::Phase;
use crate::error::{EngineError, Result};
use crate::model::shard::NoComm;
use crate::model::{DeviceBatch, DeviceOutput, FlatBatch, KvLayout, LlamaModel, PagedKvCache, ScheduledSeq};
use crate::runner::{StepMasks, StepOutput, StepRunner};
use crate::sampling::device::sample_on;
use crate::sampling::{SampledRows, StepSampling};
use crate::weights::Weights;

/// Batch sizes decode graphs are captured for (a batch takes the smallest bucket that holds it), up to
/// `max_num_seqs` rounded up to a bucket.
pub fn buckets(max_num_seqs: usize) -> Vec<usize> {
    let mut b = vec![1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128];
    let mut next = 160;
    while *b.last().unwrap_or(&1) < max_num_seqs {
        b.push(next);
        next += 32;
    }
    let cut = b.iter().position(|&x| x >= max_num_seqs).map_or(b.len(), |i| i + 1);
    b.truncate(cut);
    b
}

pub use crate::runner::{GraphOptions, ProfileMode};

struct Captured {
    graph: Graph,
    logits: CuBuffer,
    ids: CuBuffer,
}

#[derive(Default)]
struct Profile {
    steps: usize,
    batch: usize,
    wall_ms: f64,
    gpu_ms: f64,
    last_end: Option<Instant>,
}

/// The model on a CUDA GPU, with decode steps replayed from CUDA graphs.
pub struct CudaGraphRunner {
    // Drop order: graphs and their buffers before the model, cache and backend.
    graphs: HashMap<(usize, usize), Captured>,
    /// Keys whose capture failed: their steps run op by op (over the padded inputs).
    uncapturable: std::collections::HashSet<(usize, usize)>,
    inputs: HashMap<usize, Inputs>,
    model: LlamaModel<CudaBackend>,
    cache: PagedKvCache<CudaBackend>,
    /// Blocks the scheduler may hand out; block `usable_blocks` is the padding rows' own.
    usable_blocks: usize,
    max_blocks: usize,
    buckets: Vec<usize>,
    opts: GraphOptions,
    profile: Option<Profile>,
    backend: CudaBackend,
}

/// A bucket's graph inputs: views into one packed allocation, refilled by one host copy a step.
struct Inputs {
    // Field order is drop order: the views before the allocation they point into.
    dev: DeviceBatch<CudaBackend>,
    packed: CuBuffer,
}

impl Inputs {
    /// ids, positions, query starts, context lengths, last rows, then each KV cache group's slots, then each
    /// group's block tables.
    fn parts(f: &FlatBatch) -> Vec<&[u32]> {
        let mut parts: Vec<&[u32]> = vec![&f.ids, &f.positions, &f.query_start, &f.context_lens, &f.last_rows];
        parts.extend(f.slots.iter().map(Vec::as_slice));
        parts.extend(f.tables.iter().map(Vec::as_slice));
        parts
    }

    fn upload(b: &CudaBackend, f: &FlatBatch) -> Result<Self> {
        let (packed, views) = b.upload_u32_packed(&Self::parts(f))?;
        let groups = f.num_groups();
        let mut views = views.into_iter();
        let mut next = || views.next().ok_or_else(|| EngineError::Backend("cuda: packed inputs".into()));
        let (ids, positions, query_start, context_lens, last_rows) = (next()?, next()?, next()?, next()?, next()?);
        let slots = (0..groups).map(|_| next()).collect::<Result<Vec<_>>>()?;
        let block_tables = (0..groups).map(|_| next()).collect::<Result<Vec<_>>>()?;
        Ok(Self {
            dev: DeviceBatch { ids, positions, slots, query_start, context_lens, block_tables, last_rows },
            packed,
        })
    }

    fn write(&mut self, b: &CudaBackend, f: &FlatBatch) -> Result<()> {
        let d = &mut self.dev;
        let mut views: Vec<&mut CuBuffer> =
            vec![&mut d.ids, &mut d.positions, &mut d.query_start, &mut d.context_lens, &mut d.last_rows];
        views.extend(d.slots.iter_mut());
        views.extend(d.block_tables.iter_mut());
        Ok(b.write_u32_packed(&self.packed, &mut views, &Self::parts(f))?)
    }
}

/// What a step reads back.
enum Want<'s> {
    Logits,
    Argmax,
    /// The tokens the step's sampling settings choose, drawn on the device.
    Sample(&'s StepSampling),
}

/// How a step is read: its result, and the grammar masks of a constrained step (computed once its forward pass is
/// queued).
struct Read<'m, 's> {
    want: Want<'s>,
    masks: Option<&'m mut dyn FnMut() -> StepMasks>,
}

impl CudaGraphRunner {
    /// Uploads the weights and allocates `num_blocks` KV blocks (plus the padding block).
    pub fn new(
        backend: CudaBackend,
        params: &ModelParams,
        weights: &Weights,
        num_blocks: usize,
        block_size: usize,
        opts: GraphOptions,
    ) -> Result<Self> {
        let phase = Phase::start("Model weights on the device");
        let model = LlamaModel::load(&backend, params, weights)?;
        phase.done(&format!("{:.2} GiB", weights.total_bytes() as f64 / (1u64 << 30) as f64));
        let phase = Phase::start("KV cache allocated");
        let layout = KvLayout::of(params);
        let (layers, dtype) = (0..params.num_layers, weights.compute_dtype());
        let cache = PagedKvCache::new(&backend, params, &layout, layers, num_blocks + 1, block_size, dtype)?;
        phase.done(&format!("{} blocks of {block_size} tokens", cache.num_blocks));
        let max_blocks = opts.max_model_len.max(1).div_ceil(block_size);
        tracing::info!(
            "cuda: decode steps {} (buckets {:?})",
            if opts.enforce_eager { "run eagerly (--enforce-eager)" } else { "replay CUDA graphs" },
            buckets(opts.max_num_seqs)
        );
        let profile = (opts.profile == ProfileMode::Graph).then(Profile::default);
        backend.set_op_profile(opts.profile == ProfileMode::Ops);
        Ok(Self {
            graphs: HashMap::new(),
            uncapturable: Default::default(),
            inputs: HashMap::new(),
            model,
            cache,
            usable_blocks: num_blocks,
            max_blocks,
            buckets: buckets(opts.max_num_seqs),
            opts,
            profile,
            backend,
        })
    }

    pub fn backend(&self) -> &CudaBackend {
        &self.backend
    }

    /// Turns graph replay off (`true`) or on for the next steps (benchmarks compare the two).
    pub fn set_enforce_eager(&mut self, eager: bool) {
        self.opts.enforce_eager = eager;
    }

    /// Drops every captured graph, so the next steps capture again (benchmarks that change a backend setting
    /// between runs: a graph keeps the kernels it was captured with).
    pub fn clear_graphs(&mut self) {
        self.graphs.clear();
    }

    /// Graphs captured so far.
    pub fn num_graphs(&self) -> usize {
        self.graphs.len()
    }

    /// The bucket a decode batch replays in, if it takes the graph path.
    fn bucket_for(&self, batch: &[ScheduledSeq]) -> Option<usize> {
        if self.opts.enforce_eager || batch.is_empty() || batch.iter().any(|s| s.token_ids.len() != 1) {
            return None;
        }
        if batch.iter().any(|s| s.block_tables.iter().any(|t| t.len() > self.max_blocks)) {
            return None;
        }
        self.buckets.iter().copied().find(|&b| b >= batch.len())
    }

    /// Checks and flattens the step (once: a replayed graph checks nothing), then runs it through a graph or op by op.
    fn run(&mut self, batch: &[ScheduledSeq], step: Read<'_, '_>) -> Result<StepOutput> {
        if batch.is_empty() {
            return Ok(match step.want {
                Want::Logits => StepOutput::Logits(Vec::new()),
                Want::Argmax => StepOutput::Ids(Vec::new()),
                Want::Sample(_) => StepOutput::Sampled(SampledRows::default()),
            });
        }
        let bucket = self.bucket_for(batch);
        let width = if bucket.is_some() { self.max_blocks } else { 0 };
        let flat = self.model.flatten(batch, &self.cache, self.usable_blocks, width)?;
        let vocab = self.model.params().vocab_size;
        if let Some(t) = flat.ids.iter().find(|&&t| t as usize >= vocab) {
            return Err(EngineError::InvalidArgument(format!("token id {t} is outside the vocabulary of {vocab}")));
        }
        match bucket {
            Some(bucket) => self.run_graph(flat, bucket, step),
            None => self.run_eager(&flat, step),
        }
    }

    fn run_eager(&mut self, flat: &FlatBatch, step: Read<'_, '_>) -> Result<StepOutput> {
        let b = &self.backend;
        let dev = DeviceBatch::upload(b, flat)?;
        let DeviceOutput::Logits(logits) = self.model.forward_device(b, flat, &dev, &self.cache, &NoComm, None)? else {
            return Err(EngineError::Backend("cuda: the model has no LM head".into()));
        };
        self.read(&logits, None, flat.num_seqs(), flat.num_seqs(), step)
    }

    /// Reads a step's result. With `masks` (a constrained step) the grammar masks are computed now — the forward
    /// pass is already queued — uploaded and applied to the `real` rows of the logits; greedy ids are then picked
    /// again from the masked logits (a graph's own argmax ran before the masks).
    fn read(
        &self,
        logits: &CuBuffer,
        ids: Option<&CuBuffer>,
        rows: usize,
        real: usize,
        step: Read<'_, '_>,
    ) -> Result<StepOutput> {
        let b = &self.backend;
        let vocab = self.model.params().vocab_size;
        if let Want::Sample(sampling) = step.want {
            let grammar = step.masks.map(|m| m());
            return sample_on(b, logits, real, vocab, sampling, grammar).map(StepOutput::Sampled);
        }
        let masked = match step.masks {
            Some(masks) => {
                masks().apply_on(b, logits, real, vocab)?;
                true
            }
            None => false,
        };
        match step.want {
            Want::Logits => {
                let mut all = b.download_f32(logits)?;
                all.truncate(real * vocab);
                Ok(StepOutput::Logits(all))
            }
            Want::Argmax => {
                let out = match ids {
                    Some(ids) if !masked => b.download_u32(ids, real)?,
                    Some(ids) => {
                        b.argmax_rows(logits, real, vocab, ids)?;
                        b.download_u32(ids, real)?
                    }
                    None => {
                        let ids = b.alloc_u32(rows)?;
                        b.argmax_rows(logits, rows, vocab, &ids)?;
                        b.download_u32(&ids, real)?
                    }
                };
                Ok(StepOutput::Ids(out))
            }
            Want::Sample(_) => Err(EngineError::Backend("cuda: a sampled step reads no logits".into())),
        }
    }

    fn run_graph(&mut self, mut flat: FlatBatch, bucket: usize, step: Read<'_, '_>) -> Result<StepOutput> {
        let real = flat.num_seqs();
        flat.pad_decode(bucket, self.usable_blocks as u32, self.cache.block_size);
        let longest = flat.context_lens.iter().map(|&c| c as usize).max().unwrap_or(1);
        let parts = self.backend.tuning_cell().get().decode_parts(longest, bucket);
        let b = &self.backend;
        match self.inputs.get_mut(&bucket) {
            Some(inputs) => inputs.write(b, &flat)?,
            None => {
                self.inputs.insert(bucket, Inputs::upload(b, &flat)?);
            }
        }
        let dev = &self.inputs[&bucket].dev;
        let key = (bucket, parts);
        if self.uncapturable.contains(&key) {
            let DeviceOutput::Logits(logits) = self.model.forward_device(b, &flat, dev, &self.cache, &NoComm, None)?
            else {
                return Err(EngineError::Backend("cuda: the model has no LM head".into()));
            };
            return self.read(&logits, None, bucket, real, step);
        }
        if !self.graphs.contains_key(&key) {
            // First sight of this shape: run it eagerly (this step's result; it also caches the attention work
            // split), then record the same ops into a graph for the next steps.
            let DeviceOutput::Logits(logits) = self.model.forward_device(b, &flat, dev, &self.cache, &NoComm, None)?
            else {
                return Err(EngineError::Backend("cuda: the model has no LM head".into()));
            };
            let got = self.read(&logits, None, bucket, real, step)?;
            drop(logits);
            let t0 = Instant::now();
            b.begin_capture()?;
            let recorded = (|| -> Result<(CuBuffer, CuBuffer)> {
                let DeviceOutput::Logits(logits) =
                    self.model.forward_device(b, &flat, dev, &self.cache, &NoComm, None)?
                else {
                    return Err(EngineError::Backend("cuda: the model has no LM head".into()));
                };
                let ids = b.alloc_u32_output(bucket)?;
                b.argmax_rows(&logits, bucket, self.model.params().vocab_size, &ids)?;
                Ok((logits, ids))
            })();
            let graph = b.end_capture().map_err(EngineError::from);
            match (recorded, graph) {
                (Ok((logits, ids)), Ok(graph)) => {
                    tracing::debug!(
                        "cuda: captured the decode graph of batch {bucket} x {parts} partition(s) in {:.1} ms",
                        t0.elapsed().as_secs_f64() * 1e3
                    );
                    self.graphs.insert(key, Captured { graph, logits, ids });
                }
                // The step itself ran (eagerly, above): a shape that cannot be captured runs op by op from now on.
                (Err(e), _) | (_, Err(e)) => {
                    tracing::warn!("cuda: capturing the decode graph of batch {bucket} failed ({e}); it runs op by op");
                    self.uncapturable.insert(key);
                }
            }
            return Ok(got);
        }
        let g = &self.graphs[&key];
        let timing = match self.profile.is_some() {
            true => Some(b.record_event()?),
            false => None,
        };
        b.replay(&g.graph)?;
        let end = match timing {
            Some(_) => Some(b.record_event()?),
            None => None,
        };
        let got = self.read(&g.logits, Some(&g.ids), bucket, real, step)?;
        if let (Some(p), Some(a), Some(e)) = (self.profile.as_mut(), timing, end) {
            let now = Instant::now();
            let gpu = a.elapsed_ms(&e).unwrap_or(0.0) as f64;
            // Wall time of a step: from the end of the previous step (host work in between counts), unless the
            // engine sat idle.
            let wall = match p.last_end {
                Some(t) if now.duration_since(t).as_secs_f64() < 1.0 => now.duration_since(t).as_secs_f64() * 1e3,
                _ => gpu,
            };
            p.last_end = Some(now);
            p.steps += 1;
            p.batch = real;
            p.wall_ms += wall;
            p.gpu_ms += gpu;
            if p.steps == 64 {
                eprintln!(
                    "cuda-profile: graph decode batch={} bucket={bucket} steps={} wall_per_step_ms={:.3} gpu_busy_per_step_ms={:.3} busy_share={:.1}%",
                    p.batch,
                    p.steps,
                    p.wall_ms / p.steps as f64,
                    p.gpu_ms / p.steps as f64,
                    100.0 * p.gpu_ms / p.wall_ms.max(1e-9)
                );
                *p = Profile { last_end: p.last_end, ..Profile::default() };
            }
        }
        Ok(got)
    }
}

impl StepRunner for CudaGraphRunner {
    fn execute(&mut self, batch: &[ScheduledSeq]) -> Result<Vec<f32>> {
        match self.run(batch, Read { want: Want::Logits, masks: None })? {
            StepOutput::Logits(l) => Ok(l),
            _ => Err(EngineError::Backend("cuda: expected logits".into())),
        }
    }

    fn execute_greedy(&mut self, batch: &[ScheduledSeq]) -> Result<Option<Vec<u32>>> {
        match self.run(batch, Read { want: Want::Argmax, masks: None })? {
            StepOutput::Ids(ids) => Ok(Some(ids)),
            _ => Err(EngineError::Backend("cuda: expected ids".into())),
        }
    }

    fn execute_masked(
        &mut self,
        batch: &[ScheduledSeq],
        greedy: bool,
        masks: &mut dyn FnMut() -> StepMasks,
    ) -> Result<StepOutput> {
        let want = if greedy { Want::Argmax } else { Want::Logits };
        self.run(batch, Read { want, masks: Some(masks) })
    }

    fn execute_sampled(
        &mut self,
        batch: &[ScheduledSeq],
        sampling: &StepSampling,
        masks: Option<&mut dyn FnMut() -> StepMasks>,
    ) -> Result<SampledRows> {
        let rows = batch.len();
        // Plain greedy steps keep the argmax captured in the decode graph.
        let want = match sampling.is_plain_greedy() {
            true => Want::Argmax,
            false if sampling.logprobs_fit_device() => Want::Sample(sampling),
            false => return crate::runner::sample_on_host(self, batch, sampling, masks),
        };
        match self.run(batch, Read { want, masks })? {
            StepOutput::Ids(ids) => Ok(SampledRows { ids, logprobs: vec![None; rows] }),
            StepOutput::Sampled(s) => Ok(s),
            StepOutput::Logits(_) => Err(EngineError::Backend("cuda: expected ids".into())),
        }
    }

    fn vocab_size(&self) -> usize {
        self.model.params().vocab_size
    }

    fn device_name(&self) -> String {
        self.backend.device_name()
    }
}

#[cfg(test)]
mod tests {
    use super::buckets;

    #[test]
    fn buckets_cover_max_num_seqs() {
        assert_eq!(buckets(1), vec![1]);
        assert_eq!(buckets(3), vec![1, 2, 4]);
        assert_eq!(buckets(64), vec![1, 2, 4, 8, 16, 24, 32, 48, 64]);
        assert_eq!(*buckets(256).last().unwrap(), 256);
        assert_eq!(*buckets(300).last().unwrap(), 320);
        for m in 1..600 {
            let b = buckets(m);
            assert!(*b.last().unwrap() >= m && b.windows(2).all(|w| w[0] < w[1]), "{m}: {b:?}");
        }
    }
}
