//! `LevelZeroBackend`: the `Backend` on a Level Zero device. Device memory comes from a stream-ordered pool, every
//! command goes through one ordered `Stream`, kernels are created once from the modules of `rserve-kernels` (PVC
//! native binaries or SPIR-V, as `aot` chooses), and each `Op` becomes the launches the device-neutral
//! `backend::kernels` layer plans for it. The host waits only where it needs data (downloads), when queued uploads
//! hold too much host memory, and when memory must go back to the driver.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use candle_core::Tensor;

use super::aot::{self, FormatPolicy, ModuleFormat};
use super::discovery::{DeviceInfo, Selected};
use super::error::LzError;
use super::handles::{Context, Kernel, Module};
use super::loader::api;
use super::memory::{AllocLimits, Contents, LzBuffer, MemPool};
use super::stream::{Recorded, Stream, StreamStats, RING_EVENTS};
use crate::error::{BackendError, Result};
use crate::kernels::{self, weight_data, Arg, KernelDevice, KernelTuning, Launch, PlanCache, WeightData};
use crate::{Backend, Op, WeightDType};

/// Bytes of freed device memory kept for reuse across steps; above it the pool returns memory after a step.
const CACHE_KEEP_BYTES: u64 = 1 << 30;

/// Build flags for every SPIR-V module: kernels that may index buffers over 4 GiB (stateless addressing), which the
/// pool allocates with relaxed limits over `maxMemAllocSize` (`memory`). The PVC binaries are built with IGC's
/// spelling of the same option (`kernels/build.rs`); for them the driver ignores these flags.
const BUILD_FLAGS: &str = "-ze-opt-greater-than-4GB-buffer-required";

/// The Level Zero backend on one device (a tile under FLAT, a card under COMPOSITE).
pub struct LevelZeroBackend {
    // Drop order matters: kernels before their modules, the stream before the pool and the context.
    plans: PlanCache<LzBuffer>,
    tuning: Cell<KernelTuning>,
    kernels: HashMap<&'static str, Kernel>,
    _modules: Vec<Arc<Module>>,
    stream: RefCell<Stream>,
    pool: Arc<MemPool>,
    _ctx: Arc<Context>,
    info: DeviceInfo,
    label: String,
    /// Bytes read back to the host (`Backend::bytes_read_back`).
    read_back: Cell<u64>,
}

