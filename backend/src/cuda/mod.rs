//! The CUDA backend: every `Op` on NVIDIA GPUs, with the same portable kernel sources as the SPIR-V build
//! (`kernels/src/cl/*.cl` + `prelude.h`, compiled at run time by NVRTC through the prelude's CUDA side, PTX cached
//! on disk by source hash and GPU architecture) and matrix multiplies on cuBLAS (`blas.rs`, the op layer's
//! `vendor_matmul` hook).
//!
//! The driver, NVRTC and cuBLAS are loaded when the backend is created (cudarc's dynamic loading), so a build needs
//! no CUDA toolkit and hosts without CUDA run the CPU backend unchanged; a missing library or GPU is an error value.
//! One context and one in-order stream of its own (non-blocking, so it can be captured into CUDA graphs): ops and
//! copies run in submission order and the host waits only in downloads. Activations between ops are f32, except the
//! inputs of 16-bit matrix multiplies, which their producers write in the weight's type (`alloc_matmul_input`); the
//! KV cache is in the model's dtype; 2-D weights stay in their dtype; 1-D weights are f32. Which kernels an op
//! launches is decided by the device-neutral `backend::kernels` layer from `KernelTuning::cuda`.
//!
//! CUDA graphs (`begin_capture` / `end_capture` / `replay`, the backend's step recordings): while capturing, ops are
//! recorded, not run, and their memory comes from the graphs' own free list (`buffer.rs`); the attention work split
//! a graph read is handed to the graph, so it lives as long as the graph.

mod blas;
mod buffer;
pub mod host;
mod kernels;
mod profile;
mod readback;

use std::cell::{Cell, RefCell};
use std::sync::{Arc, Mutex};

use cudarc::cublas::{result as cublas, sys as bsys};
use cudarc::driver::{result, CudaContext, CudaStream};

use buffer::Pool;
pub use buffer::{Contents, CuBuffer};
use kernels::Kernels;

use super::kernels::{
    weight_data, with_matrix_bytes, AttnPlan, KernelDevice, KernelTuning, Launch, MatMulCall, PlanCache, TuningCell,
    WeightData,
};
use super::{Backend, Op, WeightDType};
use crate::cpu::be;
use crate::error::Result;

