//! rserve's backends: the device seam (a narrow `Backend` trait plus the closed `Op` enum every backend
//! implements) and its implementations: `cpu` (always built, the reference), and behind cargo features `opencl`,
//! `level-zero` and `cuda`; `kernels` is the device-neutral op layer the three kernel backends share.
//!
//! The model is written once against these ops; the CPU backend is the reference every device backend is tested
//! against. Buffers are opaque handles; outputs are written through `&Buffer` (device memory is shared state, and
//! the CPU backend uses interior mutability), so an op never needs exclusive access to its whole argument list.
//!
//! Invariant: an op never reads and writes the same buffer unless the op says so (`AddRmsNorm::residual`).

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod env;
pub mod error;
pub mod hash;
#[cfg(any(feature = "opencl", feature = "level-zero", feature = "cuda"))]
pub mod kernels;
#[cfg(feature = "level-zero")]
pub mod level_zero;
#[cfg(feature = "opencl")]
pub mod opencl;
mod ops;
pub mod sampling;

pub use error::{BackendError, Result};

pub use ops::{
    moe_max_tiles, moe_pairs_ungrouped, Activation, AttentionMeta, AttnShape, HeldExperts, MoeInput, MoeTiles, Op,
    QkNorm, RopeIo,
};

/// Element type of a weight buffer. Activations and the KV cache are f32 on the CPU backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightDType {
    F32,
    BF16,
    F16,
}

impl WeightDType {
    pub fn size_in_bytes(self) -> usize {
        match self {
            WeightDType::F32 => 4,
            WeightDType::BF16 | WeightDType::F16 => 2,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            WeightDType::F32 => "float32",
            WeightDType::BF16 => "bfloat16",
            WeightDType::F16 => "float16",
        }
    }

    /// The weight type of a candle dtype (None for integer types).
    pub fn from_candle(d: candle_core::DType) -> Option<Self> {
        match d {
            candle_core::DType::F32 => Some(WeightDType::F32),
            candle_core::DType::BF16 => Some(WeightDType::BF16),
            candle_core::DType::F16 => Some(WeightDType::F16),
            _ => None,
        }
    }

    pub fn to_candle(self) -> candle_core::DType {
        match self {
            WeightDType::F32 => candle_core::DType::F32,
            WeightDType::BF16 => candle_core::DType::BF16,
            WeightDType::F16 => candle_core::DType::F16,
        }
    }
}

/// A compute device: memory plus the ops of `Op`.
pub trait Backend {
    /// A device allocation (f32 activations, u32 indices, or a weight in its dtype).
    type Buffer;
    /// A step recorded once and replayed (a CUDA graph); `NoRecording` on backends whose steps always run op by op.
    type Recording;