impl LevelZeroBackend {
    /// Creates the context, the stream and every kernel of `rserve-kernels` on the selected device.
    pub fn new(sel: Selected) -> std::result::Result<Self, LzError> {
        let api = api()?;
        let largest =
            rserve_kernels::KERNELS.iter().flat_map(|(_, k)| k.iter()).map(|k| rserve_kernels::work_group(k)).max();
        if let Some(need) = largest {
            if sel.info.max_group_size != 0 && (sel.info.max_group_size as usize) < need {
                return Err(LzError::Invalid(format!(
                    "{} runs at most {} work-items per group; rserve's kernels need {need}",
                    sel.info.name, sel.info.max_group_size
                )));
            }
        }
        match super::loader::loader_components() {
            Ok(c) if !c.is_empty() => tracing::info!("Level Zero loader {}: {}", api.library, c.join(", ")),
            Ok(_) => {}
            Err(e) => tracing::debug!("Level Zero: no loader component versions ({e})"),
        }
        let ctx = Context::new(api, sel.driver, sel.device)?;
        let stream = Stream::new(&ctx, sel.info.compute_ordinal, RING_EVENTS)?;
        let pool = MemPool::new(&ctx, AllocLimits::of(&sel.info));
        let mut modules = Vec::new();
        let mut kernels = HashMap::new();
        let policy = FormatPolicy::from_env()?;
        let started = Instant::now();
        let mut formats = Vec::new();
        let xmx = aot::builds_matrix_engine(policy, &sel.info);
        for (module_name, names) in rserve_kernels::KERNELS {
            if rserve_kernels::target(module_name) == rserve_kernels::Target::MatrixEngine && !xmx {
                continue;
            }
            let m = rserve_kernels::module(module_name).ok_or_else(|| {
                LzError::Invalid(format!("rserve-kernels lists module {module_name} but does not embed it"))
            })?;
            let (module, format) = build_module(&ctx, m, policy, &sel.info)?;
            formats.push(format);
            for &name in names.iter() {
                let k = Kernel::new(&module, name)?;
                tracing::debug!(
                    "Level Zero kernel {name}: {} arguments, sub-group size {}",
                    k.info.num_args,
                    k.info.required_subgroup_size
                );
                if k.info.spill_mem > 0 {
                    tracing::warn!("Level Zero kernel {name} spills {} bytes of registers", k.info.spill_mem);
                }
                kernels.insert(name, k);
            }
            modules.push(module);
        }
        let native = formats.iter().filter(|&&f| f == ModuleFormat::Native).count();
        tracing::info!(
            "Level Zero modules: {native} from PVC native binaries, {} from SPIR-V, built in {:.0} ms",
            formats.len() - native,
            started.elapsed().as_secs_f64() * 1e3
        );
        let tile = match sel.info.sub_device {
            Some(t) => format!(", sub-device {t}"),
            None => String::new(),
        };
        let label = format!(
            "level-zero:{} {} (device id 0x{:04x}{tile}, {:.1} GiB; {} device(s) visible under ZE_FLAT_DEVICE_HIERARCHY={})",
            sel.index,
            sel.info.name,
            sel.info.device_id,
            sel.info.memory_bytes as f64 / (1u64 << 30) as f64,
            sel.of,
            sel.hierarchy
        );
        let tuning = Cell::new(if xmx { KernelTuning::level_zero_xmx() } else { KernelTuning::level_zero() });
        if xmx {
            tracing::info!("Level Zero: bf16 matmuls above decode-sized rows run on the matrix engine (XMX)");
        }
        Ok(Self {
            plans: PlanCache::default(),
            tuning,
            kernels,
            _modules: modules,
            stream: RefCell::new(stream),
            pool,
            _ctx: ctx,
            info: sel.info,
            label,
            read_back: Cell::new(0),
        })
    }

    /// Total device memory in bytes, for the KV cache budget.
    pub fn memory_bytes(&self) -> u64 {
        self.info.memory_bytes
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// The attention plans built so far: one per batch shape and partition count, not one per step.
    pub fn attention_plan_builds(&self) -> u64 {
        self.plans.builds()
    }

    /// What the stream has done so far: commands appended, host synchronisations, recorded steps executed.
    pub fn stream_stats(&self) -> Result<StreamStats> {
        let s = self.stream()?;
        Ok(StreamStats { appended: s.appended, synchronizations: s.synchronizations, replays: s.replays })
    }

    /// Device memory: (bytes in live buffers, bytes cached for reuse, peak bytes in live buffers).
    pub fn memory_usage(&self) -> (u64, u64, u64) {
        self.pool.usage()
    }

    fn stream(&self) -> std::result::Result<std::cell::RefMut<'_, Stream>, LzError> {
        self.stream.try_borrow_mut().map_err(|_| LzError::Invalid("the Level Zero stream is already in use".into()))
    }

    /// A buffer of `bytes` bytes; when the device is out of memory, waits for the stream, returns cached memory
    /// to the driver and tries once more.
    fn buffer(&self, bytes: usize, contents: Contents) -> std::result::Result<LzBuffer, LzError> {
        let block = match self.pool.take(bytes) {
            Err(LzError::Call { code, .. }) if code == level_zero_sys::ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY => {
                self.stream()?.synchronize()?;
                self.pool.trim(0);
                self.pool.take(bytes)?
            }
            other => other?,
        };
        Ok(LzBuffer::wrap(&self.pool, block, bytes, contents))
    }

