//! GGUF weights kept in their block layout on the CPU (`Q8_0`, `Q4_0`, `Q4_1`, and the k-quants `Q4_K`, `Q5_K`,
//! `Q6_K`) and multiplied with integer dot products, as llama.cpp does: activations are quantized to int8 per block
//! with their own scale (`max|x| / 127`; per 32 values for the 32-value formats, per 256 with sums per 16 for the
//! k-quants' super-blocks, `kact`), the int8 products of a weight block and an activation block are summed exactly in
//! integers (a k-quant's 6- or 8-bit sub-block scales applied in integers too), and the block sums are scaled by
//! both scales and added in f32.
//!
//! How the packed form reaches the backend without changing the model's upload path: the GGUF loader registers each
//! tensor it dequantized from one of these types (`registry`), the `Weights` keep the packed matrices alive, and
//! `CpuBackend::upload_weight` / `upload_weight_rows` look a tensor up by its id and keep the blocks instead of the
//! f32 copy. Other backends never look, so they still get the dequantized tensors. A fused projection whose parts
//! have different formats (a `Q4_K_M` file's `Q4_K` q/k and `Q6_K` v) stays packed as a stack of parts.

mod act;
mod dot;
mod kact;
mod kblock;
mod kdot;
mod matmul;
#[cfg(target_arch = "aarch64")]
mod neon;
mod registry;
// Its kernel is x86-64's (512-bit VNNI); elsewhere only `takes` and the portable test arithmetic are used.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code, unused_imports))]
mod rows16;

pub use act::QuantActs;
pub use dot::Kernel;
pub use kact::KQuantActs;
pub use matmul::{embedding, matmul, matmul_with, INTEGER_ROWS};
pub use registry::{is_placeholder, lookup, placeholder, register, Keep};

use std::sync::OnceLock;

use half::f16;

use crate::error::{BackendError, Result};

/// Values per block in `Q8_0`, `Q4_0` and `Q4_1`.
pub const BLOCK: usize = 32;

/// Values per super-block in the k-quants (`Q4_K`, `Q5_K`, `Q6_K`; GGML's `QK_K`).
pub const SUPER_BLOCK: usize = 256;

/// A GGUF block format kept packed on the CPU (named as GGUF names them).
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// f16 scale `d`, 32 int8 values: `x = d * q`.
    Q8_0,
    /// f16 scale `d`, 16 bytes of nibbles (byte `j`: value `j` low, value `j + 16` high): `x = d * (q - 8)`.
    Q4_0,
    /// f16 scale `d`, f16 minimum `m`, 16 bytes of nibbles as in `Q4_0`: `x = d * q + m`.
    Q4_1,
    /// f16 scale `d`, 32 fifth bits (bit `j` of a little-endian u32 tops value `j`), nibbles as in `Q4_0`:
    /// `x = d * (q - 16)`.
    Q5_0,
    /// f16 scale `d`, f16 minimum `m`, fifth bits and nibbles as in `Q5_0`: `x = d * q + m`.
    Q5_1,
    /// 256 values in 8 sub-blocks of 32, 4-bit values with a 6-bit scale and minimum each (layout in `kblock`).
    Q4_K,
    /// As `Q4_K` with a fifth bit per value.
    Q5_K,
    /// 256 values in 16 sub-blocks of 16, 6-bit values with an int8 scale each (layout in `kblock`).
    Q6_K,
}

impl Format {
    /// Bytes of one block (a super-block for the k-quants).
    pub const fn block_bytes(self) -> usize {
        match self {
            Format::Q8_0 => 34,
            Format::Q4_0 => 18,
            Format::Q4_1 => 20,
            Format::Q5_0 => 22,
            Format::Q5_1 => 24,
            Format::Q4_K => 144,
            Format::Q5_K => 176,
            Format::Q6_K => 210,
        }
    }

    /// Values in one block: `BLOCK`, or `SUPER_BLOCK` for the k-quants.
    pub const fn block_len(self) -> usize {
        if self.is_k_quant() {
            SUPER_BLOCK
        } else {
            BLOCK
        }
    }

    /// Whether the format has 256-value super-blocks (and takes `KQuantActs`).
    pub const fn is_k_quant(self) -> bool {
        matches!(self, Format::Q4_K | Format::Q5_K | Format::Q6_K)
    }

    /// The format of a GGUF tensor type, when it is one kept packed.
    pub fn from_ggml(t: candle_core::quantized::GgmlDType) -> Option<Self> {
        use candle_core::quantized::GgmlDType as G;
        match t {
            G::Q8_0 => Some(Format::Q8_0),
            G::Q4_0 => Some(Format::Q4_0),
            G::Q4_1 => Some(Format::Q4_1),
            G::Q5_0 => Some(Format::Q5_0),
            G::Q5_1 => Some(Format::Q5_1),
            G::Q4K => Some(Format::Q4_K),
            G::Q5K => Some(Format::Q5_K),
            G::Q6K => Some(Format::Q6_K),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Format::Q8_0 => "Q8_0",
            Format::Q4_0 => "Q4_0",
            Format::Q4_1 => "Q4_1",
            Format::Q5_0 => "Q5_0",
            Format::Q5_1 => "Q5_1",
            Format::Q4_K => "Q4_K",
            Format::Q5_K => "Q5_K",
            Format::Q6_K => "Q6_K",
        }
    }

