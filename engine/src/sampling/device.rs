//! A step's token choice as ops on the backend that holds the logits (`Op::MaskLogits`, `Op::AdjustLogits`,
//! `Op::SampleRows`, `Op::RowLogprobs`): only the ids (and the log-probs rows asked for) come back to the host,
//! never `[rows x vocab]` logits. On the CPU backend the same ops run on host memory.

use rserve_kernels::launch::{LOGPROBS_MAX_TOP, SAMPLE_PARAM_WORDS};

use super::step::{RowLogprobs, SampledRows, StepSampling, NO_LOGPROBS};
use crate::backend::{Backend, Op};
use crate::error::{EngineError, Result};
use crate::runner::StepMasks;

/// Chooses the tokens of the first `rows` rows of `[.., vocab]` `logits` on `b`'s device. `grammar`: the step's
/// grammar masks, if it has constrained rows. `logits` is scratch afterwards.
pub fn sample_on<B: Backend>(
    b: &B,
    logits: &B::Buffer,
    rows: usize,
    vocab: usize,
    s: &StepSampling,
    grammar: Option<StepMasks>,
) -> Result<SampledRows> {
    if rows == 0 {
        check_rows(s, rows)?;
        return Ok(SampledRows::default());
    }
    queue_sample_on(b, logits, rows, vocab, s, grammar)?.read(b)
}

/// A token choice queued on the device behind the forward pass that makes its logits: the chosen ids stay in a
/// buffer of their own (a later step may feed them to its inputs, `Op::FeedTokens`) until `read`.
pub struct QueuedChoice<B: Backend> {
    /// `[rows]` chosen ids.
    pub ids: B::Buffer,
    rows: usize,
    /// The log-prob values and top ids, and how many alternatives each row asked for.
    logprobs: Option<(B::Buffer, B::Buffer, Vec<u32>)>,
}

impl<B: Backend> QueuedChoice<B> {
    /// Rows chosen.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Whether log-probs are read with the ids.
    pub fn has_logprobs(&self) -> bool {
        self.logprobs.is_some()
    }

    /// Waits for the choice and reads the ids (and the log-probs asked for).
    pub fn read(&self, b: &B) -> Result<SampledRows> {
        let rows = self.rows;
        let chosen = b.download_u32(&self.ids, rows)?;
        let Some((values, top_ids, want)) = &self.logprobs else {
            return Ok(SampledRows::of_ids(chosen));
        };
        let width = 1 + LOGPROBS_MAX_TOP;
        let vals = b.download_f32(values)?;
        let tops = b.download_u32(top_ids, rows * LOGPROBS_MAX_TOP)?;
        let logprobs = (0..rows)
            .map(|r| {
                let n = want[r];
                (n != NO_LOGPROBS).then(|| RowLogprobs {
                    chosen: vals[r * width],
                    top: (0..n as usize).map(|j| (tops[r * LOGPROBS_MAX_TOP + j], vals[r * width + 1 + j])).collect(),
                })
            })
            .collect();
        Ok(SampledRows { ids: chosen, logprobs, prompt: Vec::new() })
    }
}

fn check_rows(s: &StepSampling, rows: usize) -> Result<()> {
    if s.rows() != rows || (!s.logprobs.is_empty() && s.logprobs.len() != rows) {
        return Err(EngineError::Backend(format!(
            "sampling: {} rows of parameters and {} of log-probs for {rows} sequences",
            s.rows(),
            s.logprobs.len()
        )));
    }
    Ok(())
}

/// Queues the token choice of `sample_on` (`rows` > 0) without waiting for it.
pub fn queue_sample_on<B: Backend>(
    b: &B,
    logits: &B::Buffer,
    rows: usize,
    vocab: usize,
    s: &StepSampling,
    grammar: Option<StepMasks>,
) -> Result<QueuedChoice<B>> {
    check_rows(s, rows)?;
    if rows == 0 {
        return Err(EngineError::Backend("sampling: a choice of no rows".into()));
    }
    if let Some(m) = s.merged_masks(grammar) {
        m.apply_on(b, logits, rows, vocab)?;
    }
    let wants = s.wants_logprobs();
    // Log-probs describe the distribution before penalties: keep a copy of the raw rows when edits follow.
    let raw = match wants && !s.edits.is_empty() {
        true => {
            let copy = b.alloc_f32_scratch(rows * vocab)?;
            let all: Vec<u32> = (0..rows as u32).collect();
            let idx = b.upload_u32(&all)?;
            b.run(Op::GatherRows { x: logits, rows: &idx, out: &copy, num_rows: rows, width: vocab })?;
            Some(copy)
        }
        false => None,
    };
    if !s.edits.is_empty() {
        let pairs: Vec<u32> = s.edits.iter().flat_map(|e| [e.row, e.token]).collect();
        let values: Vec<f32> = s.edits.iter().flat_map(|e| [e.mul, e.add]).collect();
        let (edits, values) = (b.upload_u32(&pairs)?, b.upload_f32(&values)?);
        b.run(Op::AdjustLogits { logits, edits: &edits, values: &values, count: s.edits.len(), rows, vocab })?;
    }
    let params = b.upload_u32(&s.params[..rows * SAMPLE_PARAM_WORDS])?;
    let ids = b.alloc_u32_output(rows)?;
    b.run(Op::SampleRows { logits, params: &params, ids: &ids, rows, vocab })?;
    if !wants {
        return Ok(QueuedChoice { ids, rows, logprobs: None });
    }
    let width = 1 + LOGPROBS_MAX_TOP;
    let want = b.upload_u32(&s.logprobs)?;
    let values = b.alloc_f32(rows * width)?;
    let top_ids = b.alloc_u32_output(rows * LOGPROBS_MAX_TOP)?;
    let source = raw.as_ref().unwrap_or(logits);
    b.run(Op::RowLogprobs { logits: source, ids: &ids, want: &want, values: &values, top_ids: &top_ids, rows, vocab })?;
    Ok(QueuedChoice { ids, rows, logprobs: Some((values, top_ids, s.logprobs.clone())) })
}
