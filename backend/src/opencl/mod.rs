//! The OpenCL backend: every `Op` on the SPIR-V kernels of `rserve-kernels`, on any OpenCL 2.1+ device that takes
//! SPIR-V (Intel GPUs through their OpenCL driver; Intel's CPU runtime in tests and CI).
//!
//! One context, one in-order queue: ops run in submission order and the host waits only in downloads and in the
//! writes of recorded steps' inputs.
//! Activations and the KV cache are f32 device buffers; 2-D weights stay in their dtype (f32/bf16/f16) and are
//! converted in the kernels with f32 accumulation; 1-D weights (norms, biases) are uploaded as f32, like the CPU
//! backend keeps them. `libOpenCL.so.1` is loaded at run time, so a host without OpenCL builds and runs the CPU
//! backend unchanged.
//!
//! Recorded steps: where the device has `cl_khr_command_buffer` 1.0 (`command_buffer`), `begin_recording` sends
//! launches and fills to a command-buffer instead of the queue, and `replay` enqueues it as one command; buffers
//! allocated meanwhile stay the recording's (`recording`). Elsewhere `records()` is false and every step runs op by
//! op. A recording's inputs are refilled in place (`write_inputs`: one blocking write per part).
//!
//! Boundary: which kernels an op launches, and the host-side checks, live in the device-neutral `backend::kernels`;
//! this module implements its `KernelDevice` (buffers, argument setting, enqueue).

mod buffer;
mod command_buffer;
mod device;
mod kernels;
mod recording;
mod stats;

use std::cell::RefCell;

use opencl3::command_queue::CommandQueue;
use opencl3::context::Context;
use opencl3::types::CL_BLOCKING;

pub use buffer::ClBuffer;
use buffer::{as_bytes, Contents};
use command_buffer::{CommandBuffer, CommandBufferApi};
use device::cl_err;
pub use device::{list_devices, replica_devices, OpenClDeviceInfo, OpenClOptions};
use kernels::Kernels;
pub use recording::OpenClRecording;
use recording::{InProgress, RetainedMem};
use stats::Counters;
pub use stats::QueueStats;

use super::kernels::{weight_data, KernelDevice, KernelTuning, Launch, PlanCache, TuningCell, WeightData};
use super::{Backend, Op, WeightDType};
use crate::cpu::be;
use crate::error::Result;

/// An OpenCL device with rserve's kernels built on it.
pub struct OpenClBackend {
    // Field order is drop order: a recording in progress, kernels and cached buffers before the queue and the
    // context.
    recording: RefCell<Option<InProgress>>,
    kernels: Kernels,
    plans: PlanCache<ClBuffer>,
    tuning: TuningCell,
    queue: CommandQueue,
    context: Context,
    info: OpenClDeviceInfo,
    /// Bytes read back to the host (`Backend::bytes_read_back`).
    read_back: std::cell::Cell<u64>,
    /// The command-buffer entry points, where the device records steps.
    command_buffers: Option<CommandBufferApi>,
    stats: Counters,
}

/// The queue's properties: in order, no profiling.
const QUEUE_PROPERTIES: u64 = 0;

impl OpenClBackend {
    /// Opens the device `opts` names and builds every kernel module on it.
    pub fn new(opts: &OpenClOptions) -> Result<Self> {
        let (dev, info) = device::select(opts)?;
        let context = Context::from_device(&dev).map_err(|e| cl_err("creating a context", e))?;
        let queue = CommandQueue::create_default_with_properties(&context, QUEUE_PROPERTIES, 0)
            .map_err(|e| cl_err("creating a command queue", e))?;
        let command_buffers = match CommandBufferApi::load(&dev, QUEUE_PROPERTIES) {
            Ok(api) => {
                tracing::info!("OpenCL: {} records decode steps (cl_khr_command_buffer)", info.name);
                Some(api)
            }
            Err(why) => {
                tracing::info!("OpenCL: {} runs every step op by op: {why}", info.name);
                None
            }
        };
        let t0 = std::time::Instant::now();
        let kernels = Kernels::build(&context, &dev, &info.name)?;
        tracing::info!("OpenCL kernels built for {} in {:.1} s", info.name, t0.elapsed().as_secs_f64());
        let tuning = TuningCell::new(KernelTuning::opencl(info.is_cpu));
        Ok(Self {
            recording: RefCell::new(None),
            kernels,
            plans: PlanCache::default(),
            tuning,
            queue,
            context,
            info,
            read_back: Default::default(),
            command_buffers,
            stats: Counters::default(),
        })
    }