    /// Whether a 32-value block keeps a minimum (`x = d * q + m`) rather than a signed value (`Q4_1`, `Q5_1`).
    pub const fn has_min(self) -> bool {
        matches!(self, Format::Q4_1 | Format::Q5_1)
    }

    /// The shift `z` from a 32-value format's stored values to unsigned ones (`unsigned_values`): the signed
    /// value is `u - z`. 128 for `Q8_0`, 8 for `Q4_0`, 16 for `Q5_0`, none for the formats with a minimum.
    pub const fn shift(self) -> i16 {
        match self {
            Format::Q8_0 => 128,
            Format::Q4_0 => 8,
            Format::Q5_0 => 16,
            _ => 0,
        }
    }

    /// A 32-value block's values as unsigned bytes `u`: `x = d * (u - shift)` or, with a minimum, `d * u + m`.
    fn unsigned_values(self, blk: &[u8]) -> [u8; BLOCK] {
        let mut u = [0u8; BLOCK];
        match self {
            Format::Q8_0 => u.iter_mut().zip(&blk[2..34]).for_each(|(u, &q)| *u = (q as i8 as i16 + 128) as u8),
            Format::Q4_0 | Format::Q4_1 | Format::Q5_0 | Format::Q5_1 => {
                let at = if self.has_min() { 4 } else { 2 };
                let (qh, qs) = match self {
                    Format::Q5_0 | Format::Q5_1 => {
                        (u32::from_le_bytes([blk[at], blk[at + 1], blk[at + 2], blk[at + 3]]), &blk[at + 4..at + 20])
                    }
                    _ => (0, &blk[at..at + 16]),
                };
                for (j, &q) in qs.iter().enumerate() {
                    u[j] = (q & 0x0f) | (((qh >> j) & 1) << 4) as u8;
                    u[j + 16] = (q >> 4) | (((qh >> (j + 16)) & 1) << 4) as u8;
                }
            }
            Format::Q4_K | Format::Q5_K | Format::Q6_K => unreachable!("unsigned_values takes the 32-value formats"),
        }
        u
    }

    /// Bytes of one row of `cols` values (whole blocks).
    const fn row_bytes(self, cols: usize) -> usize {
        cols / self.block_len() * self.block_bytes()
    }

    /// One block's values as f32 (what candle's, i.e. the GGUF loader's, dequantization gives).
    fn decode_block(self, blk: &[u8], o: &mut [f32]) {
        let d = f16_at(blk, 0);
        match self {
            Format::Q8_0 => o.iter_mut().zip(&blk[2..]).for_each(|(o, &q)| *o = d * q as i8 as f32),
            Format::Q4_0 | Format::Q4_1 | Format::Q5_0 | Format::Q5_1 => {
                // As candle (ggml) orders it: the signed integer times d, then plus the minimum.
                let (u, m) = (self.unsigned_values(blk), if self.has_min() { f16_at(blk, 2) } else { 0.0 });
                for (o, &u) in o.iter_mut().zip(&u) {
                    let q = (u as i16 - self.shift()) as f32;
                    *o = if self.has_min() { q * d + m } else { q * d };
                }
            }
            Format::Q4_K | Format::Q5_K | Format::Q6_K => kblock::decode(self, blk, o),
        }
    }
}

/// Consecutive rows of a `PackedMatrix` in one format: `rows` rows of whole blocks.
#[derive(Debug, Clone)]
struct Part {
    format: Format,
    rows: usize,
    data: Vec<u8>,
    /// The 32-value formats with sixteen rows interleaved for `Kernel::Avx512Rows16`, made the first time that
    /// kernel meets the part.
    rows16: OnceLock<Option<rows16::Rows16>>,
}

impl Part {
    fn new(format: Format, rows: usize, data: Vec<u8>) -> Self {
        Part { format, rows, data, rows16: OnceLock::new() }
    }

    /// The interleaved copy (None for the k-quants).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn rows16(&self, cols: usize) -> Option<&rows16::Rows16> {
        self.rows16.get_or_init(|| rows16::Rows16::new(self.format, self.rows, cols, &self.data)).as_ref()
    }
}

/// A `[rows, cols]` weight matrix in block formats: each row is `cols / block_len` consecutive blocks of its part's
/// format. One part, unless stacked (`cat_rows`) from matrices of different formats.
#[derive(Debug, Clone)]
pub struct PackedMatrix {
    rows: usize,
    cols: usize,
    parts: Vec<Part>,
    /// Activations quantized in two terms (`with_two_term_activations`).
    two_term: bool,
}

