//! The CPU backend: the reference implementation of every `Op`, on host memory.
//!
//! Activations are f32 vectors behind `RefCell` (ops write through shared references, like device memory); the KV cache
//! is f32, bf16 or f16 (`--kv-cache-dtype`; `auto`: the compute dtype). 2-D weights stay candle tensors in their dtype:
//! 16-bit ones multiply through `matmul16` (widened in registers), f32 ones through `gemv` or candle's GEMM; a fused
//! projection keeps its parts (`CpuBuffer::Parts`) rather than a stacked copy. 1-D weights (norms, biases) are kept as
//! f32. Matmuls, elementwise ops and attention are parallelised with rayon (the pool `--cpu-threads` sizes). Weights
//! loaded from a GGUF file in `Q8_0`, `Q4_0`, `Q4_1`, `Q4_K`, `Q5_K` or `Q6_K` stay in their block layout and multiply
//! with integer dot products (`quant`).

mod attention;
mod elementwise;
mod encoder;
mod gemv;
mod matmul;
mod matmul16;
mod moe;
pub mod quant;
mod sampling;

use std::cell::{Ref, RefCell, RefMut};
use std::sync::{Arc, OnceLock};

use candle_core::{DType, Tensor};
use half::{bf16, f16};

use super::{Backend, Op, WeightDType};
use crate::error::{BackendError, Result};

/// A host allocation of the CPU backend.
#[derive(Debug)]
pub enum CpuBuffer {
    F32(RefCell<Vec<f32>>),
    /// Indices: uploaded, or written by an op (`Backend::alloc_u32_output`).
    U32(RefCell<Vec<u32>>),
    /// A 2-D weight matrix `[rows, cols]` in its weight dtype.
    Matrix(Tensor),
    /// A fused projection: 2-D parts stacked by rows, each kept where the loader put it (no stacked copy, so the
    /// model's peak memory at load is its weights, not weights plus fused copies).
    Parts(StackedRows),
    /// A 16-bit KV cache.
    Bf16(RefCell<Vec<bf16>>),
    F16(RefCell<Vec<f16>>),
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
            CpuBuffer::Parts(p) => p.joined(),
            _ => Err(be("expected a weight matrix")),
        }
    }

    /// A weight's row blocks: one matrix, or a fused projection's parts.
    fn row_parts(&self) -> Result<&[Tensor]> {
        match self {
            CpuBuffer::Matrix(t) => Ok(std::slice::from_ref(t)),
            CpuBuffer::Parts(p) => Ok(&p.parts),
            _ => Err(be("expected a weight matrix")),
        }
    }
}

/// 2-D parts stacked by rows.
#[derive(Debug)]
pub struct StackedRows {
    parts: Vec<Tensor>,
    /// The stacked matrix, made on first use by an op that needs one matrix (routed experts).
    joined: OnceLock<Tensor>,
}

impl StackedRows {
    fn joined(&self) -> Result<&Tensor> {
        if let Some(t) = self.joined.get() {
            return Ok(t);
        }
        let t = Tensor::cat(&self.parts, 0)?;
        Ok(self.joined.get_or_init(|| t))
    }
}

/// `len` zero values of a 16-bit type, from zeroed memory: pages are committed only as the cache fills, as for
/// `vec![0f32; n]` (an explicit fill would make the whole KV budget resident at start-up).
fn zeroed_16<T: bytemuck::Pod>(len: usize) -> Vec<T> {
    assert!(std::mem::size_of::<T>() == 2 && std::mem::align_of::<T>() == 2, "zeroed_16 is for 16-bit types");
    let mut v = std::mem::ManuallyDrop::new(vec![0u16; len]);
    // SAFETY: `T` has the size and alignment of u16 (asserted), so the allocation's layout is the same, and zero bits
    // are a valid `T` (`Pod`); the u16 vector is not dropped, its allocation now belongs to the returned one.
    unsafe { Vec::from_raw_parts(v.as_mut_ptr().cast::<T>(), v.len(), v.capacity()) }
}

