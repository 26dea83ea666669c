//! The CPU backend: the reference implementation of every `Op`, on host memory.
//!
//! Activations and the KV cache are f32 vectors behind `RefCell` (ops write through shared references, like device
//! memory); 2-D weights stay candle tensors in their dtype so matrix multiplies go through candle's GEMM; 1-D weights
//! (norms, biases) are kept as f32. Elementwise ops and attention are parallelised with rayon. Weights loaded from a
//! GGUF file in `Q8_0`, `Q4_0` or `Q4_1` stay in their block layout and multiply with integer dot products (`quant`).

mod attention;
mod elementwise;
mod gemv;
mod matmul;
mod moe;
pub mod quant;

use std::cell::{Ref, RefCell, RefMut};
use std::sync::Arc;

use candle_core::{DType, Tensor};

use super::{Backend, Op};
use crate::error::{EngineError, Result};

/// A host allocation of the CPU backend.
#[derive(Debug)]
pub enum CpuBuffer {
    F32(RefCell<Vec<f32>>),
    /// Indices: uploaded, or written by an op (`Backend::alloc_u32_output`).
    U32(RefCell<Vec<u32>>),
    /// A 2-D weight matrix `[rows, cols]` in its weight dtype.
    Matrix(Tensor),
    /// A 2-D weight matrix kept in a GGUF block format.
    Packed(Arc<quant::PackedMatrix>),
}

impl CpuBuffer {
    pub(crate) fn f32(&self) -> Result<Ref<'_, Vec<f32>>> {
        match self {
            CpuBuffer::F32(v) => v.try_borrow().map_err(|_| be("f32 buffer is being written")),
            _ => Err(be("expected an f32 buffer")),
        }
    }

    pub(crate) fn f32_mut(&self) -> Result<RefMut<'_, Vec<f32>>> {
        match self {
            CpuBuffer::F32(v) => v.try_borrow_mut().map_err(|_| be("f32 buffer is aliased by another argument")),
            _ => Err(be("expected an f32 buffer")),
        }
    }

    pub(crate) fn u32(&self) -> Result<Ref<'_, Vec<u32>>> {
        match self {
            CpuBuffer::U32(v) => v.try_borrow().map_err(|_| be("u32 buffer is being written")),
            _ => Err(be("expected a u32 buffer")),
        }
    }

    pub(crate) fn u32_mut(&self) -> Result<RefMut<'_, Vec<u32>>> {
        match self {
            CpuBuffer::U32(v) => v.try_borrow_mut().map_err(|_| be("u32 buffer is aliased by another argument")),
            _ => Err(be("expected a u32 buffer")),
        }
    }

    pub(crate) fn matrix(&self) -> Result<&Tensor> {
        match self {
            CpuBuffer::Matrix(t) => Ok(t),
            _ => Err(be("expected a weight matrix")),
        }
    }
}

pub(crate) fn be(msg: impl Into<String>) -> EngineError {
    EngineError::Backend(msg.into())
}

/// The CPU backend (rayon's global pool does the threading).
#[derive(Debug, Clone)]
pub struct CpuBackend {
    /// Keep weights that have a packed twin (`quant::lookup`) packed.
    packed: bool,
}

impl Default for CpuBackend {
    /// The reference: every weight in its dequantized type. Packed GGUF weights only with `--cpu-packed-weights`
    /// (`with_packed_weights`): the packed path quantizes activations, so its logits differ from the f32 reference
    /// the golden tests hold the CPU backend to.
    fn default() -> Self {
        CpuBackend { packed: false }
    }
}

impl CpuBackend {
    pub fn new() -> Self {
        Self::default()
    }

    /// A backend that keeps GGUF `Q8_0` / `Q4_0` / `Q4_1` weights packed (`packed`) or multiplies every weight in
    /// its dequantized type (the reference).
    pub fn with_packed_weights(packed: bool) -> Self {
        CpuBackend { packed }
    }