impl PackedMatrix {
    /// Wraps a GGUF tensor's bytes (`rows * cols / block_len` blocks, row-major).
    pub fn new(format: Format, rows: usize, cols: usize, data: Vec<u8>) -> Result<Self> {
        if !cols.is_multiple_of(format.block_len()) {
            return Err(BackendError::Weights(format!(
                "{} rows of {cols} values are not whole blocks of {}",
                format.as_str(),
                format.block_len()
            )));
        }
        let want = rows * format.row_bytes(cols);
        if data.len() != want {
            return Err(BackendError::Weights(format!(
                "{} [{rows}, {cols}] needs {want} bytes, got {}",
                format.as_str(),
                data.len()
            )));
        }
        Ok(PackedMatrix { rows, cols, parts: vec![Part::new(format, rows, data)], two_term: false })
    }

    /// The matrix multiplying activations quantized in two terms (`QuantActs::two_term`: the int8 values, then
    /// their residual, about 15 bits) when `on`, else in one. For a model whose matrices are all `Q8_0` (the loader
    /// decides, `weights::gguf`): such weights are about as precise as one int8 activation term, so one term doubles
    /// the error of the dequantized f32 path and greedy runs part from it at near-ties. Where 4- or 5-bit matrices
    /// set the model's error (a `Q4_1` file with a `Q8_0` head), a second term costs twice the integer work and buys
    /// nothing visible.
    pub fn with_two_term_activations(mut self, on: bool) -> Self {
        self.two_term = on;
        self
    }

    /// Whether the activations are quantized in two terms (`with_two_term_activations`).
    pub fn two_term_activations(&self) -> bool {
        self.two_term
    }

    /// The format of the first rows: the only one unless stacked from several formats (`formats`).
    pub fn format(&self) -> Format {
        self.parts.first().map_or(Format::Q8_0, |p| p.format)
    }

    /// Each part's format and number of rows, top to bottom.
    pub fn formats(&self) -> Vec<(Format, usize)> {
        self.parts.iter().map(|p| (p.format, p.rows)).collect()
    }

    fn parts(&self) -> &[Part] {
        &self.parts
    }

    pub fn dims(&self) -> [usize; 2] {
        [self.rows, self.cols]
    }

    /// Bytes held (what a matmul streams).
    pub fn byte_len(&self) -> usize {
        self.parts.iter().map(|p| p.data.len()).sum()
    }

    /// Bytes the matrix takes once in use: its blocks, plus the interleaved copy `Kernel::Avx512Rows16` makes of the
    /// parts it takes, where that kernel runs.
    pub fn resident_bytes(&self) -> usize {
        let copy = |p: &Part| match Kernel::detect() == Kernel::Avx512Rows16 && rows16::Rows16::takes(p.format) {
            true => rows16::Rows16::bytes(p.format, p.rows, self.cols),
            false => 0,
        };
        self.parts.iter().map(|p| p.data.len() + copy(p)).sum()
    }

    /// Row `r`'s format and blocks.
    pub fn row(&self, mut r: usize) -> (Format, &[u8]) {
        for p in &self.parts {
            if r < p.rows {
                let rb = p.format.row_bytes(self.cols);
                return (p.format, &p.data[r * rb..(r + 1) * rb]);
            }
            r -= p.rows;
        }
        panic!("row {r} past the end of a packed [{}, {}] matrix", self.rows, self.cols)
    }

    /// Row `r` as f32 (what the GGUF loader's dequantization gives).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let (format, row) = self.row(r);
        for (blk, o) in row.chunks_exact(format.block_bytes()).zip(out.chunks_exact_mut(format.block_len())) {
            format.decode_block(blk, o);
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

    /// Appends `rows` rows of `format` as `bytes`, joining the last part when it has the same format.
    fn push(&mut self, format: Format, rows: usize, bytes: &[u8]) {
        match self.parts.last_mut() {
            Some(p) if p.format == format => {
                p.rows += rows;
                p.data.extend_from_slice(bytes);
                p.rows16 = OnceLock::new();
            }
            _ => self.parts.push(Part::new(format, rows, bytes.to_vec())),
        }
        self.rows += rows;
    }

    /// The matrix with row `i` taken from row `from[i]` (rows are whole blocks, so a row permutation moves bytes).
    pub fn select_rows(&self, from: &[usize]) -> Self {
        let mut out = PackedMatrix { rows: 0, cols: self.cols, parts: Vec::new(), two_term: self.two_term };
        for &r in from {
            let (format, row) = self.row(r);
            out.push(format, 1, row);
        }
        out
    }

    /// Matrices of one width stacked by rows (a fused q/k/v or gate/up projection), in whatever formats; None when
    /// the widths differ.
    pub fn cat_rows(parts: &[&PackedMatrix]) -> Option<Self> {
        let first = parts.first()?;
        if parts.iter().any(|p| p.cols != first.cols) {
            return None;
        }
        let two_term = parts.iter().all(|m| m.two_term);
        let mut out = PackedMatrix { rows: 0, cols: first.cols, parts: Vec::new(), two_term };
        for p in parts.iter().flat_map(|m| &m.parts) {
            out.push(p.format, p.rows, &p.data);
        }
        Some(out)
    }
}

/// The f16 stored little-endian at `b[at..at + 2]`, as f32.
#[inline]
pub(crate) fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

#[cfg(test)]
mod ktests;
#[cfg(test)]
mod tests;
