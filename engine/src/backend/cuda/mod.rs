//! The CUDA backend: every `Op` on NVIDIA GPUs, with the same portable kernel sources as the SPIR-V build
//! (`kernels/src/cl/*.cl` + `prelude.h`, compiled at run time by NVRTC through the prelude's CUDA side, PTX cached
//! on disk by source hash and GPU architecture) and matrix multiplies on cuBLAS (`cublasGemmEx`, f32 accumulation).
//!
//! The driver, NVRTC and cuBLAS are loaded when the backend is created (cudarc's dynamic loading), so a build needs
//! no CUDA toolkit and hosts without CUDA run the CPU backend unchanged; a missing library or GPU is an error value.
//! One context and one in-order stream (the context's default stream): ops run in submission order and the host
//! waits only in `download_f32`. Activations and the KV cache are f32, like the CPU and OpenCL backends; 2-D weights
//! stay in their dtype; 1-D weights are f32.
//!
//! Boundary: kernel argument layouts live in `kernels/src/cl/*.cl`; `ops.rs` and `attention.rs` launch them exactly
//! as the OpenCL backend does (OpenCL ND-ranges mapped onto CUDA grids by `host::grid_dims`).

mod attention;
mod buffer;
pub mod host;
mod kernels;
mod ops;
mod profile;

use std::cell::RefCell;
use std::sync::{Arc, Mutex};

use cudarc::cublas::{result as blas, sys as bsys};
use cudarc::driver::{result, CudaContext, CudaStream};

pub use buffer::{Contents, CuBuffer};
use buffer::Pool;
use kernels::Kernels;

use super::{Backend, Op, WeightDType};
use crate::backend::cpu::be;
use crate::error::Result;

/// Block size each portable kernel is launched with (the same sizes the OpenCL backend uses; the kernels' local
/// arrays are sized by these constants).
pub(crate) fn work_group(kernel: &str) -> usize {
    use rserve_kernels::launch::*;
    match kernel {
        "rms_norm" | "add_rms_norm" => ROW_WG,
        "paged_attention_decode" => ATTN_WG,
        "paged_attention_prefill" => PREFILL_WG,
        k if k.starts_with("matmul_rows") => GEMV_WG,
        k if k.starts_with("matmul_tiled") => GEMM_WG,
        _ => ELEM_WG,
    }
}

/// An NVIDIA GPU with rserve's kernels loaded on it.
pub struct CudaBackend {
    // Field order is drop order: kernels, cached plans and pooled memory go before the context.
    kernels: Kernels,
    attention_plan: RefCell<Option<attention::Plan>>,
    profile: Mutex<Option<profile::Profile>>,
    pool: Arc<Pool>,
    blas: bsys::cublasHandle_t,
    stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
    name: String,
    total_mem: u64,
    cc: (i32, i32),
}

// SAFETY: the backend is used by one thread at a time (the engine thread owns it); the context is bound to the
// calling thread before every driver call, and the cuBLAS handle is only used through `&self` on that thread.
unsafe impl Send for CudaBackend {}