    /// A new buffer filled with `bytes` (queued; the stream keeps the bytes until the copy has run).
    fn upload_bytes(&self, bytes: Vec<u8>, contents: Contents) -> std::result::Result<LzBuffer, LzError> {
        let buf = self.buffer(bytes.len(), contents)?;
        self.stream()?.upload(buf.device_ptr(), bytes)?;
        Ok(buf)
    }

    fn launch_kernel(&self, l: &Launch<'_, LzBuffer>) -> std::result::Result<(), LzError> {
        let k = self
            .kernels
            .get(l.kernel)
            .ok_or_else(|| LzError::Invalid(format!("kernel {} is not in rserve-kernels", l.kernel)))?;
        if l.global.contains(&0) {
            return Ok(());
        }
        if l.local == 0 || !l.global[0].is_multiple_of(l.local) {
            return Err(LzError::Invalid(format!(
                "{}: {} work-items are not a multiple of the group size {}",
                l.kernel, l.global[0], l.local
            )));
        }
        let dim = |v: usize, what: &str| {
            u32::try_from(v)
                .map_err(|_| LzError::Invalid(format!("{}: {what} = {v} does not fit in 32 bits", l.kernel)))
        };
        if k.info.num_args != 0 && k.info.num_args as usize != l.args.len() {
            return Err(LzError::Invalid(format!(
                "{}: {} arguments given, the kernel declares {}",
                k.name,
                l.args.len(),
                k.info.num_args
            )));
        }
        let groups =
            [dim(l.global[0] / l.local, "work-groups")?, dim(l.global[1], "grid y")?, dim(l.global[2], "grid z")?];
        for (i, a) in l.args.iter().enumerate() {
            let i = i as u32;
            match a {
                Arg::Buf(b) => k.set_arg_ptr(i, b.device_ptr())?,
                Arg::U32(v) => k.set_arg_u32(i, *v)?,
                Arg::F32(v) => k.set_arg_f32(i, *v)?,
            }
        }
        k.set_group_size(dim(l.local, "group size")?, 1, 1)?;
        self.stream()?.launch(k, groups)
    }
}

/// Creates module `m` in the form `aot::choose` picks, logging the form and the build time; a native binary the
/// driver refuses is logged and replaced by the SPIR-V build.
fn build_module(
    ctx: &Arc<Context>,
    m: &rserve_kernels::Module,
    policy: FormatPolicy,
    info: &DeviceInfo,
) -> std::result::Result<(Arc<Module>, ModuleFormat), LzError> {
    let (format, why) = aot::choose(policy, info, !m.pvc.is_empty());
    let started = Instant::now();
    let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
    if format == ModuleFormat::Native {
        match Module::create(ctx, m.name, ModuleFormat::Native, m.pvc, BUILD_FLAGS) {
            Ok(module) => {
                aot::built(ModuleFormat::Native);
                tracing::info!("Level Zero module {}: PVC native binary ({why}), {:.1} ms", m.name, ms(started));
                return Ok((module, ModuleFormat::Native));
            }
            Err(e) => {
                aot::native_refused();
                tracing::warn!(
                    "Level Zero module {}: the driver refused the PVC native binary ({e}); using SPIR-V",
                    m.name
                );
            }
        }
    }
    let started = Instant::now();
    let module = Module::create(ctx, m.name, ModuleFormat::Spirv, m.spirv, BUILD_FLAGS)?;
    aot::built(ModuleFormat::Spirv);
    tracing::info!("Level Zero module {}: SPIR-V ({why}), {:.1} ms", m.name, ms(started));
    Ok((module, ModuleFormat::Spirv))
}

impl Drop for LevelZeroBackend {
    fn drop(&mut self) {
        // Kernels and cached memory may be in use by queued commands until the stream is idle.
        if let Ok(mut s) = self.stream.try_borrow_mut() {
            if let Err(e) = s.synchronize() {
                tracing::warn!("Level Zero: synchronising at shutdown failed: {e}");
            }
        }
        self.pool.trim(0);
    }
}

