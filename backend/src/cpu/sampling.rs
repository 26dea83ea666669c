//! The CPU's sampling ops (`Op::ArgmaxRows`, `Op::AdjustLogits`, `Op::SampleRows`, `Op::RowLogprobs`): the reference every device's
//! kernels are tested against, rows in parallel on the engine's rayon pool. The algorithms live in
//! `crate::sampling`; this file checks shapes and spreads rows over threads.

use rayon::prelude::*;
use rserve_kernels::launch::{LOGPROBS_MAX_TOP, SAMPLE_PARAM_WORDS};

use super::be;
use crate::error::Result;
use crate::sampling::{draw, logprobs, RowParams, NO_LOGPROBS};

fn need(what: &str, have: usize, want: usize) -> Result<()> {
    if have < want {
        return Err(be(format!("{what}: {have} values, the op needs {want}")));
    }
    Ok(())
}

pub(super) fn adjust_logits(
    logits: &mut [f32],
    edits: &[u32],
    values: &[f32],
    [count, rows, vocab]: [usize; 3],
) -> Result<()> {
    need("adjust_logits logits", logits.len(), rows * vocab)?;
    need("adjust_logits edits", edits.len(), 2 * count)?;
    need("adjust_logits values", values.len(), 2 * count)?;
    for e in 0..count {
        let (row, token) = (edits[2 * e] as usize, edits[2 * e + 1] as usize);
        if row >= rows || token >= vocab {
            return Err(be(format!("adjust_logits: edit {e} names row {row}, token {token} of {rows} x {vocab}")));
        }
        let edit =
            crate::sampling::Edit { row: row as u32, token: token as u32, mul: values[2 * e], add: values[2 * e + 1] };
        let x = &mut logits[row * vocab + token];
        *x = edit.apply(*x);
    }
    Ok(())
}

pub(super) fn argmax_rows(x: &[f32], out: &mut [u32], rows: usize, width: usize) -> Result<()> {
    need("argmax_rows x", x.len(), rows * width)?;
    need("argmax_rows out", out.len(), rows)?;
    if width == 0 && rows > 0 {
        return Err(be("argmax_rows: empty rows"));
    }
    out[..rows].par_iter_mut().enumerate().for_each(|(r, id)| *id = draw::argmax(&x[r * width..(r + 1) * width]));
    Ok(())
}

pub(super) fn sample_rows(logits: &[f32], params: &[u32], ids: &mut [u32], rows: usize, vocab: usize) -> Result<()> {
    need("sample_rows logits", logits.len(), rows * vocab)?;
    need("sample_rows params", params.len(), rows * SAMPLE_PARAM_WORDS)?;
    need("sample_rows ids", ids.len(), rows)?;
    if vocab == 0 {
        return Err(be("sample_rows: an empty vocabulary"));
    }
    ids[..rows].par_iter_mut().enumerate().for_each_init(Vec::new, |w, (r, id)| {
        let p = RowParams::unpack(&params[r * SAMPLE_PARAM_WORDS..]);
        *id = draw::sample_row(&logits[r * vocab..(r + 1) * vocab], &p, w);
    });
    Ok(())
}

pub(super) fn row_logprobs(
    logits: &[f32],
    ids: &[u32],
    want: &[u32],
    values: &mut [f32],
    top_ids: &mut [u32],
    [rows, vocab]: [usize; 2],
) -> Result<()> {
    let width = 1 + LOGPROBS_MAX_TOP;
    need("row_logprobs logits", logits.len(), rows * vocab)?;
    need("row_logprobs ids", ids.len(), rows)?;
    need("row_logprobs want", want.len(), rows)?;
    need("row_logprobs values", values.len(), rows * width)?;
    need("row_logprobs top_ids", top_ids.len(), rows * LOGPROBS_MAX_TOP)?;
    for r in 0..rows {
        let n = want[r];
        if n == NO_LOGPROBS {
            continue;
        }
        if n as usize > LOGPROBS_MAX_TOP || ids[r] as usize >= vocab {
            return Err(be(format!("row_logprobs: row {r} wants {n} alternatives of token {}", ids[r])));
        }
    }
    values[..rows * width]
        .par_chunks_mut(width)
        .zip(top_ids[..rows * LOGPROBS_MAX_TOP].par_chunks_mut(LOGPROBS_MAX_TOP))
        .enumerate()
        .filter(|(r, _)| want[*r] != NO_LOGPROBS)
        .for_each(|(r, (vals, tops))| {
            let row = &logits[r * vocab..(r + 1) * vocab];
            let lse = logprobs::log_sum_exp(row);
            vals[0] = row[ids[r] as usize] - lse;
            for (j, (t, l)) in logprobs::top(row, want[r] as usize).into_iter().enumerate() {
                tops[j] = t;
                vals[1 + j] = l - lse;
            }
        });
    Ok(())
}