    fn packed_twin(&self, t: &Tensor) -> Option<Arc<quant::PackedMatrix>> {
        self.packed.then(|| quant::lookup(t)).flatten().filter(|p| t.dims() == p.dims())
    }
}

impl Backend for CpuBackend {
    type Buffer = CpuBuffer;

    fn device_name(&self) -> String {
        format!("cpu ({} threads)", rayon::current_num_threads())
    }

    fn upload_weight(&self, t: &Tensor) -> Result<CpuBuffer> {
        match t.rank() {
            1 => Ok(CpuBuffer::F32(RefCell::new(t.to_dtype(DType::F32)?.to_vec1::<f32>()?))),
            2 => match self.packed_twin(t) {
                Some(p) => Ok(CpuBuffer::Packed(p)),
                None => Ok(CpuBuffer::Matrix(t.contiguous()?)),
            },
            r => Err(be(format!("weights must be 1-D or 2-D, got rank {r}"))),
        }
    }

    fn upload_weight_rows(&self, parts: &[&Tensor]) -> Result<CpuBuffer> {
        if let [one] = parts {
            return self.upload_weight(one);
        }
        let twins: Option<Vec<_>> = parts.iter().map(|t| self.packed_twin(t)).collect();
        if let Some(p) = twins.and_then(|t| quant::PackedMatrix::cat_rows(&t.iter().map(|p| &**p).collect::<Vec<_>>()))
        {
            return Ok(CpuBuffer::Packed(Arc::new(p)));
        }
        self.upload_weight(&Tensor::cat(parts, 0)?)
    }

    fn alloc_f32(&self, len: usize) -> Result<CpuBuffer> {
        Ok(CpuBuffer::F32(RefCell::new(vec![0.0; len])))
    }

    fn upload_f32(&self, data: &[f32]) -> Result<CpuBuffer> {
        Ok(CpuBuffer::F32(RefCell::new(data.to_vec())))
    }

    fn upload_u32(&self, data: &[u32]) -> Result<CpuBuffer> {
        Ok(CpuBuffer::U32(RefCell::new(data.to_vec())))
    }

    fn alloc_u32_output(&self, len: usize) -> Result<CpuBuffer> {
        Ok(CpuBuffer::U32(RefCell::new(vec![0; len])))
    }

    fn download_f32(&self, buf: &CpuBuffer) -> Result<Vec<f32>> {
        Ok(buf.f32()?.clone())
    }