fn le_bytes<T: Copy, const N: usize>(v: &[T], f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
    v.iter().flat_map(|&x| f(x)).collect()
}

impl KernelDevice for LevelZeroBackend {
    type Buf = LzBuffer;

    fn contents<'b>(&self, b: &'b LzBuffer) -> &'b Contents {
        &b.contents
    }

    fn scratch_f32(&self, len: usize) -> Result<LzBuffer> {
        Ok(self.buffer(len * 4, Contents::F32 { len })?)
    }

    fn upload_indices(&self, data: &[u32]) -> Result<LzBuffer> {
        Ok(self.upload_bytes(le_bytes(data, u32::to_le_bytes), Contents::u32_of(data))?)
    }

    fn launch(&self, l: &Launch<'_, LzBuffer>) -> Result<()> {
        Ok(self.launch_kernel(l)?)
    }

    fn plans(&self) -> &PlanCache<LzBuffer> {
        &self.plans
    }

    fn tuning(&self) -> KernelTuning {
        self.tuning.get()
    }
}

impl LevelZeroBackend {
    /// Copies the first `out.len()` values of `buf` to the host once the stream has run every earlier op.
    fn read<T: bytemuck::Pod>(&self, buf: &LzBuffer, out: &mut [T]) -> Result<()> {
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(out);
        {
            let mut s = self.stream()?;
            if !bytes.is_empty() {
                s.copy(bytes.as_mut_ptr().cast(), buf.device_ptr(), bytes.len())?;
            }
            s.synchronize()?;
        }
        self.read_back.set(self.read_back.get() + bytes.len() as u64);
        // The stream is idle: a good moment to give surplus cached memory back.
        if self.pool.usage().1 > CACHE_KEEP_BYTES {
            self.pool.trim(CACHE_KEEP_BYTES);
        }
        Ok(())
    }
}

impl Backend for LevelZeroBackend {
    type Buffer = LzBuffer;
    type Recording = LzRecording;

    fn device_name(&self) -> String {
        self.label.clone()
    }

    fn upload_weight(&self, t: &Tensor) -> Result<LzBuffer> {
        match weight_data(t)? {
            WeightData::Vector(v) => self.upload_f32(&v),
            WeightData::Matrix { bytes, contents } => Ok(self.upload_bytes(bytes, contents)?),
        }
    }

    fn alloc_f32(&self, len: usize) -> Result<LzBuffer> {
        let buf = self.buffer(len * 4, Contents::F32 { len })?;
        if len > 0 {
            self.stream()?.zero(buf.device_ptr(), len * 4)?;
        }
        Ok(buf)
    }

    fn upload_f32(&self, data: &[f32]) -> Result<LzBuffer> {
        Ok(self.upload_bytes(le_bytes(data, f32::to_le_bytes), Contents::F32 { len: data.len() })?)
    }

    fn kv_cache_dtype(&self, compute: WeightDType) -> WeightDType {
        // vLLM's `auto`: the model's type (the attention and cache-write kernels have 16-bit entry points).
        compute
    }

    fn alloc_matmul_input(&self, len: usize, w: &LzBuffer) -> Result<LzBuffer> {
        match w.contents {
            // The matmul kernels' `_x16` entry points read activations in the weight's 16-bit type: the producer
            // writes them so (half the bytes between the ops, as on CUDA). Not where bf16 weights multiply on XMX:
            // that kernel takes f32 activations and rounds them to bf16 as it loads them.
            Contents::Matrix { dtype: dtype @ (WeightDType::BF16 | WeightDType::F16), .. }
                if !(dtype == WeightDType::BF16 && self.tuning.get().matmul == kernels::MatmulPath::Xmx) =>
            {
                Ok(self.buffer(len * 2, Contents::Half { dtype, len })?)
            }
            _ => self.alloc_f32_scratch(len),
        }
    }

