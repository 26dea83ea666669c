//! The step runner: what the engine thread asks of a device each step (`StepRunner`), and the one implementation
//! every backend runs, `ModelRunner` (`model.rs`), with its recorded decode steps (`recorded.rs`). The engine thread
//! holds it as `Box<dyn StepRunner>` so it need not be generic over the backend; the MPI runners adapt the same
//! trait to a sharded model. `StepMasks`: a step's grammar masks (structured outputs), which a runner applies to the
//! logits on its device.

mod encoder;
mod model;
mod recorded;

pub use encoder::EncoderRunner;
pub use model::ModelRunner;
pub use recorded::buckets;

use crate::backend::Backend;
use crate::error::Result;
use crate::model::ScheduledSeq;
use crate::sampling::{SampledRows, StepSampling};

/// The grammar masks of one step: a row per sequence of the batch, `words_per_row = ceil(vocab / 32)` u32 words
/// each, bit `t % 32` of word `t / 32` set when token `t` may come next. Rows without a constraint have every bit set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepMasks {
    pub bits: Vec<u32>,
    pub words_per_row: usize,
}

impl StepMasks {
    /// `rows` rows for a vocabulary of `vocab` ids, every token allowed.
    pub fn allow_all(rows: usize, vocab: usize) -> Self {
        let words_per_row = vocab.div_ceil(32);
        Self { bits: vec![u32::MAX; rows * words_per_row], words_per_row }
    }

    pub fn rows(&self) -> usize {
        self.bits.len().checked_div(self.words_per_row).unwrap_or(0)
    }

    /// Uploads the masks and applies them to the first `rows` rows of `[.., vocab]` logits on `b`'s device
    /// (`Op::MaskLogits`); refuses masks of another shape.
    pub fn apply_on<B: Backend>(&self, b: &B, logits: &B::Buffer, rows: usize, vocab: usize) -> Result<()> {
        if self.rows() != rows || self.words_per_row != vocab.div_ceil(32) {
            return Err(crate::error::EngineError::Backend(format!(
                "grammar masks: {} rows of {} words for {rows} sequences of {vocab} logits",
                self.rows(),
                self.words_per_row
            )));
        }
        let mask = b.upload_u32(&self.bits)?;
        Ok(b.run(crate::backend::Op::MaskLogits { logits, mask: &mask, rows, vocab })?)
    }

    /// Applies the masks to `[rows, vocab]` logits on the host (runners whose logits are host memory).
    pub fn apply_host(&self, logits: &mut [f32], vocab: usize) {
        for (row, bits) in logits.chunks_mut(vocab).zip(self.bits.chunks(self.words_per_row.max(1))) {
            crate::sampling::masks::apply_bits(row, bits);
        }
    }
}

/// Which final hidden states a pooling step returns of one sequence's rows in the step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolRows {
    /// None (a chunk whose rows the pooler does not need).
    Nothing,
    /// The sequence's first row in the step.
    First,
    /// Its last row.
    Last,
    /// Every row.
    All,
}

impl PoolRows {
    /// The rows of a sequence whose rows in the step are `start..end`.
    pub fn range(self, start: u32, end: u32) -> std::ops::Range<u32> {
        match self {
            PoolRows::Nothing => start..start,
            PoolRows::First => start..(start + 1).min(end),
            PoolRows::Last => end.saturating_sub(1).max(start)..end,
            PoolRows::All => start..end,
        }
    }
}

/// A pooling step's returned rows (`[rows, width]`, sequence after sequence) cut into each sequence's, `counts[i]`
/// rows for sequence `i`.
pub(crate) fn split_pooled(all: &[f32], counts: impl IntoIterator<Item = usize>, width: usize) -> Vec<Vec<f32>> {
    let mut at = 0;
    counts
        .into_iter()
        .map(|n| {
            let v = all[at..at + n * width].to_vec();
            at += n * width;
            v
        })
        .collect()
}

/// What a constrained step reads back.
#[derive(Debug)]
pub enum StepOutput {
    /// `[num_seqs, vocab]` logits, masked.
    Logits(Vec<f32>),
    /// Each sequence's most likely allowed token, picked on the device.
    Ids(Vec<u32>),
    /// The tokens (and log-probs) a step's sampling settings chose on the device.
    Sampled(SampledRows),
}

