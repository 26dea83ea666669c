//! One step's token choice, as the engine hands it to a runner: each row's draw (`RowParams`, packed), the edits
//! that penalties, logit bias and banned words make to its logits, the tokens it rules out (`allowed_token_ids`,
//! `bad_words`) as mask bits, and the log-probs it wants. `sample_host` is the same pipeline on host logits (the CPU
//! backend's logits, the MPI runners' gathered rows); device runners run it as ops (`device.rs`).
//!
//! Order, as vLLM's sampler: masks (grammar, allowed ids, bad words), then log-probs of that raw distribution, then
//! penalties and bias, then the draw.

use rayon::prelude::*;
use rserve_kernels::launch::{LOGPROBS_MAX_TOP, SAMPLE_PARAM_WORDS};

use super::params::RowParams;
use super::prompt::{PromptLogprobs, PromptRows};
use super::{adjust, draw, logprobs, masks};
use crate::api::SamplingParams;
use crate::runner::StepMasks;

pub use rserve_backend::sampling::NO_LOGPROBS;

/// A request's draw for its output token number `position`: its sampling parameters and the seed of its stream.
pub fn row_params(p: &SamplingParams, seed: u64, position: u64) -> RowParams {
    RowParams {
        temperature: p.temperature,
        top_k: u32::try_from(p.top_k).unwrap_or(u32::MAX),
        top_p: p.top_p,
        min_p: p.min_p,
        seed,
        position,
    }
}

/// The token choice of one step: one row per sequence of the batch.
#[derive(Debug, Clone, Default)]
pub struct StepSampling {
    /// `SAMPLE_PARAM_WORDS` words a row (`RowParams::pack`).
    pub params: Vec<u32>,
    /// Logit edits (`adjust::Edit`), each naming its row.
    pub edits: Vec<adjust::Edit>,
    /// The number of top log-probs each row wants (`NO_LOGPROBS`: none); empty when no row wants any.
    pub logprobs: Vec<u32>,
    /// Rows' `allowed_token_ids` and `bad_words` as mask bits (None when no row has them).
    pub bans: Option<StepMasks>,
    /// Prompt chunks whose rows score the prompt tokens after them (`prompt_logprobs`), by sequence.
    pub prompt: Vec<PromptRows>,
}

/// What a step chose: a token per row, and the log-probs of the rows that want them (chosen, then top).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SampledRows {
    pub ids: Vec<u32>,
    pub logprobs: Vec<Option<RowLogprobs>>,
    /// The scores of the step's `StepSampling::prompt` rows, in its order.
    pub prompt: Vec<PromptLogprobs>,
}

impl SampledRows {
    /// Chosen ids without log-probs.
    pub fn of_ids(ids: Vec<u32>) -> Self {
        let logprobs = vec![None; ids.len()];
        Self { ids, logprobs, prompt: Vec::new() }
    }
}

/// A row's log-probs: the chosen token's, and the top alternatives (highest first).
#[derive(Debug, Clone, PartialEq)]
pub struct RowLogprobs {
    pub chosen: f32,
    pub top: Vec<(u32, f32)>,
}

impl StepSampling {
    /// A step of `rows` rows of plain greedy choice.
    pub fn greedy(rows: usize) -> Self {
        Self { params: RowParams::GREEDY.pack().repeat(rows), ..Self::default() }
    }

    pub fn rows(&self) -> usize {
        self.params.len() / SAMPLE_PARAM_WORDS
    }

    pub fn row(&self, r: usize) -> RowParams {
        RowParams::unpack(&self.params[r * SAMPLE_PARAM_WORDS..])
    }

    /// Whether some row wants log-probs.
    pub fn wants_logprobs(&self) -> bool {
        self.logprobs.iter().any(|&n| n != NO_LOGPROBS)
    }

    /// Whether every row is greedy with nothing to edit, mask or report: the device's plain argmax is the answer.
    pub fn is_plain_greedy(&self) -> bool {
        self.edits.is_empty()
            && self.bans.is_none()
            && !self.wants_logprobs()
            && (0..self.rows()).all(|r| self.row(r).is_greedy())
    }

