//! `out[m, n] = x[m, k] . w[n, k]^T` with `w` packed: the activations are quantized once, then the output columns
//! (weight rows) are split over rayon's pool; each task streams its weight rows once and dots every row with all
//! `m` activation rows, `MAX_ROWS` at a time, while it sits in L1.

use rayon::prelude::*;

use super::dot::{dot_rows, MAX_ROWS};
use super::{Kernel, PackedMatrix, QuantActs, BLOCK};
use crate::backend::cpu::be;
use crate::error::Result;

/// Weight rows per rayon task: enough to amortise the task, few enough to balance 2-64 threads.
const ROWS_PER_TASK: usize = 16;

/// The packed matmul with the fastest kernel this CPU has.
pub fn matmul(
    x: &[f32],
    w: &PackedMatrix,
    bias: Option<&[f32]>,
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
) -> Result<()> {
    matmul_with(Kernel::detect(), x, w, out, m, k, n)?;
    if let Some(b) = bias {
        if b.len() < n {
            return Err(be(format!("bias has {} values, expected {n}", b.len())));
        }
        for row in out[..m * n].chunks_mut(n) {
            row.iter_mut().zip(b).for_each(|(o, b)| *o += b);
        }
    }
    Ok(())
}

/// Rows `ids` of a packed embedding table, dequantized and multiplied by `scale`, into `out[n, hidden]`.
pub fn embedding(
    table: &PackedMatrix,
    ids: &[u32],
    out: &mut [f32],
    n: usize,
    hidden: usize,
    scale: f32,
) -> Result<()> {
    let [vocab, width] = table.dims();
    if width != hidden || ids.len() < n || out.len() < n * hidden {
        return Err(be(format!("embedding of {n} ids into [{n}, {hidden}] from a [{vocab}, {width}] table")));
    }
    if let Some(bad) = ids[..n].iter().find(|&&i| i as usize >= vocab) {
        return Err(be(format!("token id {bad} is outside the vocabulary of {vocab}")));
    }
    for (&id, o) in ids[..n].iter().zip(out.chunks_exact_mut(hidden)) {
        table.dequantize_row(id as usize, o);
        o.iter_mut().for_each(|v| *v *= scale);
    }
    Ok(())
}

/// The packed matmul with a chosen kernel (tests compare them).
pub fn matmul_with(
    kernel: Kernel,
    x: &[f32],
    w: &PackedMatrix,
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
) -> Result<()> {
    if w.dims() != [n, k] {
        return Err(be(format!("packed {} weight is {:?}, op expects [{n}, {k}]", w.format().as_str(), w.dims())));
    }
    if x.len() < m * k || out.len() < m * n {
        return Err(be(format!("matmul buffers too small for [{m}, {k}] x [{k}, {n}]")));
    }
    if !k.is_multiple_of(BLOCK) {
        return Err(be(format!("packed matmul needs k a multiple of {BLOCK}, got {k}")));
    }
    if !Kernel::available().contains(&kernel) {
        return Err(be(format!("the {kernel:?} kernel does not run on this CPU")));
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    let acts = QuantActs::new(x, m, k);
    // Column-major result (m values per weight row), transposed into `out` at the end.
    let mut t = vec![0f32; n * m];
    t.par_chunks_mut(m * ROWS_PER_TASK).enumerate().for_each(|(task, chunk)| {
        for (jj, col) in chunk.chunks_exact_mut(m).enumerate() {
            let row = w.row(task * ROWS_PER_TASK + jj);
            for (g, o) in col.chunks_mut(MAX_ROWS).enumerate() {
                dot_rows(kernel, w.format(), row, &acts, g * MAX_ROWS, o);
            }
        }
    });
    if m == 1 {
        out[..n].copy_from_slice(&t);
    } else {
        for (j, col) in t.chunks_exact(m).enumerate() {
            for (i, v) in col.iter().enumerate() {
                out[i * n + j] = *v;
            }
        }
    }
    Ok(())
}