/// What `StepRunner::launch` did.
#[derive(Debug)]
pub enum Launch {
    /// The step ran to its end here: its tokens.
    Done(SampledRows),
    /// The step is queued on the device; `collect` chooses and reads its tokens.
    Running,
}

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
    /// Runs one step whose rows carry grammar masks. `masks` is called once the forward pass is under way (a device
    /// runner has handed it to its queue), so the host computes the masks while the device computes the logits; the
    /// masks are then applied to the logits before they are read back, or — with `greedy` (every sampled sequence is
    /// greedy apart from its mask), on runners that pick on the device — before each row's most likely token is
    /// picked. This default runs the step, then applies the masks on the host.
    fn execute_masked(
        &mut self,
        batch: &[ScheduledSeq],
        greedy: bool,
        masks: &mut dyn FnMut() -> StepMasks,
    ) -> Result<StepOutput> {
        let _ = greedy;
        let mut logits = self.execute(batch)?;
        masks().apply_host(&mut logits, self.vocab_size());
        Ok(StepOutput::Logits(logits))
    }
    /// Runs one step and chooses each sequence's next token as `sampling` says (`masks`: the step's grammar masks,
    /// called once the forward pass is under way). This default reads the logits back and chooses on the host
    /// (`sampling::step::sample_host`, rows in parallel); runners that hold the logits on a device choose there.
    fn execute_sampled(
        &mut self,
        batch: &[ScheduledSeq],
        sampling: &StepSampling,
        masks: Option<&mut dyn FnMut() -> StepMasks>,
    ) -> Result<SampledRows> {
        sample_on_host(self, batch, sampling, masks)
    }
    /// Starts one step without waiting for the device, so the engine does its own work while the device computes;
    /// `Launch::Running` means `collect` must be called (with the same `sampling`) to read it. Where `overlaps`,
    /// one more step may be launched before that, and its `TokenId::PLACEHOLDER` ids are the ones the step still in
    /// flight samples for the same requests. This default runs the whole step here (`execute_sampled`).
    fn launch(&mut self, batch: &[ScheduledSeq], sampling: &StepSampling) -> Result<Launch> {
        self.execute_sampled(batch, sampling, None).map(Launch::Done)
    }
    /// Waits for the oldest launched step and reads the tokens it chose as `sampling` says.
    fn collect(&mut self, sampling: &StepSampling) -> Result<SampledRows> {
        let _ = sampling;
        Err(crate::error::EngineError::Backend("no step was launched".into()))
    }
    /// Whether a step may be launched while the previous one is in flight, its placeholders fed on the device from
    /// that step's chosen ids (async scheduling). This default: no.
    fn overlaps(&self) -> bool {
        false
    }
    /// A pooling model's step: runs the batch to the model's final norm (no LM head, no token chosen) and returns,
    /// per sequence, the hidden states of the rows `rows[i]` names, `[rows, hidden]` flattened. `segments[i]`: the
    /// token types of sequence `i`'s tokens in the step (an encoder's `token_type_ids`; empty: all 0; decoders have
    /// none). This default: the runner cannot pool.
    fn pool(&mut self, batch: &[ScheduledSeq], rows: &[PoolRows], segments: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
        let _ = (batch, rows, segments);
        Err(crate::error::EngineError::InvalidArgument("this runner cannot run a pooling model".into()))
    }
    /// Forgets the launched steps not collected (their engine step failed or their requests are gone).
    fn abandon(&mut self) {}
    /// The scheduler's ended requests (finished, aborted, preempted): a runner that keeps per-request state (the
    /// block tables it keeps from the scheduler's deltas) drops theirs. This default keeps nothing.
    fn finished(&mut self, ids: &[rserve_scheduler::RequestId]) {
        let _ = ids;
    }
    fn vocab_size(&self) -> usize;
    fn device_name(&self) -> String;
}

/// Runs one step through `runner`, reads its (masked) logits back and chooses on the host
/// (`sampling::step::sample_host`, rows in parallel): `StepRunner::execute_sampled`'s default, and the fallback of
/// device runners for what their ops do not cover.
pub fn sample_on_host<R: StepRunner + ?Sized>(
    runner: &mut R,
    batch: &[ScheduledSeq],
    sampling: &StepSampling,
    masks: Option<&mut dyn FnMut() -> StepMasks>,
) -> Result<SampledRows> {
    let vocab = runner.vocab_size();
    let mut logits = match masks {
        Some(m) => match runner.execute_masked(batch, false, m)? {
            StepOutput::Logits(l) => l,
            _ => return Err(crate::error::EngineError::Backend("expected logits".into())),
        },
        None => runner.execute(batch)?,
    };
    Ok(crate::sampling::step::sample_host(&mut logits, vocab, sampling))
}

/// The engine's limits as a runner needs them: decode steps of up to `max_num_seqs` sequences of up to
/// `max_model_len` tokens are recorded on backends that record (`Backend::records`), unless `enforce_eager`.
#[derive(Debug, Clone, Copy)]
pub struct RunnerOptions {
    pub max_model_len: usize,
    pub max_num_seqs: usize,
    /// `--enforce-eager`: never record; every step runs op by op.
    pub enforce_eager: bool,
    /// `--profile`: what to time.
    pub profile: ProfileMode,
    /// Steps may overlap (`StepRunner::overlaps`): async scheduling, unless `--no-async-scheduling`.
    pub async_scheduling: bool,
}

impl Default for RunnerOptions {
    /// 256 sequences of up to 4096 tokens, recorded where the backend records.
    fn default() -> Self {
        Self {
            max_model_len: 4096,
            max_num_seqs: 256,
            enforce_eager: false,
            profile: ProfileMode::Off,
            async_scheduling: true,
        }
    }
}

/// `--profile`: `graph` prints, every 64 recorded decode steps, the wall time per step and the device time of its
/// replay (the device-busy share) on backends that record and time replays; `ops` prints, on `--device cuda`, a
/// per-op breakdown of eager steps (every 8 steps with a prefill chunk; with `--enforce-eager`, every 64 decode
/// steps). Other devices ignore it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProfileMode {
    #[default]
    Off,
    Graph,
    Ops,
}

impl ProfileMode {
    /// `off`, `graph` or `ops`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "off" => Some(Self::Off),
            "graph" => Some(Self::Graph),
            "ops" => Some(Self::Ops),
            _ => None,
        }
    }
}