/// An NVIDIA GPU with rserve's kernels loaded on it.
pub struct CudaBackend {
    // Field order is drop order: kernels, cached plans and pooled memory go before the context.
    kernels: Kernels,
    plans: PlanCache<CuBuffer>,
    tuning: TuningCell,
    /// The per-op profile of eager steps (`set_op_profile`).
    profile: Mutex<Option<profile::Profile>>,
    /// cuBLAS' workspace, set explicitly so cuBLAS allocates nothing while a graph is captured.
    workspace: RefCell<Option<CuBuffer>>,
    capturing: Cell<bool>,
    pool: Arc<Pool>,
    /// Pinned host buffers of queued read-backs (`Backend::read_u32_later`).
    pinned: Arc<readback::PinnedPool>,
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
            return Err(be(
                "cuda: the CUDA driver (libcuda.so) could not be loaded: no NVIDIA GPU driver on this host",
            ));
        }
        // cudarc panics when a library cannot be loaded: turn that into an error value.
        let ctx = std::panic::catch_unwind(|| CudaContext::new(ordinal))
            .map_err(|_| {
                be("cuda: the CUDA driver (libcuda.so) could not be loaded: no NVIDIA GPU driver on this host")
            })?
            .map_err(|e| be(format!("cuda: opening GPU {ordinal}: {e:?}")))?;
        let name = ctx.name().map_err(|e| be(format!("cuda: device name: {e:?}")))?;
        let cc = ctx.compute_capability().map_err(|e| be(format!("cuda: compute capability: {e:?}")))?;
        let total_mem = ctx.total_mem().map_err(|e| be(format!("cuda: memory size: {e:?}")))? as u64;
        let stream = ctx.new_stream().map_err(|e| be(format!("cuda: creating a stream: {e:?}")))?;
        let blas = std::panic::catch_unwind(cublas::create_handle)
            .map_err(|_| be("cuda: cuBLAS (libcublas.so) could not be loaded"))?
            .map_err(|e| be(format!("cuda: creating a cuBLAS handle: {e:?}")))?;
        // SAFETY: a fresh handle bound to the context's stream.
        unsafe { cublas::set_stream(blas, stream.cu_stream() as _) }
            .map_err(|e| be(format!("cuda: cuBLAS stream: {e:?}")))?;
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
        let pool = Arc::new(Pool::default());
        const WORKSPACE: usize = 32 << 20;
        let workspace = CuBuffer::new(&pool, WORKSPACE, Contents::Raw)?;
        // SAFETY: the workspace outlives every cuBLAS call on this handle (it is released in Drop, after a sync).
        unsafe { bsys::cublasSetWorkspace_v2(blas, workspace.ptr() as *mut _, WORKSPACE) }
            .result()
            .map_err(|e| be(format!("cuda: cuBLAS workspace: {e:?}")))?;
        Ok(Self {
            kernels,
            plans: PlanCache::default(),
            tuning: TuningCell::new(KernelTuning::cuda(cc)),
            profile: Mutex::new(None),
            workspace: RefCell::new(Some(workspace)),
            capturing: Cell::new(false),
            pool,
            pinned: Arc::default(),
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
        self.copy_in(&buf, bytes)?;
        Ok(buf)
    }

    /// Host -> device copy into the start of `buf`, ordered on the backend's stream (after every earlier op, so a
    /// pooled buffer is not overwritten while an earlier op reads it). From pageable memory the driver stages the
    /// bytes before returning, so `bytes` may be dropped at once.
    fn copy_in(&self, buf: &CuBuffer, bytes: &[u8]) -> Result<()> {
        self.copy_in_at(buf, 0, bytes)
    }

    /// `copy_in` at byte `offset` of `buf`.
    fn copy_in_at(&self, buf: &CuBuffer, offset: usize, bytes: &[u8]) -> Result<()> {
        if offset + bytes.len() > buf.bytes() {
            return Err(be(format!("cuda: {} bytes do not fit a buffer of {}", bytes.len(), buf.bytes())));
        }
        if self.capturing.get() {
            return Err(be("cuda: a host copy cannot be part of a captured graph"));
        }
        if !bytes.is_empty() {
            // SAFETY: the buffer holds at least `offset + bytes.len()` bytes (checked above).
            unsafe { result::memcpy_htod_async(buf.ptr() + offset as u64, bytes, self.stream.cu_stream()) }
                .map_err(|e| be(format!("cuda: upload: {e:?}")))?;
        }
        Ok(())
    }

    /// Device -> host copy of the first `out.len()` elements of `buf`; waits for every earlier op.
    fn copy_out<T: Copy>(&self, buf: &CuBuffer, out: &mut [T]) -> Result<()> {
        self.bind()?;
        if std::mem::size_of_val(out) > buf.bytes() {
            return Err(be("cuda: download larger than its buffer"));
        }
        if !out.is_empty() {
            // SAFETY: `buf` holds at least `out`'s bytes (checked); the stream is synchronised before `out` is read.
            unsafe { result::memcpy_dtoh_async(out, buf.ptr(), self.stream.cu_stream()) }
                .map_err(|e| be(format!("cuda: download: {e:?}")))?;
        }
        self.stream.synchronize().map_err(|e| be(format!("cuda: download: {e:?}")))?;
        // A blocking read-back ends a step for the per-op profile.
        if let Some(mut p) = self.profile() {
            if let Some(p) = p.as_mut() {
                p.step_done();
            }
        }
        Ok(())
    }

    /// u32 buffers holding `parts`, laid out back to back (16-byte aligned) in one allocation, which is returned
    /// first and must outlive the views; `write_u32_packed` then refills them all with one host copy (a graph's
    /// per-step inputs).
    pub fn upload_u32_packed(&self, parts: &[&[u32]]) -> Result<(CuBuffer, Vec<CuBuffer>)> {
        let sizes: Vec<usize> = parts.iter().map(|p| (p.len() * 4).div_ceil(16) * 16).collect();
        let owner = CuBuffer::new(&self.pool, sizes.iter().sum::<usize>().max(16), Contents::Raw)?;
        let mut views = Vec::with_capacity(parts.len());
        let mut at = 0;
        for size in &sizes {
            views.push(CuBuffer::view(&owner, at, *size, Contents::U32 { len: 0, bound: 0 })?);
            at += size;
        }
        let mut refs: Vec<&mut CuBuffer> = views.iter_mut().collect();
        self.write_u32_packed(&owner, &mut refs, parts)?;
        Ok((owner, views))
    }

    /// Overwrites the views of `owner` made by `upload_u32_packed` with `parts` (host copies included), in one
    /// host -> device copy.
    pub fn write_u32_packed(&self, owner: &CuBuffer, views: &mut [&mut CuBuffer], parts: &[&[u32]]) -> Result<()> {
        if views.len() != parts.len() {
            return Err(be("write_u32_packed: one part per view"));
        }
        let mut bytes = vec![0u8; owner.bytes()];
        let mut end = 0;
        for (view, part) in views.iter_mut().zip(parts) {
            let off =
                view.ptr().checked_sub(owner.ptr()).map(|o| o as usize).filter(|o| o + view.bytes() <= owner.bytes());
            let off = off.ok_or_else(|| be("write_u32_packed: a view outside its owner"))?;
            view.set_u32(part)?;
            let src = as_bytes(part);
            bytes[off..off + src.len()].copy_from_slice(src);
            end = end.max(off + src.len());
        }
        self.bind()?;
        self.copy_in(owner, &bytes[..end])
    }

    /// Reads the first `len` values of a u32 buffer back (waits for every earlier op).
    /// `out[r] = argmax(x[r, ..width])` for `rows` rows on the device (lowest index among equal maxima, as the CPU
    /// sampler picks); `out` is a u32 buffer of at least `rows` values.
    pub fn argmax_rows(&self, x: &CuBuffer, rows: usize, width: usize, out: &CuBuffer) -> Result<()> {
        self.run(Op::ArgmaxRows { x, out, rows, width })
    }

    /// A KV-cache buffer of `dtype` holding `data` (rounded to nearest even for the 16-bit types): how the kernel
    /// checks fill a cache with known contents.
    pub fn upload_kv_cache(&self, data: &[f32], dtype: WeightDType) -> Result<CuBuffer> {
        match dtype {
            WeightDType::F32 => self.upload_f32(data),
            WeightDType::BF16 | WeightDType::F16 => {
                let bits = |x: f32| {
                    if dtype == WeightDType::F16 {
                        half::f16::from_f32(x).to_bits()
                    } else {
                        half::bf16::from_f32(x).to_bits()
                    }
                };
                let v: Vec<u16> = data.iter().map(|&x| bits(x)).collect();
                self.upload_bytes(as_bytes(&v), Contents::Half { dtype, len: data.len() })
            }
        }
    }

    /// Reads a KV-cache buffer back as f32 (waits for every earlier op).
    pub fn download_kv_cache(&self, buf: &CuBuffer) -> Result<Vec<f32>> {
        match *buf.contents() {
            Contents::Half { dtype, len } => {
                let mut raw = vec![0u16; len];
                self.copy_out(buf, &mut raw)?;
                Ok(match dtype {
                    WeightDType::F16 => raw.into_iter().map(|b| half::f16::from_bits(b).to_f32()).collect(),
                    _ => raw.into_iter().map(|b| half::bf16::from_bits(b).to_f32()).collect(),
                })
            }
            _ => self.download_f32(buf),
        }
    }

    /// A buffer of `bytes` zero bytes holding `contents`.
    fn alloc_zeroed(&self, bytes: usize, contents: Contents) -> Result<CuBuffer> {
        self.bind()?;
        let b = CuBuffer::new(&self.pool, bytes, contents)?;
        // SAFETY: the fill covers the buffer, on the backend's stream (ordered after earlier users of the memory).
        unsafe { result::memset_d8_async(b.ptr(), 0, b.bytes(), self.stream.cu_stream()) }
            .map_err(|e| be(format!("cuda: zero-filling a buffer: {e:?}")))?;
        Ok(b)
    }

    /// A u32 buffer of `len` zeros (an output a kernel fills, or counters a kernel keeps).
    pub fn alloc_u32(&self, len: usize) -> Result<CuBuffer> {
        self.upload_u32(&vec![0u32; len])
    }

    /// The kernel variant choices (tools and tests may replace them).
    pub fn tuning_cell(&self) -> &TuningCell {
        &self.tuning
    }

    /// Turns the per-op profile of eager steps on or off (`--profile ops`): a CUDA event pair around every op, a
    /// `cuda-profile:` summary line on stderr every 64 decode steps (8 with a prefill chunk).
    pub fn set_op_profile(&self, on: bool) {
        if let Ok(mut p) = self.profile.lock() {
            *p = on.then(profile::Profile::new);
        }
    }

    /// Starts recording ops into a CUDA graph instead of running them. Every op until `end_capture` must only
    /// launch work (no host copies); the attention work split it needs must already be cached (run the same
    /// step once eagerly first).
    pub fn begin_capture(&self) -> Result<()> {
        self.bind()?;
        self.stream
            .begin_capture(cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .map_err(|e| be(format!("cuda: beginning a graph capture: {e:?}")))?;
        self.pool.set_capturing(true);
        self.capturing.set(true);
        Ok(())
    }

    /// Ends the capture (also after a failed op) and instantiates the graph; the graph takes the cached attention
    /// work split it reads.
    pub fn end_capture(&self) -> Result<Graph> {
        self.bind()?;
        self.pool.set_capturing(false);
        self.capturing.set(false);
        let g = self
            .stream
            .end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0))
            .map_err(|e| be(format!("cuda: ending a graph capture: {e:?}")))?
            .ok_or_else(|| be("cuda: the captured graph is empty"))?;
        Ok(Graph { exec: g, _plan: self.plans.take(), timing: Default::default() })
    }

    /// Runs a captured graph on the backend's stream (after every earlier op).
    pub fn replay(&self, g: &Graph) -> Result<()> {
        self.bind()?;
        g.exec.launch().map_err(|e| be(format!("cuda: replaying a graph: {e:?}")))
    }

    /// A timing event recorded now on the backend's stream.
    pub fn record_event(&self) -> Result<cudarc::driver::CudaEvent> {
        self.bind()?;
        let e = self
            .ctx
            .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| be(format!("cuda: event: {e:?}")))?;
        e.record(&self.stream).map_err(|e| be(format!("cuda: event: {e:?}")))?;
        Ok(e)
    }

    fn profile(&self) -> Option<std::sync::MutexGuard<'_, Option<profile::Profile>>> {
        if self.capturing.get() {
            return None;
        }
        self.profile.lock().ok().filter(|p| p.is_some())
    }
}

