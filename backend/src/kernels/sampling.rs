//! The sampling ops as launches of `sampling.cl`: host checks, entry point, grid. The CPU backend's
//! `cpu/sampling.rs` is the reference they are tested against.

use rserve_kernels::launch::{LOGPROBS_MAX_TOP, SAMPLE_PARAM_WORDS};
use rserve_kernels::names;

use super::{arg_list, KernelDevice, Launch};
use crate::cpu::be;
use crate::error::Result;

/// `Op::AdjustLogits`: one work-item per edit. The edits' rows and tokens are bounded by their buffer's recorded
/// bound in O(1).
pub(super) fn adjust_logits<D: KernelDevice>(
    d: &D,
    [logits, edits, values]: [&D::Buf; 3],
    [count, rows, vocab]: [usize; 3],
) -> Result<()> {
    if count == 0 {
        return Ok(());
    }
    d.contents(logits).f32("adjust_logits logits", rows * vocab)?;
    let bound = d.contents(edits).u32("adjust_logits edits", 2 * count)?;
    d.contents(values).f32("adjust_logits values", 2 * count)?;
    // Rows and tokens share the buffer, so its bound checks each against the larger limit only; the kernel skips an
    // edit whose row or token is out of its own range.
    if bound > rows.max(vocab) {
        return Err(be(format!("adjust_logits: an edit names an index of {} or more ({rows} x {vocab})", bound - 1)));
    }
    let kernel = names::ADJUST_LOGITS;
    let args = arg_list(kernel, &[logits, edits, values], &[(count, "count"), (vocab, "vocab"), (rows, "rows")])?;
    d.launch(&Launch::items(kernel, args, count, [1, 1]))
}

/// `Op::ArgmaxRows`: one work-group per row.
pub(super) fn argmax_rows<D: KernelDevice>(d: &D, [x, out]: [&D::Buf; 2], [rows, width]: [usize; 2]) -> Result<()> {
    if rows == 0 {
        return Ok(());
    }
    if width == 0 {
        return Err(be("argmax_rows: empty rows"));
    }
    d.contents(x).f32("argmax_rows x", rows * width)?;
    d.contents(out).u32("argmax_rows out", rows)?;
    let kernel = names::ARGMAX_ROWS;
    let args = arg_list(kernel, &[x, out], &[(width, "width")])?;
    d.launch(&Launch::groups(kernel, args, rows, [1, 1]))
}

/// `Op::SampleRows`: one work-group per row.
pub(super) fn sample_rows<D: KernelDevice>(
    d: &D,
    [logits, params, ids]: [&D::Buf; 3],
    [rows, vocab]: [usize; 2],
) -> Result<()> {
    if rows == 0 {
        return Ok(());
    }
    if vocab == 0 {
        return Err(be("sample_rows: an empty vocabulary"));
    }
    d.contents(logits).f32("sample_rows logits", rows * vocab)?;
    d.contents(params).u32("sample_rows params", rows * SAMPLE_PARAM_WORDS)?;
    d.contents(ids).u32("sample_rows ids", rows)?;
    let kernel = names::SAMPLE_ROWS;
    let args = arg_list(kernel, &[logits, params, ids], &[(vocab, "vocab")])?;
    d.launch(&Launch::groups(kernel, args, rows, [1, 1]))
}

/// `Op::RowLogprobs`: one work-group per row (rows that want none return at once).
pub(super) fn row_logprobs<D: KernelDevice>(
    d: &D,
    [logits, ids, want, values, top_ids]: [&D::Buf; 5],
    [rows, vocab]: [usize; 2],
) -> Result<()> {
    if rows == 0 {
        return Ok(());
    }
    d.contents(logits).f32("row_logprobs logits", rows * vocab)?;
    d.contents(ids).u32("row_logprobs ids", rows)?;
    d.contents(want).u32("row_logprobs want", rows)?;
    d.contents(values).f32("row_logprobs values", rows * (1 + LOGPROBS_MAX_TOP))?;
    d.contents(top_ids).u32("row_logprobs top_ids", rows * LOGPROBS_MAX_TOP)?;
    let kernel = names::ROW_LOGPROBS;
    let args = arg_list(kernel, &[logits, ids, want, values, top_ids], &[(vocab, "vocab")])?;
    d.launch(&Launch::groups(kernel, args, rows, [1, 1]))
}
