//! Prompt log-probs (vLLM's `prompt_logprobs`), computed where the logits are: a step that holds a prompt chunk of
//! such a request asks its runner for the logits of every row of the chunk that predicts a later prompt token
//! (`PromptRows`), not only of the last row; `Op::RowLogprobs` then scores each of those rows against the prompt token
//! that follows it, so only the log-probs come back, never `[rows x vocab]` logits. Rows wanting more alternatives
//! than the device op reports are scored on the host.

use rserve_kernels::launch::LOGPROBS_MAX_TOP;

use super::logprobs;
use super::step::RowLogprobs;
use crate::backend::{Backend, Op};
use crate::error::Result;

/// One sequence's rows of a step whose logits score prompt tokens: rows `0..targets.len()` of the sequence's chunk
/// (positions `start_position..`) predict the prompt tokens `targets` (positions `start_position + 1..`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptRows {
    /// The sequence's index in the step's batch.
    pub seq: u32,
    pub targets: Vec<u32>,
    /// Top alternatives each row reports.
    pub top: u32,
}

/// What a step scored for one `PromptRows`: a row per target, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptLogprobs {
    pub seq: u32,
    pub rows: Vec<RowLogprobs>,
}

/// The batch rows (in the flattened step, whose sequence `s` starts at row `query_start[s]`) whose logits
/// `prompt` needs, in order.
pub fn logit_rows(prompt: &[PromptRows], query_start: &[u32]) -> Vec<u32> {
    prompt
        .iter()
        .flat_map(|p| {
            let first = query_start[p.seq as usize];
            first..first + p.targets.len() as u32
        })
        .collect()
}

/// Scores `prompt`'s rows, which sit in order from row `first` of `[.., vocab]` `logits` on `b`'s device, and waits
/// for the result. The rows are read only.
pub fn score_on<B: Backend>(
    b: &B,
    logits: &B::Buffer,
    first: usize,
    prompt: &[PromptRows],
    vocab: usize,
) -> Result<Vec<PromptLogprobs>> {
    let rows: usize = prompt.iter().map(|p| p.targets.len()).sum();
    if rows == 0 {
        return Ok(prompt.iter().map(|p| PromptLogprobs { seq: p.seq, rows: Vec::new() }).collect());
    }
    let index: Vec<u32> = (first as u32..(first + rows) as u32).collect();
    let index = b.upload_u32(&index)?;
    let own = b.alloc_f32_scratch(rows * vocab)?;
    b.run(Op::GatherRows { x: logits, rows: &index, out: &own, num_rows: rows, width: vocab })?;
    if prompt.iter().any(|p| p.top as usize > LOGPROBS_MAX_TOP) {
        return Ok(score_host(&b.download_f32(&own)?, prompt, vocab));
    }
    let targets: Vec<u32> = prompt.iter().flat_map(|p| p.targets.iter().copied()).collect();
    let want: Vec<u32> = prompt.iter().flat_map(|p| std::iter::repeat_n(p.top, p.targets.len())).collect();
    let width = 1 + LOGPROBS_MAX_TOP;
    let (ids, want) = (b.upload_u32(&targets)?, b.upload_u32(&want)?);
    let values = b.alloc_f32(rows * width)?;
    let top_ids = b.alloc_u32_output(rows * LOGPROBS_MAX_TOP)?;
    b.run(Op::RowLogprobs { logits: &own, ids: &ids, want: &want, values: &values, top_ids: &top_ids, rows, vocab })?;
    let vals = b.download_f32(&values)?;
    let tops = b.download_u32(&top_ids, rows * LOGPROBS_MAX_TOP)?;
    let mut r = 0;
    Ok(prompt
        .iter()
        .map(|p| {
            let scored = (0..p.targets.len())
                .map(|_| {
                    let row = RowLogprobs {
                        chosen: vals[r * width],
                        top: (0..p.top as usize)
                            .map(|j| (tops[r * LOGPROBS_MAX_TOP + j], vals[r * width + 1 + j]))
                            .collect(),
                    };
                    r += 1;
                    row
                })
                .collect();
            PromptLogprobs { seq: p.seq, rows: scored }
        })
        .collect())
}

/// `score_on` over host logits: `logits` holds `prompt`'s rows in order, `vocab` wide.
pub fn score_host(logits: &[f32], prompt: &[PromptRows], vocab: usize) -> Vec<PromptLogprobs> {
    let mut rows = logits.chunks(vocab.max(1));
    prompt
        .iter()
        .map(|p| {
            let scored = p
                .targets
                .iter()
                .zip(rows.by_ref())
                .map(|(&t, row)| {
                    let lse = logprobs::log_sum_exp(row);
                    let chosen = row.get(t as usize).map_or(f32::NAN, |l| l - lse);
                    let top = logprobs::top(row, p.top as usize).into_iter().map(|(id, l)| (id, l - lse)).collect();
                    RowLogprobs { chosen, top }
                })
                .collect();
            PromptLogprobs { seq: p.seq, rows: scored }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;

    #[test]
    fn device_scores_equal_the_host_reference() {
        let vocab = 7;
        let logits: Vec<f32> = (0..5 * vocab).map(|i| ((i * 37 % 11) as f32) * 0.3 - 1.0).collect();
        let prompt =
            vec![PromptRows { seq: 0, targets: vec![3, 1], top: 2 }, PromptRows { seq: 2, targets: vec![6], top: 0 }];
        let b = CpuBackend::new();
        let dev = b.upload_f32(&logits).unwrap();
        let got = score_on(&b, &dev, 2, &prompt, vocab).unwrap();
        let want = score_host(&logits[2 * vocab..], &prompt, vocab);
        assert_eq!(got.len(), 2);
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.seq, w.seq);
            assert_eq!(g.rows.len(), w.rows.len());
            for (a, e) in g.rows.iter().zip(&w.rows) {
                assert!((a.chosen - e.chosen).abs() < 1e-5, "{a:?} vs {e:?}");
                assert_eq!(
                    a.top.iter().map(|t| t.0).collect::<Vec<_>>(),
                    e.top.iter().map(|t| t.0).collect::<Vec<_>>()
                );
            }
        }
        // The target's log-prob is its log-softmax.
        let row = &logits[2 * vocab..3 * vocab];
        let lse = row.iter().map(|l| (l - 2.0).exp()).sum::<f32>().ln() + 2.0;
        assert!((got[0].rows[0].chosen - (row[3] - lse)).abs() < 1e-5);
    }

    #[test]
    fn logit_rows_follow_each_sequence_start() {
        let prompt = vec![
            PromptRows { seq: 1, targets: vec![5, 6, 7], top: 0 },
            PromptRows { seq: 2, targets: vec![9], top: 1 },
        ];
        assert_eq!(logit_rows(&prompt, &[0, 4, 10, 11]), vec![4, 5, 6, 10]);
    }
}