    fn run(&self, op: Op<'_, CpuBuffer>) -> Result<()> {
        match op {
            Op::Embedding { table: CpuBuffer::Packed(p), ids, out, num_tokens, hidden, scale } => {
                quant::embedding(p, &ids.u32()?, &mut out.f32_mut()?, num_tokens, hidden, scale)
            }
            Op::Embedding { table, ids, out, num_tokens, hidden, scale } => {
                elementwise::embedding(table, &ids.u32()?, &mut out.f32_mut()?, num_tokens, hidden, scale)
            }
            Op::RmsNorm { x, weight, out, rows, hidden, eps } => {
                elementwise::rms_norm(&x.f32()?, &weight.f32()?, &mut out.f32_mut()?, rows, hidden, eps)
            }
            Op::AddRmsNorm { x, residual, weight, out, rows, hidden, eps } => {
                let mut res = residual.f32_mut()?;
                elementwise::add_in_place(&mut res, &x.f32()?, rows * hidden)?;
                elementwise::rms_norm(&res, &weight.f32()?, &mut out.f32_mut()?, rows, hidden, eps)
            }
            Op::MatMul { x, w, bias, out, m, k, n } => {
                let bias = match bias {
                    Some(b) => Some(b.f32()?),
                    None => None,
                };
                if let CpuBuffer::Packed(p) = w {
                    return quant::matmul(
                        &x.f32()?,
                        p,
                        bias.as_deref().map(|v| v.as_slice()),
                        &mut out.f32_mut()?,
                        m,
                        k,
                        n,
                    );
                }
                matmul::matmul(
                    &x.f32()?,
                    w.matrix()?,
                    bias.as_deref().map(|v| v.as_slice()),
                    &mut out.f32_mut()?,
                    m,
                    k,
                    n,
                )
            }
            Op::RopeWriteKv { io, num_tokens, num_heads, num_kv_heads, head_dim, block_size: _, mscale } => {
                elementwise::rope_write_kv(
                    &io.qkv.f32()?,
                    &io.positions.u32()?,
                    &io.inv_freq.f32()?,
                    &mut io.q_out.f32_mut()?,
                    &mut io.k_cache.f32_mut()?,
                    &mut io.v_cache.f32_mut()?,
                    &io.slot_mapping.u32()?,
                    num_tokens,
                    &elementwise::QkvShape { heads: num_heads, kv_heads: num_kv_heads, head_dim },
                    mscale,
                )
            }
            Op::HeadRmsNorm { qkv, q_weight, k_weight, num_tokens, num_heads, num_kv_heads, head_dim, eps } => {
                elementwise::head_rms_norm(
                    &mut qkv.f32_mut()?,
                    &q_weight.f32()?,
                    &k_weight.f32()?,
                    num_tokens,
                    &elementwise::QkvShape { heads: num_heads, kv_heads: num_kv_heads, head_dim },
                    eps,
                )
            }
            Op::GatedAct { gate_up, out, rows, width, act } => {
                elementwise::gated_act(&gate_up.f32()?, &mut out.f32_mut()?, rows, width, act)
            }
            Op::SoftCap { x, rows, width, cap } => elementwise::soft_cap(&mut x.f32_mut()?, rows * width, cap),
            Op::PagedAttention {
                q,
                k_cache,
                v_cache,
                out,
                meta,
                num_heads,
                num_kv_heads,
                head_dim,
                block_size,
                scale,
                window,
                softcap,
                sinks,
            } => {
                let (k, v) = (k_cache.f32()?, v_cache.f32()?);
                let sinks = sinks.map(|s| s.f32()).transpose()?;
                let block_elems = (block_size * num_kv_heads * head_dim).max(1);
                meta.check_op(block_size, k.len().min(v.len()) / block_elems)?;
                attention::paged_attention(
                    &q.f32()?,
                    &k,
                    &v,
                    &mut out.f32_mut()?,
                    &attention::Shape { num_heads, num_kv_heads, head_dim, block_size, scale, window, softcap },
                    sinks.as_ref().map(|s| &s[..]),
                    meta.host_query_start,
                    meta.host_context_lens,
                    meta.host_block_tables,
                    meta.max_blocks_per_seq,
                )
            }
            Op::GatherRows { x, rows, out, num_rows, width } => {
                elementwise::gather_rows(&x.f32()?, &rows.u32()?, &mut out.f32_mut()?, num_rows, width)
            }
            Op::MaskLogits { logits, mask, rows, vocab } => {
                elementwise::mask_logits(&mut logits.f32_mut()?, &mask.u32()?, rows, vocab)
            }
            Op::MoeRoute { logits, ids, weights, rows, experts, top_k, renormalize } => moe::route(
                &logits.f32()?,
                &mut ids.u32_mut()?,
                &mut weights.f32_mut()?,
                [rows, experts, top_k],
                renormalize,
            ),
            Op::MoeBias { x, bias, tiles, width } => moe::bias(&mut x.f32_mut()?, &bias.f32()?, tiles, width),
            Op::MoeAlign { ids, tiles, pairs, experts, first_expert } => {
                moe::align(&ids.u32()?, tiles, pairs, [experts, first_expert])
            }
            Op::MoeMatMul { x, w, tiles, input, out, k, n } => {
                moe::matmul(&x.f32()?, w.matrix()?, tiles, input, &mut out.f32_mut()?, [k, n])
            }
            Op::MoeCombine { y, tiles, weights, out, rows, top_k, width } => {
                moe::combine(&y.f32()?, &tiles.slot.u32()?, &weights.f32()?, &mut out.f32_mut()?, [rows, top_k, width])
            }
        }
    }
}