    pub fn info(&self) -> &OpenClDeviceInfo {
        &self.info
    }

    /// Memory for weights + KV cache: the device's global memory, or None for a CPU device (host memory rules).
    pub fn memory_bytes(&self) -> Option<u64> {
        (!self.info.is_cpu).then_some(self.info.global_mem_bytes)
    }

    /// The kernel variant choices (tools and tests may replace them).
    pub fn tuning_cell(&self) -> &TuningCell {
        &self.tuning
    }

    /// The attention plans built so far (see `PlanCache`).
    pub fn attention_plan_builds(&self) -> u64 {
        self.plans.builds()
    }

    /// What the queue has done so far: commands enqueued, command-buffers created, recorded steps replayed.
    pub fn queue_stats(&self) -> QueueStats {
        self.stats.get()
    }

    /// Waits until every enqueued op has finished (for benchmarks).
    pub fn finish(&self) -> Result<()> {
        self.queue.finish().map_err(|e| cl_err("waiting for the queue", e))
    }

    fn create(&self, bytes: usize, host: Option<&[u8]>, contents: Contents) -> Result<ClBuffer> {
        if bytes as u64 > self.info.max_alloc_bytes {
            return Err(be(format!(
                "opencl: an allocation of {bytes} bytes exceeds the device's largest allocation ({} bytes) on '{}'",
                self.info.max_alloc_bytes, self.info.name
            )));
        }
        let mut recording = self.recording.borrow_mut();
        if let (Some(_), Some(_)) = (recording.as_ref(), host) {
            return Err(be("opencl: a recorded step copies nothing from the host"));
        }
        let b = ClBuffer::create(&self.context, bytes, host, contents)?;
        if let Some(r) = recording.as_mut() {
            // The recording keeps this memory: a replay writes it, whoever drops the buffer.
            r.buffers.push(RetainedMem::of(&b)?);
        }
        Ok(b)
    }

    /// Fills the first `bytes` bytes of `b` with `pattern` (recorded while recording).
    fn fill(&self, b: &mut ClBuffer, pattern: &[u8], bytes: usize) -> Result<()> {
        if let Some(r) = self.recording.borrow_mut().as_mut() {
            return r.commands.fill(b.mem(), pattern, bytes).map_err(|e| cl_err("recording a fill", e));
        }
        // SAFETY: the fill covers `bytes` bytes of the buffer, a multiple of the pattern's size.
        unsafe { self.queue.enqueue_fill_buffer(b.mem_mut(), pattern, 0, bytes, &[]) }
            .map_err(|e| cl_err("zero-filling a buffer", e))?;
        self.stats.enqueued();
        Ok(())
    }

    /// Refuses host copies while recording.
    fn not_recording(&self, what: &str) -> Result<()> {
        match self.recording.borrow().as_ref() {
            Some(_) => Err(be(format!("opencl: {what} cannot be part of a recorded step"))),
            None => Ok(()),
        }
    }
}

impl Backend for OpenClBackend {
    type Buffer = ClBuffer;
    type Recording = OpenClRecording;

    fn device_name(&self) -> String {
        format!("opencl: {} ({})", self.info.name, self.info.platform)
    }

    fn upload_weight(&self, t: &candle_core::Tensor) -> Result<ClBuffer> {
        match weight_data(t)? {
            WeightData::Vector(v) => self.upload_f32(&v),
            WeightData::Matrix { bytes, contents } => self.create(bytes.len(), Some(&bytes), contents),
        }
    }