    /// Whether a device can report every row's log-probs (at most `LOGPROBS_MAX_TOP` alternatives a row).
    pub fn logprobs_fit_device(&self) -> bool {
        self.logprobs.iter().all(|&n| n == NO_LOGPROBS || n as usize <= LOGPROBS_MAX_TOP)
    }

    /// `grammar`'s masks with this step's bans, or whichever exists.
    pub fn merged_masks(&self, grammar: Option<StepMasks>) -> Option<StepMasks> {
        match (grammar, &self.bans) {
            (Some(mut g), Some(b)) => {
                g.bits.iter_mut().zip(&b.bits).for_each(|(g, b)| *g &= b);
                Some(g)
            }
            (g, b) => g.or_else(|| b.clone()),
        }
    }
}

/// The whole pipeline on `[rows, vocab]` host logits (masked already by the grammar, when the step has one):
/// bans, log-probs, edits, the draw; rows in parallel. `logits` is scratch.
pub fn sample_host(logits: &mut [f32], vocab: usize, s: &StepSampling) -> SampledRows {
    let rows = s.rows().min(logits.len() / vocab.max(1));
    if let Some(b) = &s.bans {
        b.apply_host(&mut logits[..rows * vocab], vocab);
    }
    let mut edits: Vec<&[adjust::Edit]> = vec![&[]; rows];
    let mut start = 0;
    // Edits come grouped by row (`adjust::Edits::push_row`).
    while start < s.edits.len() {
        let r = s.edits[start].row as usize;
        let end = start + s.edits[start..].iter().take_while(|e| e.row == s.edits[start].row).count();
        if r < rows {
            edits[r] = &s.edits[start..end];
        }
        start = end;
    }
    let out: Vec<(u32, Option<RowLogprobs>)> = logits[..rows * vocab]
        .par_chunks_mut(vocab)
        .enumerate()
        .map_init(Vec::new, |w, (r, row)| {
            let want = s.logprobs.get(r).copied().unwrap_or(NO_LOGPROBS);
            // Log-probs describe the raw (masked) distribution: the chosen token's raw logit is kept before edits.
            let raw = (want != NO_LOGPROBS).then(|| {
                let edited: Vec<(u32, f32)> =
                    edits[r].iter().filter_map(|e| Some((e.token, *row.get(e.token as usize)?))).collect();
                (logprobs::log_sum_exp(row), logprobs::top(row, want as usize), edited)
            });
            adjust::apply(row, edits[r]);
            let id = draw::sample_row(row, &s.row(r), w);
            let lp = raw.map(|(lse, top, edited)| {
                let chosen = edited.iter().find(|e| e.0 == id).map_or(row[id as usize], |e| e.1);
                RowLogprobs { chosen: chosen - lse, top: top.into_iter().map(|(t, l)| (t, l - lse)).collect() }
            });
            (id, lp)
        })
        .collect();
    let (ids, logprobs) = out.into_iter().unzip();
    SampledRows { ids, logprobs, prompt: Vec::new() }
}

/// `masks::apply`'s rules of each row, as mask bits (`None` when no row has `allowed_token_ids` or `bad_words`).
pub fn ban_masks<'a>(
    rows: impl ExactSizeIterator<Item = Option<(&'a crate::api::SamplingParams, &'a [crate::TokenId])>>,
    vocab: usize,
) -> Option<StepMasks> {
    let n = rows.len();
    let mut out: Option<StepMasks> = None;
    for (r, row) in rows.enumerate() {
        let Some((p, output)) = row else { continue };
        if p.allowed_token_ids.is_none() && p.bad_words.is_empty() {
            continue;
        }
        let m = out.get_or_insert_with(|| StepMasks::allow_all(n, vocab));
        let words = m.words_per_row;
        masks::ban_bits(&mut m.bits[r * words..(r + 1) * words], p, output, vocab);
    }
    out
}
