//! GGUF weights kept in their block layout on the CPU (`Q8_0`, `Q4_0`, `Q4_1`) and multiplied with integer dot
//! products, as llama.cpp does: each 32-value block of an activation row is quantized to int8 with its own scale
//! (`max|x| / 127`), the int8 products of a weight block and an activation block are summed exactly in integers, and
//! the block sums are scaled by both scales and added in f32.
//!
//! How the packed form reaches the backend without changing the model's upload path: the GGUF loader registers each
//! tensor it dequantized from one of these types (`registry`), the `Weights` keep the packed matrices alive, and
//! `CpuBackend::upload_weight` / `upload_weight_rows` look a tensor up by its id and keep the blocks instead of the
//! f32 copy. Other backends never look, so they still get the dequantized tensors.

mod act;
mod dot;
mod matmul;
mod registry;

pub use act::QuantActs;
pub use dot::Kernel;
pub use matmul::{embedding, matmul, matmul_with, INTEGER_ROWS};
pub use registry::{lookup, register, Keep};

use half::f16;

use crate::error::{EngineError, Result};

/// Values per block in every format here.
pub const BLOCK: usize = 32;

/// A GGUF block format kept packed on the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// f16 scale `d`, 32 int8 values: `x = d * q`.
    Q8_0,
    /// f16 scale `d`, 16 bytes of nibbles (byte `j`: value `j` low, value `j + 16` high): `x = d * (q - 8)`.
    Q4_0,
    /// f16 scale `d`, f16 minimum `m`, 16 bytes of nibbles as in `Q4_0`: `x = d * q + m`.
    Q4_1,
}

impl Format {
    /// Bytes of one 32-value block.
    pub const fn block_bytes(self) -> usize {
        match self {
            Format::Q8_0 => 34,
            Format::Q4_0 => 18,
            Format::Q4_1 => 20,
        }
    }

    /// The format of a GGUF tensor type, when it is one kept packed.
    pub fn from_ggml(t: candle_core::quantized::GgmlDType) -> Option<Self> {
        use candle_core::quantized::GgmlDType as G;
        match t {
            G::Q8_0 => Some(Format::Q8_0),
            G::Q4_0 => Some(Format::Q4_0),
            G::Q4_1 => Some(Format::Q4_1),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Format::Q8_0 => "Q8_0",
            Format::Q4_0 => "Q4_0",
            Format::Q4_1 => "Q4_1",
        }
    }
}

/// A `[rows, cols]` weight matrix in a block format: each row is `cols / 32` consecutive blocks.
#[derive(Debug, Clone)]
pub struct PackedMatrix {
    format: Format,
    rows: usize,
    cols: usize,
    data: Vec<u8>,
}

impl PackedMatrix {
    /// Wraps a GGUF tensor's bytes (`rows * cols / 32` blocks, row-major).
    pub fn new(format: Format, rows: usize, cols: usize, data: Vec<u8>) -> Result<Self> {
        if !cols.is_multiple_of(BLOCK) {
            return Err(EngineError::Weights(format!(
                "{} rows of {cols} values are not whole blocks",
                format.as_str()
            )));
        }
        let want = rows * cols / BLOCK * format.block_bytes();
        if data.len() != want {
            return Err(EngineError::Weights(format!(
                "{} [{rows}, {cols}] needs {want} bytes, got {}",
                format.as_str(),
                data.len()
            )));
        }
        Ok(PackedMatrix { format, rows, cols, data })
    }

    pub fn format(&self) -> Format {
        self.format
    }

    pub fn dims(&self) -> [usize; 2] {
        [self.rows, self.cols]
    }

    /// Bytes one row takes.
    pub fn row_bytes(&self) -> usize {
        self.cols / BLOCK * self.format.block_bytes()
    }

    /// Bytes held (what a matmul streams).
    pub fn byte_len(&self) -> usize {
        self.data.len()
    }

    /// Row `r`'s blocks.
    pub fn row(&self, r: usize) -> &[u8] {
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }

    /// Row `r` as f32 (what the GGUF loader's dequantization gives).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let bb = self.format.block_bytes();
        for (blk, o) in self.row(r).chunks_exact(bb).zip(out.chunks_exact_mut(BLOCK)) {
            let d = f16_at(blk, 0);
            match self.format {
                Format::Q8_0 => o.iter_mut().zip(&blk[2..]).for_each(|(o, &q)| *o = d * q as i8 as f32),
                Format::Q4_0 | Format::Q4_1 => {
                    let (m, qs, bias) = if self.format == Format::Q4_0 {
                        (0.0, &blk[2..18], 8)
                    } else {
                        (f16_at(blk, 2), &blk[4..20], 0)
                    };
                    for (j, &b) in qs.iter().enumerate() {
                        o[j] = d * ((b & 0x0f) as i32 - bias) as f32 + m;
                        o[j + 16] = d * ((b >> 4) as i32 - bias) as f32 + m;
                    }
                }
            }
        }
    }

    /// The whole matrix as f32, row-major.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        for (r, o) in out.chunks_exact_mut(self.cols.max(1)).enumerate() {
            self.dequantize_row(r, o);
        }
        out
    }

    /// The matrix with row `i` taken from row `from[i]` (rows are whole blocks, so a row permutation moves bytes).
    pub fn select_rows(&self, from: &[usize]) -> Self {
        let mut data = Vec::with_capacity(from.len() * self.row_bytes());
        for &r in from {
            data.extend_from_slice(self.row(r));
        }
        PackedMatrix { format: self.format, rows: from.len(), cols: self.cols, data }
    }

    /// Matrices of one format and width stacked by rows (a fused q/k/v or gate/up projection); None otherwise.
    pub fn cat_rows(parts: &[&PackedMatrix]) -> Option<Self> {
        let first = parts.first()?;
        if parts.iter().any(|p| p.format != first.format || p.cols != first.cols) {
            return None;
        }
        let mut data = Vec::with_capacity(parts.iter().map(|p| p.data.len()).sum());
        parts.iter().for_each(|p| data.extend_from_slice(&p.data));
        Some(PackedMatrix { format: first.format, rows: parts.iter().map(|p| p.rows).sum(), cols: first.cols, data })
    }
}

/// The f16 stored little-endian at `b[at..at + 2]`, as f32.
#[inline]
pub(crate) fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

#[cfg(test)]
mod tests;