impl CudaBackend {
    /// Opens GPU `ordinal`, loads cuBLAS and builds (or loads from the PTX cache) every kernel module.
    pub fn new(ordinal: usize) -> Result<Self> {
        // SAFETY: only probes whether the shared library can be opened (dlopen + dlclose).
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(be("cuda: the CUDA driver (libcuda.so) could not be loaded: no NVIDIA GPU driver on this host"));
        }
        // cudarc panics when a library cannot be loaded: turn that into an error value.
        let ctx = std::panic::catch_unwind(|| CudaContext::new(ordinal))
            .map_err(|_| be("cuda: the CUDA driver (libcuda.so) could not be loaded: no NVIDIA GPU driver on this host"))?
            .map_err(|e| be(format!("cuda: opening GPU {ordinal}: {e:?}")))?;
        let name = ctx.name().map_err(|e| be(format!("cuda: device name: {e:?}")))?;
        let cc = ctx.compute_capability().map_err(|e| be(format!("cuda: compute capability: {e:?}")))?;
        let total_mem = ctx.total_mem().map_err(|e| be(format!("cuda: memory size: {e:?}")))? as u64;
        let stream = ctx.default_stream();
        let blas = std::panic::catch_unwind(blas::create_handle)
            .map_err(|_| be("cuda: cuBLAS (libcublas.so) could not be loaded"))?
            .map_err(|e| be(format!("cuda: creating a cuBLAS handle: {e:?}")))?;
        // SAFETY: a fresh handle bound to the context's stream.
        unsafe { blas::set_stream(blas, stream.cu_stream() as _) }.map_err(|e| be(format!("cuda: cuBLAS stream: {e:?}")))?;
        let t0 = std::time::Instant::now();
        let kernels = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| Kernels::build(&ctx, cc)))
            .map_err(|_| be("cuda: NVRTC (libnvrtc.so) could not be loaded"))??;
        tracing::info!(
            "cuda: {name} (sm_{}{}), kernels ready in {:.2} s ({} modules compiled by NVRTC, the rest from the PTX cache {})",
            cc.0,
            cc.1,
            t0.elapsed().as_secs_f64(),
            kernels.compiled,
            host::ptx_cache_dir().display()
        );
        Ok(Self {
            kernels,
            attention_plan: RefCell::new(None),
            profile: Mutex::new(profile::Profile::from_env()),
            pool: Arc::new(Pool::default()),
            blas,
            stream,
            ctx,
            name,
            total_mem,
            cc,
        })
    }

    /// The GPU's memory in bytes.
    pub fn memory_bytes(&self) -> u64 {
        self.total_mem
    }

    /// Compute capability `(major, minor)`.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.cc
    }

    /// Waits until every submitted op has finished (for benchmarks and tests).
    pub fn synchronize(&self) -> Result<()> {
        self.bind()?;
        self.stream.synchronize().map_err(|e| be(format!("cuda: synchronize: {e:?}")))
    }

    fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(|e| be(format!("cuda: binding the context: {e:?}")))
    }

    fn upload_bytes(&self, bytes: &[u8], contents: Contents) -> Result<CuBuffer> {
        self.bind()?;
        let buf = CuBuffer::new(&self.pool, bytes.len(), contents)?;
        if !bytes.is_empty() {
            // SAFETY: the buffer holds at least `bytes.len()` bytes; the copy is ordered after earlier work on the
            // legacy default stream, so a pooled buffer is not overwritten while an earlier op reads it.
            unsafe { result::memcpy_htod_sync(buf.ptr(), bytes) }.map_err(|e| be(format!("cuda: upload: {e:?}")))?;
        }
        Ok(buf)
    }

    fn profile(&self) -> Option<std::sync::MutexGuard<'_, Option<profile::Profile>>> {
        self.profile.lock().ok().filter(|p| p.is_some())
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        if self.bind().is_ok() {
            let _ = self.stream.synchronize();
            *self.attention_plan.borrow_mut() = None;
            // SAFETY: the handle was created by this backend and is not used after this point.
            unsafe { blas::destroy_handle(self.blas).ok() };
            self.pool.release_all();
        }
    }
}

