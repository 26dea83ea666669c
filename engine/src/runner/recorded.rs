//! Recorded decode steps: what `ModelRunner` keeps on a backend that records (`Backend::records`). A decode step
//! (one new token per sequence) is padded to a batch-size bucket; each bucket has step inputs that stay on the
//! device (`StepInputs`, refilled in place every step from a host copy that is itself updated from the step's
//! deltas, `FlatBatch::refill_decode`), and each (bucket, attention partitions) has a recording of
//! the whole forward pass plus the greedy token choice, replayed for every later step of that shape.
//!
//! Invariant: a recording reads only memory that outlives it: the weights, the KV cache, its bucket's inputs, and
//! what it allocated while recording (which the backend never hands to anything else, `Backend::begin_recording`).

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use crate::backend::Backend;
use crate::error::{EngineError, Result};
use crate::model::{DeviceBatch, FlatBatch, RowOwners};

/// Batch sizes decode steps are recorded for (a batch takes the smallest bucket that holds it), up to
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

/// A bucket's step inputs on the device: one buffer per `FlatBatch` vector, refilled in place each step (one host
/// copy where the backend packs them into one allocation).
pub(super) struct StepInputs<B: Backend> {
    // Field order is drop order: the views before the allocation they may point into.
    pub(super) dev: DeviceBatch<B>,
    owner: Option<B::Buffer>,
}

impl<B: Backend> StepInputs<B> {
    /// ids, positions, query starts, context lengths, last rows, then each KV cache group's slots, then each
    /// group's block tables.
    fn parts(f: &FlatBatch) -> Vec<&[u32]> {
        let mut parts: Vec<&[u32]> = vec![&f.ids, &f.positions, &f.query_start, &f.context_lens, &f.last_rows];
        parts.extend(f.slots.iter().map(Vec::as_slice));
        parts.extend(f.tables.iter().map(Vec::as_slice));
        parts
    }

    pub(super) fn upload(b: &B, f: &FlatBatch) -> Result<Self> {
        let (owner, views) = b.upload_inputs(&Self::parts(f))?;
        let groups = f.num_groups();
        let mut views = views.into_iter();
        let mut next = || views.next().ok_or_else(|| EngineError::Backend("step inputs: a part is missing".into()));
        let (ids, positions, query_start, context_lens, last_rows) = (next()?, next()?, next()?, next()?, next()?);
        let slots = (0..groups).map(|_| next()).collect::<Result<Vec<_>>>()?;
        let block_tables = (0..groups).map(|_| next()).collect::<Result<Vec<_>>>()?;
        Ok(Self {
            dev: DeviceBatch { ids, positions, slots, query_start, context_lens, block_tables, last_rows },
            owner,
        })
    }

    pub(super) fn write(&mut self, b: &B, f: &FlatBatch) -> Result<()> {
        let d = &mut self.dev;
        let mut views: Vec<&mut B::Buffer> =
            vec![&mut d.ids, &mut d.positions, &mut d.query_start, &mut d.context_lens, &mut d.last_rows];
        views.extend(d.slots.iter_mut());
        views.extend(d.block_tables.iter_mut());
        Ok(b.write_inputs(self.owner.as_ref(), &mut views, &Self::parts(f))?)
    }
}

/// One recorded decode step and the outputs it writes.
pub(super) struct Recorded<B: Backend> {
    // Field order is drop order: the recording before the buffers it writes.
    pub(super) rec: B::Recording,
    /// `[bucket, vocab]` logits.
    pub(super) logits: B::Buffer,
    /// Each row's most likely token (`Op::ArgmaxRows`).
    pub(super) ids: B::Buffer,
}

/// (bucket, attention partitions): what a recording is kept by.
pub(super) type Key = (usize, usize);

/// The recorded steps of one runner.
pub(super) struct RecordedSteps<B: Backend> {
    // Field order is drop order: recordings before the inputs they read.
    pub(super) recorded: HashMap<Key, Recorded<B>>,
    /// Keys whose recording failed: their steps run op by op (over the padded inputs).
    pub(super) unrecordable: HashSet<Key>,
    pub(super) inputs: HashMap<usize, StepInputs<B>>,
    /// Each bucket's inputs as the host last wrote them, refilled from the next step's deltas
    /// (`FlatBatch::refill_decode`); taken out while a step uses them, and gone after a step that failed (the next
    /// step is flattened anew).
    pub(super) hosts: HashMap<usize, (FlatBatch, RowOwners)>,
    pub(super) buckets: Vec<usize>,
    /// Width of a recorded step's block tables (`max_model_len / block_size`).
    pub(super) max_blocks: usize,
    pub(super) profile: Option<Profile>,
}

impl<B: Backend> RecordedSteps<B> {
    pub(super) fn new(max_num_seqs: usize, max_blocks: usize, profile: bool) -> Self {
        Self {
            recorded: HashMap::new(),
            unrecordable: HashSet::new(),
            inputs: HashMap::new(),
            hosts: HashMap::new(),
            buckets: buckets(max_num_seqs),
            max_blocks,
            profile: profile.then(Profile::default),
        }
    }

    /// The bucket's inputs holding `flat` (uploaded on first sight, refilled in place after).
    pub(super) fn inputs_for(&mut self, b: &B, bucket: usize, flat: &FlatBatch) -> Result<&DeviceBatch<B>> {
        match self.inputs.get_mut(&bucket) {
            Some(inputs) => inputs.write(b, flat)?,
            None => {
                self.inputs.insert(bucket, StepInputs::upload(b, flat)?);
            }
        }
        Ok(&self.inputs[&bucket].dev)
    }
}

/// `--profile graph`: wall and device time of recorded decode steps that follow one another, printed every 64 of
/// them. The wall time of a step runs from the end of the previous one, so the host's work between them counts; a
/// step after any other kind of step (a prefill chunk, a step run op by op) or after an idle engine is not counted,
/// since its wall time would hold that other step.
#[derive(Default)]
pub(super) struct Profile {
    steps: usize,
    batch: usize,
    wall_ms: f64,
    device_ms: f64,
    last_end: Option<Instant>,
}

impl Profile {
    /// Counts one replayed step of `real` sequences in `bucket` whose replay took `device_ms` on the device.
    pub(super) fn step(&mut self, real: usize, bucket: usize, device_ms: f64) {
        let now = Instant::now();
        let wall = match self.last_end.replace(now) {
            Some(t) if now.duration_since(t).as_secs_f64() < 1.0 => now.duration_since(t).as_secs_f64() * 1e3,
            _ => return,
        };
        self.steps += 1;
        self.batch = real;
        self.wall_ms += wall;
        self.device_ms += device_ms;
        if self.steps == 64 {
            eprintln!(
                "step-profile: recorded decode batch={} bucket={bucket} steps={} wall_per_step_ms={:.3} gpu_busy_per_step_ms={:.3} busy_share={:.1}%",
                self.batch,
                self.steps,
                self.wall_ms / self.steps as f64,
                self.device_ms / self.steps as f64,
                100.0 * self.device_ms / self.wall_ms.max(1e-9)
            );
            *self = Profile { last_end: self.last_end, ..Profile::default() };
        }
    }

    /// A step that is not a replayed decode step ran: the next replayed step is not counted.
    pub(super) fn other_step(&mut self) {
        self.last_end = None;
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