    fn alloc_f32(&self, len: usize) -> Result<ClBuffer> {
        let mut b = self.create(len * 4, None, Contents::F32 { len })?;
        // The whole buffer, a multiple of the 4-byte pattern.
        self.fill(&mut b, &[0u8; 4], (len * 4).max(4))?;
        Ok(b)
    }

    fn upload_f32(&self, data: &[f32]) -> Result<ClBuffer> {
        self.create(data.len() * 4, Some(as_bytes(data)), Contents::F32 { len: data.len() })
    }

    fn kv_cache_dtype(&self, compute: WeightDType) -> WeightDType {
        // vLLM's `auto`: the model's type (the attention and cache-write kernels have 16-bit entry points).
        compute
    }

    fn alloc_matmul_input(&self, len: usize, w: &ClBuffer) -> Result<ClBuffer> {
        match w.contents() {
            // The matmul kernels' `_x16` entry points read activations in the weight's 16-bit type: the producer
            // writes them so (half the bytes between the ops, as on CUDA).
            Contents::Matrix { dtype: dtype @ (WeightDType::BF16 | WeightDType::F16), .. } => {
                self.create(len * 2, None, Contents::Half { dtype: *dtype, len })
            }
            _ => self.alloc_f32_scratch(len),
        }
    }

    fn alloc_kv_cache(&self, len: usize, dtype: WeightDType) -> Result<ClBuffer> {
        if dtype == WeightDType::F32 {
            return self.alloc_f32(len);
        }
        let mut b = self.create(len * 2, None, Contents::Half { dtype, len })?;
        // The whole buffer (at least 4 bytes), a multiple of the 2-byte pattern.
        self.fill(&mut b, &[0u8; 2], (len * 2).max(4))?;
        Ok(b)
    }

    fn alloc_u32_output(&self, len: usize) -> Result<ClBuffer> {
        self.create(len * 4, None, Contents::U32 { len, bound: u32::MAX })
    }

    fn upload_u32(&self, data: &[u32]) -> Result<ClBuffer> {
        self.create(data.len() * 4, Some(as_bytes(data)), Contents::u32_of(data))
    }

    fn download_f32(&self, buf: &ClBuffer) -> Result<Vec<f32>> {
        let len = buf.contents().f32_len().ok_or_else(|| be("download_f32: expected an f32 buffer"))?;
        let mut out = vec![0f32; len];
        self.read(buf, &mut out)?;
        Ok(out)
    }

    fn download_u32(&self, buf: &ClBuffer, len: usize) -> Result<Vec<u32>> {
        let have = buf.contents().u32_len().ok_or_else(|| be("download_u32: expected a u32 buffer"))?;
        if len > have {
            return Err(be(format!("download_u32: {len} values of a buffer of {have}")));
        }
        let mut out = vec![0u32; len];
        self.read(buf, &mut out)?;
        Ok(out)
    }

    fn bytes_read_back(&self) -> u64 {
        self.read_back.get()
    }

    fn run(&self, op: Op<'_, ClBuffer>) -> Result<()> {
        super::kernels::run(self, op)
    }

    fn records(&self) -> bool {
        self.command_buffers.is_some()
    }

    fn begin_recording(&self) -> Result<()> {
        let api = self
            .command_buffers
            .ok_or_else(|| be(format!("{}: the device has no cl_khr_command_buffer", self.device_name())))?;
        let mut recording = self.recording.borrow_mut();
        if recording.is_some() {
            return Err(be("opencl: a recording is already in progress"));
        }
        let commands = CommandBuffer::new(api, self.queue.get()).map_err(|e| cl_err("creating a command-buffer", e))?;
        self.stats.command_buffer();
        *recording = Some(InProgress { commands, buffers: Vec::new() });
        Ok(())
    }

    fn end_recording(&self) -> Result<OpenClRecording> {
        let InProgress { mut commands, buffers } =
            self.recording.borrow_mut().take().ok_or_else(|| be("opencl: no recording is in progress"))?;
        commands.finalize().map_err(|e| cl_err("finalizing a command-buffer", e))?;
        Ok(OpenClRecording { commands, _buffers: buffers, _plan: self.plans.take() })
    }