/// A captured, instantiated CUDA graph of one step shape, with the attention work split it reads.
pub struct Graph {
    exec: cudarc::driver::CudaGraph,
    _plan: Option<AttnPlan<CuBuffer>>,
    /// Events around each timed replay not read yet, oldest first (`Backend::replay_ms`): with async scheduling the
    /// same graph is replayed again before the earlier replay is read.
    timing: RefCell<std::collections::VecDeque<(cudarc::driver::CudaEvent, cudarc::driver::CudaEvent)>>,
}

// SAFETY: a graph is created, replayed and destroyed by whichever single thread owns it (the engine thread owns the
// runner that holds it); CUDA graph objects only need external serialisation, which ownership gives.
unsafe impl Send for Graph {}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        if self.bind().is_ok() {
            let _ = self.stream.synchronize();
            drop(self.plans.take());
            // SAFETY: the handle was created by this backend and is not used after this point.
            unsafe { cublas::destroy_handle(self.blas).ok() };
            drop(self.workspace.borrow_mut().take());
            self.pool.release_all();
        }
    }
}

fn as_bytes<T: bytemuck::Pod>(v: &[T]) -> &[u8] {
    bytemuck::cast_slice(v)
}

fn op_name<B>(op: &Op<'_, B>) -> &'static str {
    match op {
        Op::Embedding { .. } => "embedding",
        Op::RmsNorm { .. } => "rms_norm",
        Op::AddRmsNorm { .. } => "add_rms_norm",
        Op::MatMul { .. } => "matmul",
        Op::RopeWriteKv { .. } => "rope_write_kv",
        Op::GatedAct { .. } => "gated_act",
        Op::SoftCap { .. } => "soft_cap",
        Op::PagedAttention { .. } => "attention",
        Op::GatherRows { .. } => "gather_rows",
        Op::LayerNorm { .. } => "layer_norm",
        Op::Gelu { .. } => "gelu",
        Op::EncoderAttention { .. } => "encoder_attention",
        Op::FeedTokens { .. } => "feed_tokens",
        Op::MaskLogits { .. } => "mask_logits",
        Op::AdjustLogits { .. } => "adjust_logits",
        Op::ArgmaxRows { .. } => "argmax_rows",
        Op::SampleRows { .. } => "sample_rows",
        Op::RowLogprobs { .. } => "row_logprobs",
        Op::MoeRoute { .. } => "moe_route",
        Op::MoeAlign { .. } => "moe_align",
        Op::MoeMatMul { .. } => "moe_matmul",
        Op::MoeBias { .. } => "moe_bias",
        Op::MoeCombine { .. } => "moe_combine",
        Op::MoePairGateUp { .. } => "moe_pair_gate_up",
        Op::MoePairDown { .. } => "moe_pair_down",
    }
}

impl Backend for CudaBackend {
    type Buffer = CuBuffer;
    type Recording = Graph;

    fn device_name(&self) -> String {
        format!("cuda: {} (sm_{}{})", self.name, self.cc.0, self.cc.1)
    }

    fn upload_weight(&self, t: &candle_core::Tensor) -> Result<CuBuffer> {
        match t.rank() {
            2 => self.upload_weight_rows(&[t]),
            _ => match weight_data(t)? {
                WeightData::Vector(v) => self.upload_f32(&v),
                WeightData::Matrix { bytes, contents } => self.upload_bytes(&bytes, contents),
            },
        }
    }

    fn upload_weight_rows(&self, parts: &[&candle_core::Tensor]) -> Result<CuBuffer> {
        // Each part straight from its host storage into its rows of one device allocation: no host copy.
        with_matrix_bytes(parts, |bytes, contents| {
            self.bind()?;
            let buf = CuBuffer::new(&self.pool, bytes.iter().map(|b| b.len()).sum(), contents)?;
            let mut at = 0;
            for b in bytes {
                self.copy_in_at(&buf, at, b)?;
                at += b.len();
            }
            Ok(buf)
        })
    }

    fn alloc_f32_scratch(&self, len: usize) -> Result<CuBuffer> {
        self.bind()?;
        CuBuffer::new(&self.pool, len * 4, Contents::F32 { len })
    }

    fn alloc_matmul_input(&self, len: usize, w: &CuBuffer) -> Result<CuBuffer> {
        self.bind()?;
        match w.contents() {
            // cuBLAS and the asynchronous-copy GEMV take the activations in the weight's 16-bit type: the producer
            // writes them so.
            Contents::Matrix { dtype: dtype @ (WeightDType::BF16 | WeightDType::F16), .. } => {
                CuBuffer::new(&self.pool, len * 2, Contents::Half { dtype: *dtype, len })
            }
            _ => CuBuffer::new(&self.pool, len * 4, Contents::F32 { len }),
        }
    }

    fn kv_cache_dtype(&self, compute: WeightDType) -> WeightDType {
        // The model's own type, as vLLM's `auto`: a 16-bit model keeps 16-bit keys and values (half the bytes the
        // attention kernels stream, twice the tokens in the same memory).
        compute
    }

    fn alloc_kv_cache(&self, len: usize, dtype: WeightDType) -> Result<CuBuffer> {
        match dtype {
            WeightDType::F32 => self.alloc_f32(len),
            d => self.alloc_zeroed(len * 2, Contents::Half { dtype: d, len }),
        }
    }

    fn alloc_f32(&self, len: usize) -> Result<CuBuffer> {
        self.alloc_zeroed(len * 4, Contents::F32 { len })
    }

    fn upload_f32(&self, data: &[f32]) -> Result<CuBuffer> {
        self.upload_bytes(as_bytes(data), Contents::F32 { len: data.len() })
    }

    /// No copy, so it may be taken while capturing a graph.
    fn alloc_u32_output(&self, len: usize) -> Result<CuBuffer> {
        self.bind()?;
        CuBuffer::new(&self.pool, len * 4, Contents::U32 { len, bound: u32::MAX })
    }

    fn upload_u32(&self, data: &[u32]) -> Result<CuBuffer> {
        self.upload_bytes(as_bytes(data), Contents::u32_of(data))
    }

    fn download_f32(&self, buf: &CuBuffer) -> Result<Vec<f32>> {
        let len = buf.contents().f32_len().ok_or_else(|| be("download_f32: expected an f32 buffer"))?;
        let mut out = vec![0f32; len];
        self.copy_out(buf, &mut out)?;
        Ok(out)
    }

    fn download_u32(&self, buf: &CuBuffer, len: usize) -> Result<Vec<u32>> {
        let mut out = vec![0u32; len];
        self.copy_out(buf, &mut out)?;
        Ok(out)
    }

    fn read_u32_later(&self, buf: &CuBuffer, len: usize) -> Result<Option<Box<dyn crate::PendingRead>>> {
        self.bind()?;
        if self.capturing.get() {
            return Err(be("cuda: a read-back cannot be part of a captured graph"));
        }
        self.pinned.read_later(&self.ctx, &self.stream, buf, len).map(Some)
    }

    fn records(&self) -> bool {
        true
    }

    fn begin_recording(&self) -> Result<()> {
        self.begin_capture()
    }

    fn end_recording(&self) -> Result<Graph> {
        self.end_capture()
    }

    fn replay(&self, g: &Graph, timed: bool) -> Result<()> {
        if !timed {
            return CudaBackend::replay(self, g);
        }
        let start = self.record_event()?;
        CudaBackend::replay(self, g)?;
        let end = self.record_event()?;
        let mut timing = g.timing.borrow_mut();
        // Replays nobody reads the time of (the step was abandoned) are not kept for ever.
        if timing.len() >= 4 {
            timing.pop_front();
        }
        timing.push_back((start, end));
        Ok(())
    }

    fn replay_ms(&self, g: &Graph) -> Option<f64> {
        let (start, end) = g.timing.borrow_mut().pop_front()?;
        start.elapsed_ms(&end).ok().map(f64::from)
    }

    fn decode_partitions(&self, longest: usize, rows: usize) -> usize {
        self.tuning.get().decode_parts(longest, rows)
    }

    fn upload_inputs(&self, parts: &[&[u32]]) -> Result<crate::InputBuffers<CuBuffer>> {
        let (owner, views) = self.upload_u32_packed(parts)?;
        Ok((Some(owner), views))
    }

    fn write_inputs(&self, owner: Option<&CuBuffer>, views: &mut [&mut CuBuffer], parts: &[&[u32]]) -> Result<()> {
        let owner = owner.ok_or_else(|| be("cuda: step inputs without their allocation"))?;
        self.write_u32_packed(owner, views, parts)
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
        let r = super::kernels::run(self, op);
        if let Some(p) = prof.as_mut().and_then(|g| g.as_mut()) {
            p.end(&self.ctx, &self.stream);
        }
        r
    }
}

impl KernelDevice for CudaBackend {
    type Buf = CuBuffer;

    fn contents<'b>(&self, b: &'b CuBuffer) -> &'b Contents {
        b.contents()
    }

    fn scratch_f32(&self, len: usize) -> Result<CuBuffer> {
        self.alloc_f32_scratch(len)
    }

    fn upload_indices(&self, data: &[u32]) -> Result<CuBuffer> {
        Backend::upload_u32(self, data)
    }

    fn launch(&self, l: &Launch<'_, CuBuffer>) -> Result<()> {
        self.kernels.launch(&self.stream, l, self.tuning.get().pdl)
    }

    fn plans(&self) -> &PlanCache<CuBuffer> {
        &self.plans
    }

    fn tuning(&self) -> KernelTuning {
        self.tuning.get()
    }

    fn vendor_matmul(&self, call: &MatMulCall<'_, CuBuffer>) -> Result<()> {
        blas::gemm(self, call)
    }
}