fn borrow<T>(c: &RefCell<Vec<T>>) -> Result<Ref<'_, Vec<T>>> {
    c.try_borrow().map_err(|_| be("KV cache buffer is being written"))
}

fn borrow_mut<T>(c: &RefCell<Vec<T>>) -> Result<RefMut<'_, Vec<T>>> {
    c.try_borrow_mut().map_err(|_| be("KV cache buffer is aliased by another argument"))
}

pub(crate) fn be(msg: impl Into<String>) -> BackendError {
    BackendError::Device(msg.into())
}

/// The CPU backend (the rayon pool it runs in does the threading: the engine's `--cpu-threads` pool).
#[derive(Debug, Clone)]
pub struct CpuBackend {
    /// Keep weights that have a packed twin (`quant::lookup`) packed.
    packed: bool,
    /// `--kv-cache-dtype` when not `auto` (None: the compute dtype).
    kv_dtype: Option<WeightDType>,
}

impl Default for CpuBackend {
    /// The reference: every weight in its dequantized type (what the server runs with `--cpu-dequantize-weights`).
    /// The server's default keeps GGUF weights packed (`with_packed_weights`, `EngineConfig::cpu_packed_weights`):
    /// the packed path quantizes activations, so its logits differ from the f32 reference the golden tests hold the
    /// CPU backend to, and a backend built directly (tests, benchmarks) stays the reference unless asked.
    fn default() -> Self {
        CpuBackend { packed: false, kv_dtype: None }
    }
}

impl CpuBackend {
    pub fn new() -> Self {
        Self::default()
    }

    /// A backend that keeps GGUF `Q8_0` / `Q4_0` / `Q4_1` / k-quant weights packed (`packed`) or multiplies every
    /// weight in its dequantized type (the reference).
    pub fn with_packed_weights(packed: bool) -> Self {
        CpuBackend { packed, kv_dtype: None }
    }

    /// This backend with its KV cache in `dtype` whatever the compute dtype (`--kv-cache-dtype`); None: `auto`.
    pub fn with_kv_cache_dtype(mut self, dtype: Option<WeightDType>) -> Self {
        self.kv_dtype = dtype;
        self
    }

    fn packed_twin(&self, t: &Tensor) -> Option<Arc<quant::PackedMatrix>> {
        self.packed.then(|| quant::lookup(t)).flatten().filter(|p| t.dims() == p.dims())
    }
}

impl Backend for CpuBackend {
    type Buffer = CpuBuffer;
    type Recording = crate::NoRecording;

    fn device_name(&self) -> String {
        format!("cpu ({} threads)", rayon::current_num_threads())
    }

