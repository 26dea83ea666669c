//! `out[m, n] = x[m, k] . w[n, k]^T` with `w` packed. The activations are quantized once per scheme the weight's
//! parts need (per 32 values, per 256 for the k-quants' GGUF-layout kernels), then each part's output columns
//! (weight rows) are split over rayon's pool; each task streams its weight rows once and dots every row with all `m`
//! activation rows, `MAX_ROWS` at a time, while it sits in L1. With `Kernel::Avx512Rows16` every part but `Q6_K`
//! goes through the interleaved copy (`rows16`), at any row count; otherwise above `INTEGER_ROWS` rows (prefill)
//! f32 tiles of the weights go through candle's GEMM.

use rayon::prelude::*;

use std::cell::OnceCell;

use super::dot::{dot_rows, MAX_ROWS};
use super::rows16::Rows16;
#[cfg(target_arch = "x86_64")]
use super::rows16::LANES;
use super::{kdot, KQuantActs, Kernel, PackedMatrix, QuantActs, BLOCK};
use crate::cpu::be;
use crate::error::Result;

/// Weight rows per rayon task: enough to amortise the task, few enough to balance 2-64 threads.
const ROWS_PER_TASK: usize = 16;

/// Most rows the GGUF-layout integer kernels take; above it (prefill) the weights are dequantized a tile at a time
/// and go through candle's f32 GEMM, which was faster than those kernels at 128 rows (BENCHMARKS.md, `cpu_quant`).
/// The interleaved kernel (`rows16`) beat the GEMM and takes every row count.
pub const INTEGER_ROWS: usize = 16;

/// Weight rows dequantized per GEMM call: 512 x 4096 f32 is 8 MiB, a small fraction of the packed matrix's savings.
const TILE_ROWS: usize = 512;

/// `out = x . w^T` through f32 tiles of `w` and candle's GEMM (activations stay f32: no quantization error).
pub(super) fn dense_tiles(x: &[f32], w: &PackedMatrix, out: &mut [f32], m: usize, k: usize, n: usize) -> Result<()> {
    if w.dims() != [n, k] || x.len() < m * k || out.len() < m * n {
        return Err(be(format!("packed matmul [{m}, {k}] x {:?}^T does not fit the op's [{n}, {k}]", w.dims())));
    }
    let xt = candle_core::Tensor::from_slice(&x[..m * k], (m, k), &candle_core::Device::Cpu)?;
    let mut tile = vec![0f32; TILE_ROWS.min(n) * k];
    for j0 in (0..n).step_by(TILE_ROWS) {
        let rows = TILE_ROWS.min(n - j0);
        tile[..rows * k].par_chunks_mut(k).enumerate().for_each(|(r, o)| w.dequantize_row(j0 + r, o));
        let wt = candle_core::Tensor::from_slice(&tile[..rows * k], (rows, k), &candle_core::Device::Cpu)?;
        let y = xt.matmul(&wt.t()?)?.flatten_all()?.to_vec1::<f32>()?;
        for (o, yr) in out[..m * n].chunks_mut(n).zip(y.chunks(rows)) {
            o[j0..j0 + rows].copy_from_slice(yr);
        }
    }
    Ok(())
}