    fn replay(&self, r: &OpenClRecording, _timed: bool) -> Result<()> {
        self.not_recording("a replay")?;
        r.commands.enqueue().map_err(|e| cl_err("enqueuing a recorded step", e))?;
        self.stats.replay();
        Ok(())
    }

    fn decode_partitions(&self, longest: usize, rows: usize) -> usize {
        self.tuning.get().decode_parts(longest, rows)
    }

    fn write_inputs(&self, _owner: Option<&ClBuffer>, views: &mut [&mut ClBuffer], parts: &[&[u32]]) -> Result<()> {
        self.not_recording("writing step inputs")?;
        if views.len() != parts.len() {
            return Err(be("write_inputs: one part per buffer"));
        }
        for (view, part) in views.iter_mut().zip(parts) {
            let bytes = as_bytes(part);
            if bytes.len() > view.bytes() {
                return Err(be(format!(
                    "write_inputs: {} values do not fit a buffer of {} bytes",
                    part.len(),
                    view.bytes()
                )));
            }
            if !bytes.is_empty() {
                // In place: recordings read these buffers. Blocking, so the host slice may go once it returns, and
                // on the in-order queue it returns only after the previous replay has run: a command-buffer is never
                // enqueued while an earlier enqueue of it is pending.
                // SAFETY: `bytes.len()` bytes (checked against the buffer's size) from host memory of that size.
                unsafe { self.queue.enqueue_write_buffer(view.mem_mut(), CL_BLOCKING, 0, bytes, &[]) }
                    .map_err(|e| cl_err("writing step inputs", e))?;
                self.stats.enqueued();
            }
            view.contents = Contents::u32_of(part);
        }
        Ok(())
    }
}

impl OpenClBackend {
    /// A blocking read of the first `out.len()` values of `buf` (its in-order queue runs every earlier op first).
    fn read<T: bytemuck::Pod>(&self, buf: &ClBuffer, out: &mut [T]) -> Result<()> {
        self.not_recording("a read back")?;
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(out);
        if bytes.is_empty() {
            return Ok(());
        }
        // SAFETY: a blocking read of exactly `bytes.len()` bytes (at most the buffer's: the callers check the
        // length against its contents) into host memory of that size.
        unsafe {
            opencl3::command_queue::enqueue_read_buffer(
                self.queue.get(),
                buf.mem(),
                CL_BLOCKING,
                0,
                bytes.len(),
                bytes.as_mut_ptr() as *mut std::ffi::c_void,
                0,
                std::ptr::null(),
            )
            .map(|ev| opencl3::event::release_event(ev).ok())
            .map_err(|e| cl_err("reading a buffer back", opencl3::error_codes::ClError(e)))?;
        }
        self.stats.enqueued();
        self.read_back.set(self.read_back.get() + bytes.len() as u64);
        Ok(())
    }
}

impl KernelDevice for OpenClBackend {
    type Buf = ClBuffer;

    fn contents<'b>(&self, b: &'b ClBuffer) -> &'b Contents {
        b.contents()
    }

    fn scratch_f32(&self, len: usize) -> Result<ClBuffer> {
        self.create(len * 4, None, Contents::F32 { len })
    }

    fn upload_indices(&self, data: &[u32]) -> Result<ClBuffer> {
        Backend::upload_u32(self, data)
    }

    fn launch(&self, l: &Launch<'_, ClBuffer>) -> Result<()> {
        let Some(kernel) = self.kernels.set_args(l)? else { return Ok(()) };
        if let Some(r) = self.recording.borrow_mut().as_mut() {
            // The command captures the arguments just set.
            let local = [l.local, 1, 1];
            return r
                .commands
                .kernel(kernel.get(), &l.global, &local)
                .map_err(|e| cl_err(&format!("recording {}", l.kernel), e));
        }
        kernels::enqueue(&self.queue, kernel, l)?;
        self.stats.enqueued();
        Ok(())
    }

    fn plans(&self) -> &PlanCache<ClBuffer> {
        &self.plans
    }

    fn tuning(&self) -> KernelTuning {
        self.tuning.get()
    }
}