    fn alloc_kv_cache(&self, len: usize, dtype: WeightDType) -> Result<LzBuffer> {
        if dtype == WeightDType::F32 {
            return self.alloc_f32(len);
        }
        let buf = self.buffer(len * 2, Contents::Half { dtype, len })?;
        if len > 0 {
            self.stream()?.zero(buf.device_ptr(), len * 2)?;
        }
        Ok(buf)
    }

    fn alloc_u32_output(&self, len: usize) -> Result<LzBuffer> {
        Ok(self.buffer(len * 4, Contents::U32 { len, bound: u32::MAX })?)
    }

    fn upload_u32(&self, data: &[u32]) -> Result<LzBuffer> {
        KernelDevice::upload_indices(self, data)
    }

    fn download_f32(&self, buf: &LzBuffer) -> Result<Vec<f32>> {
        let Contents::F32 { len } = buf.contents else {
            return Err(BackendError::Device("download_f32: expected an f32 buffer".into()));
        };
        let mut out = vec![0f32; len];
        self.read(buf, &mut out)?;
        Ok(out)
    }

    fn download_u32(&self, buf: &LzBuffer, len: usize) -> Result<Vec<u32>> {
        let Contents::U32 { len: have, .. } = buf.contents else {
            return Err(BackendError::Device("download_u32: expected a u32 buffer".into()));
        };
        if len > have {
            return Err(BackendError::Device(format!("download_u32: {len} values of a buffer of {have}")));
        }
        let mut out = vec![0u32; len];
        self.read(buf, &mut out)?;
        Ok(out)
    }

    fn bytes_read_back(&self) -> u64 {
        self.read_back.get()
    }

    fn run(&self, op: Op<'_, LzBuffer>) -> Result<()> {
        kernels::run(self, op)
    }

    fn records(&self) -> bool {
        true
    }

    fn begin_recording(&self) -> Result<()> {
        self.stream()?.begin_recording()?;
        self.pool.set_recording(true);
        Ok(())
    }

    fn end_recording(&self) -> Result<LzRecording> {
        self.pool.set_recording(false);
        let rec = self.stream()?.end_recording()?;
        Ok(LzRecording { rec, _plan: self.plans.take() })
    }

    fn replay(&self, r: &LzRecording, _timed: bool) -> Result<()> {
        Ok(self.stream()?.replay(&r.rec)?)
    }

    fn decode_partitions(&self, longest: usize, rows: usize) -> usize {
        self.tuning.get().decode_parts(longest, rows)
    }

    fn write_inputs(&self, _owner: Option<&LzBuffer>, views: &mut [&mut LzBuffer], parts: &[&[u32]]) -> Result<()> {
        if views.len() != parts.len() {
            return Err(BackendError::Device("write_inputs: one part per buffer".into()));
        }
        let mut s = self.stream()?;
        for (view, part) in views.iter_mut().zip(parts) {
            if part.len() * 4 > view.bytes() {
                return Err(BackendError::Device(format!(
                    "write_inputs: {} values do not fit a buffer of {} bytes",
                    part.len(),
                    view.bytes()
                )));
            }
            // In place: recordings read these buffers.
            s.upload(view.device_ptr(), le_bytes(part, u32::to_le_bytes))?;
            view.contents = Contents::u32_of(part);
        }
        Ok(())
    }
}

/// A decode step recorded on Level Zero: its regular command list and the attention work split it reads.
pub struct LzRecording {
    // Field order is drop order: the list (which waits for the queue) before the plan's buffers.
    rec: Recorded,
    _plan: Option<kernels::AttnPlan<LzBuffer>>,
}

impl LzRecording {
    /// Commands the step recorded (launches and fills).
    pub fn commands(&self) -> u64 {
        self.rec.commands
    }
}