fn as_bytes<T: Copy>(v: &[T]) -> &[u8] {
    // SAFETY: plain-old-data slices (f32, u32, u16) viewed as bytes.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

fn op_name<B>(op: &Op<'_, B>) -> &'static str {
    match op {
        Op::Embedding { .. } => "embedding",
        Op::RmsNorm { .. } => "rms_norm",
        Op::AddRmsNorm { .. } => "add_rms_norm",
        Op::MatMul { .. } => "matmul",
        Op::Rope { .. } => "rope",
        Op::SiluMul { .. } => "silu_mul",
        Op::WriteKv { .. } => "write_kv",
        Op::PagedAttention { .. } => "attention",
        Op::GatherRows { .. } => "gather_rows",
    }
}

impl Backend for CudaBackend {
    type Buffer = CuBuffer;

    fn device_name(&self) -> String {
        format!("cuda: {} (sm_{}{})", self.name, self.cc.0, self.cc.1)
    }

    fn upload_weight(&self, t: &candle_core::Tensor) -> Result<CuBuffer> {
        use candle_core::DType;
        match t.rank() {
            1 => self.upload_f32(&t.to_dtype(DType::F32)?.to_vec1::<f32>()?),
            2 => {
                let (rows, cols) = t.dims2()?;
                let flat = t.flatten_all()?;
                let (dtype, v16, v32) = match t.dtype() {
                    DType::F32 => (WeightDType::F32, Vec::new(), flat.to_vec1::<f32>()?),
                    DType::BF16 => {
                        (WeightDType::BF16, flat.to_vec1::<half::bf16>()?.iter().map(|x| x.to_bits()).collect(), Vec::new())
                    }
                    DType::F16 => {
                        (WeightDType::F16, flat.to_vec1::<half::f16>()?.iter().map(|x| x.to_bits()).collect(), Vec::new())
                    }
                    other => return Err(be(format!("cuda: weights of dtype {other:?} are not supported"))),
                };
                let bytes = if dtype == WeightDType::F32 { as_bytes(&v32) } else { as_bytes(&v16) };
                self.upload_bytes(bytes, Contents::Matrix { dtype, rows, cols })
            }
            r => Err(be(format!("weights must be 1-D or 2-D, got rank {r}"))),
        }
    }

    fn alloc_f32(&self, len: usize) -> Result<CuBuffer> {
        self.bind()?;
        let b = CuBuffer::new(&self.pool, len * 4, Contents::F32 { len })?;
        // SAFETY: the fill covers the buffer, on the backend's stream (ordered after earlier users of the memory).
        unsafe { result::memset_d8_async(b.ptr(), 0, b.bytes(), self.stream.cu_stream()) }
            .map_err(|e| be(format!("cuda: zero-filling a buffer: {e:?}")))?;
        Ok(b)
    }

    fn upload_f32(&self, data: &[f32]) -> Result<CuBuffer> {
        self.upload_bytes(as_bytes(data), Contents::F32 { len: data.len() })
    }

    fn upload_u32(&self, data: &[u32]) -> Result<CuBuffer> {
        self.upload_bytes(as_bytes(data), Contents::U32 { host: data.to_vec() })
    }

    fn download_f32(&self, buf: &CuBuffer) -> Result<Vec<f32>> {
        self.bind()?;
        let len = buf.f32_len().ok_or_else(|| be("download_f32: expected an f32 buffer"))?;
        let mut out = vec![0f32; len];
        if len > 0 {
            // SAFETY: a blocking copy of exactly `len` floats out of a buffer that holds them; the legacy default
            // stream runs every earlier op first.
            unsafe { result::memcpy_dtoh_sync(&mut out, buf.ptr()) }.map_err(|e| be(format!("cuda: download: {e:?}")))?;
        }
        if let Some(mut p) = self.profile() {
            if let Some(p) = p.as_mut() {
                p.step_done();
            }
        }
        Ok(out)
    }

    fn run(&self, op: Op<'_, CuBuffer>) -> Result<()> {
        self.bind()?;
        let mut prof = self.profile();
        if let Some(p) = prof.as_mut().and_then(|g| g.as_mut()) {
            let (tokens, seqs) = match &op {
                Op::Embedding { num_tokens, .. } => (Some(*num_tokens), None),
                Op::GatherRows { num_rows, .. } => (None, Some(*num_rows)),
                _ => (None, None),
            };
            p.note_shape(tokens, seqs);
            p.begin(&self.ctx, &self.stream, op_name(&op));
        }
        let r = match op {
            Op::Embedding { table, ids, out, num_tokens, hidden } => ops::embedding(self, table, ids, out, num_tokens, hidden),
            Op::RmsNorm { x, weight, out, rows, hidden, eps } => ops::rms_norm(self, x, None, weight, out, rows, hidden, eps),
            Op::AddRmsNorm { x, residual, weight, out, rows, hidden, eps } => {
                ops::rms_norm(self, x, Some(residual), weight, out, rows, hidden, eps)
            }
            Op::MatMul { x, w, bias, out, m, k, n } => ops::matmul(self, x, w, bias, out, m, k, n),
            Op::Rope { x, positions, inv_freq, num_tokens, num_heads, head_dim } => {
                ops::rope(self, x, positions, inv_freq, num_tokens, num_heads, head_dim)
            }
            Op::SiluMul { gate, up, out, len } => ops::silu_mul(self, gate, up, out, len),
            Op::WriteKv { k, v, k_cache, v_cache, slot_mapping, num_tokens, num_kv_heads, head_dim, block_size: _ } => {
                ops::write_kv(self, k, v, k_cache, v_cache, slot_mapping, num_tokens, num_kv_heads * head_dim)
            }
            Op::PagedAttention { q, k_cache, v_cache, out, meta, num_heads, num_kv_heads, head_dim, block_size, scale } => {
                let shape = attention::Shape { num_heads, num_kv_heads, head_dim, block_size, scale };
                attention::paged_attention(self, q, k_cache, v_cache, out, meta, &shape)
            }
            Op::GatherRows { x, rows, out, num_rows, width } => ops::gather_rows(self, x, rows, out, num_rows, width),
        };
        if let Some(p) = prof.as_mut().and_then(|g| g.as_mut()) {
            p.end(&self.ctx, &self.stream);
        }
        r
    }
}