    /// Human-readable device name for logs.
    fn device_name(&self) -> String;
    /// Upload a weight (1-D or row-major 2-D) in the dtype it already has.
    fn upload_weight(&self, t: &candle_core::Tensor) -> Result<Self::Buffer>;
    /// Upload 2-D weights stacked by rows into one matrix (a fused q/k/v or gate/up projection). A device backend
    /// may write each part into its place on the device instead of stacking them in host memory first.
    fn upload_weight_rows(&self, parts: &[&candle_core::Tensor]) -> Result<Self::Buffer> {
        match parts {
            [one] => self.upload_weight(one),
            _ => self.upload_weight(&candle_core::Tensor::cat(parts, 0)?),
        }
    }
    /// A zeroed f32 buffer of `len` elements.
    fn alloc_f32(&self, len: usize) -> Result<Self::Buffer>;
    /// An f32 buffer of `len` elements that the next op overwrites whole (an op's output): a backend may skip the
    /// zero fill.
    fn alloc_f32_scratch(&self, len: usize) -> Result<Self::Buffer> {
        self.alloc_f32(len)
    }
    /// An activation buffer of `len` values whose only reader is `Op::MatMul` with weight `w`, written whole by
    /// `RmsNorm`, `AddRmsNorm`, `GatedAct` or `PagedAttention`. A backend whose matrix multiply rounds activations to the weight's
    /// 16-bit type anyway (cuBLAS) may store them in that type, so the producer writes them rounded and no conversion
    /// pass runs; the others return an f32 buffer. Such a buffer is never downloaded.
    fn alloc_matmul_input(&self, len: usize, w: &Self::Buffer) -> Result<Self::Buffer> {
        let _ = w;
        self.alloc_f32_scratch(len)
    }
    /// The element type this backend keeps the paged KV cache in for a model computing in `compute` (vLLM's
    /// `--kv-cache-dtype auto`: the model's dtype where the attention kernels read it; f32 elsewhere).
    fn kv_cache_dtype(&self, compute: WeightDType) -> WeightDType {
        let _ = compute;
        WeightDType::F32
    }
    /// A zeroed KV-cache buffer of `len` values of `dtype` (one `kv_cache_dtype` returned).
    fn alloc_kv_cache(&self, len: usize, dtype: WeightDType) -> Result<Self::Buffer> {
        match dtype {
            WeightDType::F32 => self.alloc_f32(len),
            other => Err(crate::error::BackendError::Device(format!(
                "{}: no {} KV cache on this backend",
                self.device_name(),
                other.as_str()
            ))),
        }
    }
    /// A u32 buffer of `len` values that the next op writes whole (indices computed on the device: a
    /// mixture-of-experts layer's routing and grouping).
    fn alloc_u32_output(&self, len: usize) -> Result<Self::Buffer>;
    /// Upload f32 values (activations, tables).
    fn upload_f32(&self, data: &[f32]) -> Result<Self::Buffer>;
    /// Upload u32 values (token ids, positions, slot mappings, block tables).
    fn upload_u32(&self, data: &[u32]) -> Result<Self::Buffer>;
    /// Read an f32 buffer back to the host.
    fn download_f32(&self, buf: &Self::Buffer) -> Result<Vec<f32>>;
    /// Read the first `len` values of a u32 buffer back to the host.
    fn download_u32(&self, buf: &Self::Buffer, len: usize) -> Result<Vec<u32>>;
    /// Queues a read of the first `len` values of `buf` behind every op queued so far and returns at once: `wait`
    /// on the result waits for those ops only, not for work queued after this call (a step launched behind the
    /// one whose ids are read). None: this backend reads only in `download_u32`, which waits for every op queued.
    fn read_u32_later(&self, buf: &Self::Buffer, len: usize) -> Result<Option<Box<dyn PendingRead>>> {
        let _ = (buf, len);
        Ok(None)
    }
    /// Bytes read back to the host so far (`download_f32`, `download_u32`): how tests see what a step reads back.
    /// 0 on backends whose buffers are host memory.
    fn bytes_read_back(&self) -> u64 {
        0
    }
    /// Run one op. Ops on one backend execute in submission order.
    fn run(&self, op: Op<'_, Self::Buffer>) -> Result<()>;

    /// Whether `begin_recording` records; false: every step runs op by op.
    fn records(&self) -> bool {
        false
    }
    /// Starts recording ops instead of running them. Until `end_recording` ops only launch work (no host copies),
    /// and the memory they allocate belongs to the recordings: it is never handed to anything else, so a replay
    /// overwrites nothing that lives outside a recording. The attention work split the step reads must already be
    /// cached (run the same step once first).
    fn begin_recording(&self) -> Result<()> {
        Err(BackendError::Device(format!("{}: this backend records no steps", self.device_name())))
    }
    /// Ends a recording (also after a failed op): the recorded step, holding the attention work split it reads.
    fn end_recording(&self) -> Result<Self::Recording> {
        Err(BackendError::Device(format!("{}: this backend records no steps", self.device_name())))
    }
    /// Runs a recorded step after every earlier op; `timed`: the device times it (`replay_ms`).
    fn replay(&self, recording: &Self::Recording, timed: bool) -> Result<()> {
        let _ = (recording, timed);
        Err(BackendError::Device(format!("{}: this backend records no steps", self.device_name())))
    }
    /// Device milliseconds of `recording`'s oldest timed replay whose time was not read yet (each replay's time is
    /// read once, in replay order), once that step's result was read back.
    fn replay_ms(&self, recording: &Self::Recording) -> Option<f64> {
        let _ = recording;
        None
    }
    /// The partitions a decode step of `rows` rows whose longest context is `longest` tokens splits its attention
    /// into. A recording holds one attention work split, so the count is part of what a recording is kept by.
    fn decode_partitions(&self, longest: usize, rows: usize) -> usize {
        let _ = (longest, rows);
        1
    }
    /// u32 step inputs that stay on the device from step to step: one buffer per part, and the allocation they
    /// share where the backend packs them into one (it must outlive them). `write_inputs` refills them.
    fn upload_inputs(&self, parts: &[&[u32]]) -> Result<InputBuffers<Self::Buffer>> {
        Ok((None, parts.iter().map(|p| self.upload_u32(p)).collect::<Result<_>>()?))
    }
    /// Refills buffers `upload_inputs` made with `parts`. A backend that records writes them in place (one host
    /// copy where they are packed), since recordings read them; this default uploads new ones.
    fn write_inputs(
        &self,
        owner: Option<&Self::Buffer>,
        views: &mut [&mut Self::Buffer],
        parts: &[&[u32]],
    ) -> Result<()> {
        let _ = owner;
        for (v, p) in views.iter_mut().zip(parts) {
            **v = self.upload_u32(p)?;
        }
        Ok(())
    }
}

/// A read-back queued on a device (`Backend::read_u32_later`).
pub trait PendingRead: Send {
    /// Waits for the ops queued before the read, and returns the values read.
    fn wait(self: Box<Self>) -> Result<Vec<u32>>;
}

/// Step inputs on the device (`Backend::upload_inputs`): the allocation they share, if packed, and one buffer per part.
pub type InputBuffers<B> = (Option<B>, Vec<B>);

/// The recording of a backend that records nothing (`Backend::Recording`): no value exists.
pub enum NoRecording {}