    fn upload_weight(&self, t: &Tensor) -> Result<CpuBuffer> {
        match t.rank() {
            1 => Ok(CpuBuffer::F32(RefCell::new(t.to_dtype(DType::F32)?.to_vec1::<f32>()?))),
            2 => match self.packed_twin(t) {
                Some(p) => Ok(CpuBuffer::Packed(p)),
                None if quant::is_placeholder(t) => Err(be(format!(
                    "a {:?} weight was loaded as GGUF blocks only but reached the backend without them (changed after \
                     loading, or the backend keeps no packed weights)",
                    t.dims()
                ))),
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
        if let Some(t) = parts.iter().find(|t| quant::is_placeholder(t)) {
            // Its twin cannot join the others' (a part without one): it must not become zeros.
            return Err(be(format!(
                "a {:?} weight loaded as GGUF blocks only is stacked with parts that are not (the loader keeps a \
                 fused projection's parts all packed or all dequantized)",
                t.dims()
            )));
        }
        // A dense model's fused projections (q/k/v, gate/up) keep their parts; the many experts of a mixture are
        // stacked once (their op takes one matrix).
        if parts.len() <= 3 && parts.iter().all(|t| t.rank() == 2) {
            let parts = parts.iter().map(|t| t.contiguous()).collect::<candle_core::Result<Vec<_>>>()?;
            return Ok(CpuBuffer::Parts(StackedRows { parts, joined: OnceLock::new() }));
        }
        self.upload_weight(&Tensor::cat(parts, 0)?)
    }

    fn kv_cache_dtype(&self, compute: WeightDType) -> WeightDType {
        // vLLM's `auto`: the compute dtype (f32 unless `--dtype` asks for 16 bits on the CPU).
        self.kv_dtype.unwrap_or(compute)
    }

    fn alloc_kv_cache(&self, len: usize, dtype: WeightDType) -> Result<CpuBuffer> {
        Ok(match dtype {
            WeightDType::F32 => CpuBuffer::F32(RefCell::new(vec![0.0; len])),
            WeightDType::BF16 => CpuBuffer::Bf16(RefCell::new(zeroed_16(len))),
            WeightDType::F16 => CpuBuffer::F16(RefCell::new(zeroed_16(len))),
        })
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

    fn download_u32(&self, buf: &CpuBuffer, len: usize) -> Result<Vec<u32>> {
        let v = buf.u32()?;
        v.get(..len).map(<[u32]>::to_vec).ok_or_else(|| be(format!("download_u32: {len} of {} values", v.len())))
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
                matmul::matmul_parts(
                    &x.f32()?,
                    w.row_parts()?,
                    bias.as_deref().map(|v| v.as_slice()),
                    &mut out.f32_mut()?,
                    m,
                    k,
                    n,
                )
            }
            Op::RopeWriteKv { io, qk_norm, num_tokens, num_heads, num_kv_heads, head_dim, block_size: _, mscale } => {
                let shape = elementwise::QkvShape { heads: num_heads, kv_heads: num_kv_heads, head_dim };
                let (qkv, pos, inv_freq) = (io.qkv.f32()?, io.positions.u32()?, io.inv_freq.f32()?);
                let (mut q_out, slots) = (io.q_out.f32_mut()?, io.slot_mapping.u32()?);
                let weights = match &qk_norm {
                    Some(n) => Some((n.q_weight.f32()?, n.k_weight.f32()?, n.eps)),
                    None => None,
                };
                let norm = weights.as_ref().map(|(wq, wk, eps)| elementwise::HeadNorm { wq, wk, eps: *eps });
                macro_rules! write {
                    ($k:expr, $v:expr) => {
                        elementwise::rope_write_kv(
                            &qkv,
                            &pos,
                            &inv_freq,
                            &mut q_out,
                            $k,
                            $v,
                            &slots,
                            num_tokens,
                            &shape,
                            mscale,
                            norm.as_ref(),
                        )
                    };
                }
                match (io.k_cache, io.v_cache) {
                    (CpuBuffer::Bf16(k), CpuBuffer::Bf16(v)) => write!(&mut borrow_mut(k)?, &mut borrow_mut(v)?),
                    (CpuBuffer::F16(k), CpuBuffer::F16(v)) => write!(&mut borrow_mut(k)?, &mut borrow_mut(v)?),
                    (k, v) => write!(&mut k.f32_mut()?, &mut v.f32_mut()?),
                }
            }
            Op::GatedAct { gate_up, out, rows, width, act } => {
                elementwise::gated_act(&gate_up.f32()?, &mut out.f32_mut()?, rows, width, act)
            }
            Op::SoftCap { x, rows, width, cap } => elementwise::soft_cap(&mut x.f32_mut()?, rows * width, cap),
            Op::PagedAttention { q, k_cache, v_cache, out, meta, shape, sinks } => {
                let sinks = sinks.map(|s| s.f32()).transpose()?;
                let block_size = shape.block_size;
                let block_elems = (block_size * shape.num_kv_heads * shape.head_dim).max(1);
                let (q, mut out) = (q.f32()?, out.f32_mut()?);
                macro_rules! attend {
                    ($k:expr, $v:expr) => {{
                        let (k, v) = ($k, $v);
                        meta.check_op(block_size, k.len().min(v.len()) / block_elems)?;
                        attention::paged_attention(
                            &q,
                            &k,
                            &v,
                            &mut out,
                            &shape,
                            sinks.as_ref().map(|s| &s[..]),
                            meta.host_query_start,
                            meta.host_context_lens,
                            meta.host_block_tables,
                            meta.max_blocks_per_seq,
                        )
                    }};
                }
                match (k_cache, v_cache) {
                    (CpuBuffer::Bf16(k), CpuBuffer::Bf16(v)) => attend!(borrow(k)?, borrow(v)?),
                    (CpuBuffer::F16(k), CpuBuffer::F16(v)) => attend!(borrow(k)?, borrow(v)?),
                    (k, v) => attend!(k.f32()?, v.f32()?),
                }
            }
            Op::LayerNorm { x, residual, weight, bias, out, rows, hidden, eps } => {
                let residual = residual.map(|r| r.f32()).transpose()?;
                encoder::layer_norm(
                    &x.f32()?,
                    residual.as_deref().map(|v| v.as_slice()),
                    &weight.f32()?,
                    &bias.f32()?,
                    &mut out.f32_mut()?,
                    rows,
                    hidden,
                    eps,
                )
            }
            Op::Gelu { x, out, len } => encoder::gelu(&x.f32()?, &mut out.f32_mut()?, len),
            Op::EncoderAttention { qkv, query_start, out, num_seqs, num_tokens, num_heads, head_dim, scale } => {
                encoder::encoder_attention(
                    &qkv.f32()?,
                    &query_start.u32()?,
                    &mut out.f32_mut()?,
                    num_seqs,
                    num_tokens,
                    num_heads,
                    head_dim,
                    scale,
                )
            }
            Op::GatherRows { x, rows, out, num_rows, width } => {
                elementwise::gather_rows(&x.f32()?, &rows.u32()?, &mut out.f32_mut()?, num_rows, width)
            }
            Op::FeedTokens { ids, prev, from, count, prev_len } => {
                elementwise::feed_tokens(&mut ids.u32_mut()?, &prev.u32()?, &from.u32()?, count, prev_len)
            }
            Op::MaskLogits { logits, mask, rows, vocab } => {
                elementwise::mask_logits(&mut logits.f32_mut()?, &mask.u32()?, rows, vocab)
            }
            Op::AdjustLogits { logits, edits, values, count, rows, vocab } => {
                sampling::adjust_logits(&mut logits.f32_mut()?, &edits.u32()?, &values.f32()?, [count, rows, vocab])
            }
            Op::ArgmaxRows { x, out, rows, width } => {
                sampling::argmax_rows(&x.f32()?, &mut out.u32_mut()?, rows, width)
            }
            Op::SampleRows { logits, params, ids, rows, vocab } => {
                sampling::sample_rows(&logits.f32()?, &params.u32()?, &mut ids.u32_mut()?, rows, vocab)
            }
            Op::RowLogprobs { logits, ids, want, values, top_ids, rows, vocab } => sampling::row_logprobs(
                &logits.f32()?,
                &ids.u32()?,
                &want.u32()?,
                &mut values.f32_mut()?,
                &mut top_ids.u32_mut()?,
                [rows, vocab],
            ),
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
            Op::MoePairGateUp { x, w, bias, ids, out, tokens, top_k, k, width, held, act } => {
                let (x, bias, ids) = (x.f32()?, bias.map(|b| b.f32()).transpose()?, ids.u32()?);
                let i = moe::PairInputs { x: &x, w: w.matrix()?, bias: bias.as_ref().map(|b| &b[..]), ids: &ids, held };
                moe::pair_gate_up(&i, &mut out.f32_mut()?, [tokens, top_k, k, width], act)
            }
            Op::MoePairDown { x, w, bias, ids, weights, out, tokens, top_k, k, n, held } => {
                let (x, bias, ids) = (x.f32()?, bias.map(|b| b.f32()).transpose()?, ids.u32()?);
                let i = moe::PairInputs { x: &x, w: w.matrix()?, bias: bias.as_ref().map(|b| &b[..]), ids: &ids, held };
                moe::pair_down(&i, &weights.f32()?, &mut out.f32_mut()?, [tokens, top_k, k, n])
            }
        }
    }
}