/// The packed matmul: integer block dots up to `INTEGER_ROWS` rows, dequantized tiles and f32 GEMM above.
pub fn matmul(
    x: &[f32],
    w: &PackedMatrix,
    bias: Option<&[f32]>,
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
) -> Result<()> {
    let kernel = Kernel::detect();
    if m > INTEGER_ROWS && !(kernel == Kernel::Avx512Rows16 && w.parts().iter().all(|p| Rows16::takes(p.format))) {
        dense_tiles(x, w, out, m, k, n)?;
    } else {
        matmul_with(kernel, x, w, out, m, k, n)?;
    }
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

/// Quantized activations in the scheme of one part's format.
#[derive(Clone, Copy)]
enum Acts<'a> {
    Block(&'a QuantActs),
    Super(&'a KQuantActs),
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
    let (acts, two_term, kacts) = (OnceCell::new(), OnceCell::new(), OnceCell::new());
    // Per 32 values, in one term or two (`PackedMatrix::with_two_term_activations`), with the number of rows they
    // make. Quantized on the first part that needs them, before the parallel loop (a `OnceCell` is not `Sync`).
    let per_block = || match w.two_term_activations() {
        true => (two_term.get_or_init(|| QuantActs::two_term(x, m, k)), 2 * m),
        false => (acts.get_or_init(|| QuantActs::new(x, m, k)), m),
    };
    // Each part's columns are computed into `t` (`part.rows * rows` values) and then placed in `out`, the second
    // term's rows (rows `m ..`) added to the first's.
    let mut t = Vec::new();
    let mut c0 = 0;
    for part in w.parts() {
        let (format, rb) = (part.format, part.format.row_bytes(k));
        // The interleaved layout (made on first use) takes activations quantized per 32 values, k-quants included.
        #[cfg(target_arch = "x86_64")]
        if kernel == Kernel::Avx512Rows16 {
            if let Some(r16) = part.rows16(k) {
                let (a, rows) = per_block();
                t.clear();
                t.resize(part.rows * rows, 0f32);
                // Group-major: group g's chunk is its rows' outputs for activation row 0, then row 1, ...
                // SAFETY: `Avx512Rows16` was checked to be among `Kernel::available()` above; the part's width is
                // `k`, the activations'; `t` has `part.rows` columns, so every chunk's group exists.
                t.par_chunks_mut(rows * LANES)
                    .enumerate()
                    .for_each(|(g, chunk)| unsafe { group(r16, g, a, chunk, rows) });
                for (g, chunk) in t.chunks(rows * LANES).enumerate() {
                    let lanes = chunk.len() / rows;
                    let (first, second) = chunk.split_at(m * lanes);
                    for (i, o) in first.chunks_exact(lanes).enumerate() {
                        let at = i * n + c0 + g * LANES;
                        out[at..at + lanes].copy_from_slice(o);
                        if rows > m {
                            let r = &second[i * lanes..(i + 1) * lanes];
                            out[at..at + lanes].iter_mut().zip(r).for_each(|(o, r)| *o += r);
                        }
                    }
                }
                c0 += part.rows;
                continue;
            }
        }
        let (acts, rows) = match format.is_k_quant() {
            true => (Acts::Super(kacts.get_or_init(|| KQuantActs::new(x, m, k))), m),
            false => {
                let (a, rows) = per_block();
                (Acts::Block(a), rows)
            }
        };
        t.clear();
        t.resize(part.rows * rows, 0f32);
        // Column-major: `rows` values per weight row.
        t.par_chunks_mut(rows * ROWS_PER_TASK).enumerate().for_each(|(task, chunk)| {
            for (jj, col) in chunk.chunks_exact_mut(rows).enumerate() {
                let r = task * ROWS_PER_TASK + jj;
                let row = &part.data[r * rb..(r + 1) * rb];
                for (g, o) in col.chunks_mut(MAX_ROWS).enumerate() {
                    match acts {
                        Acts::Block(a) => dot_rows(kernel, format, row, a, g * MAX_ROWS, o),
                        Acts::Super(a) => kdot::dot_rows(kernel, format, row, a, g * MAX_ROWS, o),
                    }
                }
            }
        });
        for (j, col) in t.chunks_exact(rows).enumerate() {
            let (first, second) = col.split_at(m);
            for (i, v) in first.iter().enumerate() {
                out[i * n + c0 + j] = if rows > m { v + second[i] } else { *v };
            }
        }
        c0 += part.rows;
    }
    Ok(())
}

/// Group `g`'s outputs (`chunk`: up to sixteen weight rows' values for activation row 0, then row 1, ...) for
/// every activation row, four activation rows to a tile.
///
/// # Safety
/// As `Rows16::dot_tile`: the CPU runs `Kernel::Avx512Rows16`, `acts` has `m` rows of the part's width.
#[cfg(target_arch = "x86_64")]
unsafe fn group(t: &Rows16, g: usize, acts: &QuantActs, chunk: &mut [f32], m: usize) {
    let lanes = chunk.len() / m;
    for r0 in (0..m).step_by(MAX_ROWS) {
        let rows = MAX_ROWS.min(m - r0);
        let mut tile = [[0f32; LANES]; MAX_ROWS];
        t.dot_tile(g, acts, r0, &mut tile[..rows]);
        for (i, o) in tile[..rows].iter().enumerate() {
            chunk[(r0 + i) * lanes..(r0 + i + 1) * lanes].copy_from_slice(&o[..lanes]);
        }
    }
}
