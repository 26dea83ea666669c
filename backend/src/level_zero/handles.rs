//! Safe owners of Level Zero objects: context, module (with its build log), kernel, immediate command list, event
//! pool and event, and raw device allocations (with relaxed size limits where asked). Each owner destroys its handle
//! in `Drop` and holds an `Arc` to its parent, so children are always destroyed before the context they live in.
//! Every creation and successful destruction is counted (`counters`).

use std::ffi::{c_void, CString};
use std::ptr;
use std::sync::Arc;

use level_zero_sys as sys;

use super::aot::ModuleFormat;
use super::counters::{self, HandleKind};
use super::error::LzError;
use super::loader::{ze, Api};

type Result<T> = std::result::Result<T, LzError>;

fn destroyed_or_warn(kind: HandleKind, r: Result<()>) {
    match r {
        Ok(()) => counters::destroyed(kind),
        Err(e) => tracing::warn!("Level Zero: destroying a {kind:?} failed: {e}"),
    }
}

/// A Level Zero context on one device (the device handle is owned by the driver and never destroyed).
pub struct Context {
    pub(crate) api: &'static Api,
    pub(crate) raw: sys::ze_context_handle_t,
    pub(crate) device: sys::ze_device_handle_t,
}

// SAFETY: contexts and device handles are thread-safe Level Zero objects.
unsafe impl Send for Context {}
unsafe impl Sync for Context {}

impl Context {
    pub fn new(
        api: &'static Api,
        driver: sys::ze_driver_handle_t,
        device: sys::ze_device_handle_t,
    ) -> Result<Arc<Self>> {
        let desc = sys::ze_context_desc_t { stype: sys::ZE_STRUCTURE_TYPE_CONTEXT_DESC, pNext: ptr::null(), flags: 0 };
        let mut raw: sys::ze_context_handle_t = ptr::null_mut();
        // SAFETY: valid driver handle, descriptor and out pointer.
        unsafe { ze!(api, zeContextCreate(driver, &desc, &mut raw))? };
        counters::created(HandleKind::Context);
        Ok(Arc::new(Self { api, raw, device }))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every child holds an Arc to this context, so none is alive here.
        destroyed_or_warn(HandleKind::Context, unsafe { ze!(self.api, zeContextDestroy(self.raw)) });
    }
}

/// A module built from SPIR-V or a native binary.
pub struct Module {
    ctx: Arc<Context>,
    raw: sys::ze_module_handle_t,
    pub name: String,
}

// SAFETY: modules are immutable once built.
unsafe impl Send for Module {}
unsafe impl Sync for Module {}

/// Reads and destroys a build log; empty when the driver left none.
fn take_build_log(api: &'static Api, log: sys::ze_module_build_log_handle_t) -> Result<String> {
    if log.is_null() {
        return Ok(String::new());
    }
    counters::created(HandleKind::BuildLog);
    let mut size: usize = 0;
    // SAFETY: valid log handle; a null buffer asks for the size.
    let read = unsafe { ze!(api, zeModuleBuildLogGetString(log, &mut size, ptr::null_mut())) }.and_then(|()| {
        if size == 0 {
            return Ok(String::new());
        }
        let mut buf = vec![0u8; size];
        // SAFETY: the buffer holds `size` bytes.
        unsafe { ze!(api, zeModuleBuildLogGetString(log, &mut size, buf.as_mut_ptr().cast()))? };
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        Ok(String::from_utf8_lossy(&buf[..end]).trim().to_string())
    });
    // SAFETY: the log is not used after this.
    destroyed_or_warn(HandleKind::BuildLog, unsafe { ze!(api, zeModuleBuildLogDestroy(log)) });
    read
}

impl Module {
    /// Builds a module for the context's device from SPIR-V (`ZE_MODULE_FORMAT_IL_SPIRV`) or a native binary
    /// (`ZE_MODULE_FORMAT_NATIVE`, where the driver ignores the build flags). A build failure returns the driver's
    /// build log.
    pub fn create(
        ctx: &Arc<Context>,
        name: &str,
        format: ModuleFormat,
        input: &[u8],
        build_flags: &str,
    ) -> Result<Arc<Self>> {
        let api = ctx.api;
        let flags =
            CString::new(build_flags).map_err(|_| LzError::Invalid("module build flags contain a NUL".into()))?;
        let desc = sys::ze_module_desc_t {
            stype: sys::ZE_STRUCTURE_TYPE_MODULE_DESC,
            pNext: ptr::null(),
            format: match format {
                ModuleFormat::Spirv => sys::ZE_MODULE_FORMAT_IL_SPIRV,
                ModuleFormat::Native => sys::ZE_MODULE_FORMAT_NATIVE,
            },
            inputSize: input.len(),
            pInputModule: input.as_ptr(),
            pBuildFlags: flags.as_ptr(),
            pConstants: ptr::null(),
        };
        let mut raw: sys::ze_module_handle_t = ptr::null_mut();
        let mut log: sys::ze_module_build_log_handle_t = ptr::null_mut();
        // SAFETY: the descriptor points at `input` and `flags`, both alive for the call.
        let created = unsafe { ze!(api, zeModuleCreate(ctx.raw, ctx.device, &desc, &mut raw, &mut log)) };
        let log_text = take_build_log(api, log);
        match created {
            Ok(()) => {
                counters::created(HandleKind::Module);
                let module = Arc::new(Self { ctx: ctx.clone(), raw, name: name.to_string() });
                if let Ok(text) = &log_text {
                    if !text.is_empty() {
                        tracing::debug!("Level Zero build log of module {name}: {text}");
                    }
                }
                log_text?;
                Ok(module)
            }
            Err(e) => {
                let text = log_text.unwrap_or_default();
                let log = if text.is_empty() { format!("{e} (the driver gave no build log)") } else { text };
                Err(LzError::ModuleBuild { module: name.to_string(), log })
            }
        }
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: kernels hold an Arc to their module, so none is alive here.
        destroyed_or_warn(HandleKind::Module, unsafe { ze!(self.ctx.api, zeModuleDestroy(self.raw)) });
    }
}

/// What the driver reports about a compiled kernel.
#[derive(Debug, Clone, Copy, Default)]
pub struct KernelInfo {
    /// Declared arguments (0 when the driver does not say, as the null driver).
    pub num_args: u32,
    /// The sub-group size the kernel requires (0: the compiler chose).
    pub required_subgroup_size: u32,
    /// Bytes of registers spilled to memory (a performance warning on real hardware).
    pub spill_mem: u32,
}

/// One kernel of a module. Arguments are state of the kernel object; a launch captures them when it is appended.
pub struct Kernel {
    module: Arc<Module>,
    pub(crate) raw: sys::ze_kernel_handle_t,
    pub name: String,
    pub info: KernelInfo,
}

// SAFETY: a kernel is used by one thread at a time (the backend that owns it is not Sync).
unsafe impl Send for Kernel {}

impl Kernel {
    pub fn new(module: &Arc<Module>, name: &str) -> Result<Self> {
        let api = module.ctx.api;
        let cname = CString::new(name).map_err(|_| LzError::Invalid(format!("kernel name {name:?} contains a NUL")))?;
        let desc = sys::ze_kernel_desc_t {
            stype: sys::ZE_STRUCTURE_TYPE_KERNEL_DESC,
            pNext: ptr::null(),
            flags: 0,
            pKernelName: cname.as_ptr(),
        };
        let mut raw: sys::ze_kernel_handle_t = ptr::null_mut();
        // SAFETY: valid module, descriptor (name alive for the call) and out pointer.
        unsafe { ze!(api, zeKernelCreate(module.raw, &desc, &mut raw)) }
            .map_err(|e| LzError::Invalid(format!("kernel {name} of module {}: {e}", module.name)))?;
        counters::created(HandleKind::Kernel);
        let mut kernel = Self { module: module.clone(), raw, name: name.to_string(), info: KernelInfo::default() };
        let mut props =
            sys::ze_kernel_properties_t { stype: sys::ZE_STRUCTURE_TYPE_KERNEL_PROPERTIES, ..Default::default() };
        // SAFETY: valid kernel and properties struct.
        unsafe { ze!(api, zeKernelGetProperties(raw, &mut props))? };
        kernel.info = KernelInfo {
            num_args: props.numKernelArgs,
            required_subgroup_size: props.requiredSubgroupSize,
            spill_mem: props.spillMemSize,
        };
        Ok(kernel)
    }

    fn api(&self) -> &'static Api {
        self.module.ctx.api
    }

    pub fn set_group_size(&self, x: u32, y: u32, z: u32) -> Result<()> {
        // SAFETY: valid kernel.
        unsafe { ze!(self.api(), zeKernelSetGroupSize(self.raw, x, y, z)) }
    }

    /// Sets a global-memory pointer argument (null allowed: the kernel must not read it).
    pub fn set_arg_ptr(&self, index: u32, p: *mut c_void) -> Result<()> {
        let value: *const c_void = if p.is_null() { ptr::null() } else { (&p as *const *mut c_void).cast() };
        // SAFETY: `value` points at a pointer-sized value alive for the call (arguments are copied).
        unsafe { ze!(self.api(), zeKernelSetArgumentValue(self.raw, index, std::mem::size_of::<*mut c_void>(), value)) }
    }

    pub fn set_arg_u32(&self, index: u32, v: u32) -> Result<()> {
        // SAFETY: `v` is alive for the call (arguments are copied).
        unsafe { ze!(self.api(), zeKernelSetArgumentValue(self.raw, index, 4, (&v as *const u32).cast())) }
    }

    pub fn set_arg_f32(&self, index: u32, v: f32) -> Result<()> {
        // SAFETY: `v` is alive for the call (arguments are copied).
        unsafe { ze!(self.api(), zeKernelSetArgumentValue(self.raw, index, 4, (&v as *const f32).cast())) }
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        // SAFETY: launches captured the kernel's state when appended; the stream is synchronised before kernels drop.
        destroyed_or_warn(HandleKind::Kernel, unsafe { ze!(self.api(), zeKernelDestroy(self.raw)) });
    }
}

/// An asynchronous queue of normal priority on command-queue group `ordinal`, queue 0 (an immediate list's or a
/// command queue's).
fn queue_desc(ordinal: u32) -> sys::ze_command_queue_desc_t {
    sys::ze_command_queue_desc_t {
        stype: sys::ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC,
        pNext: ptr::null(),
        ordinal,
        index: 0,
        flags: 0,
        mode: sys::ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS,
        priority: sys::ZE_COMMAND_QUEUE_PRIORITY_NORMAL,
    }
}

/// A command list: immediate (commands start executing as they are appended) or regular (recorded, closed, then
/// executed on a `CommandQueue` as often as needed).
pub struct CommandList {
    pub(crate) ctx: Arc<Context>,
    pub(crate) raw: sys::ze_command_list_handle_t,
}

// SAFETY: a command list is used by one thread at a time (its `Stream` is not Sync).
unsafe impl Send for CommandList {}

impl CommandList {
    /// An asynchronous immediate command list on command-queue group `ordinal`, queue 0.
    pub fn immediate(ctx: &Arc<Context>, ordinal: u32) -> Result<Self> {
        let desc = queue_desc(ordinal);
        let mut raw: sys::ze_command_list_handle_t = ptr::null_mut();
        // SAFETY: valid context, device, descriptor and out pointer.
        unsafe { ze!(ctx.api, zeCommandListCreateImmediate(ctx.raw, ctx.device, &desc, &mut raw))? };
        counters::created(HandleKind::CommandList);
        Ok(Self { ctx: ctx.clone(), raw })
    }
}

impl CommandList {
    /// A regular command list for command-queue group `ordinal`, to be recorded once and executed many times.
    pub fn regular(ctx: &Arc<Context>, ordinal: u32) -> Result<Self> {
        let desc = sys::ze_command_list_desc_t {
            stype: sys::ZE_STRUCTURE_TYPE_COMMAND_LIST_DESC,
            pNext: ptr::null(),
            commandQueueGroupOrdinal: ordinal,
            flags: 0,
        };
        let mut raw: sys::ze_command_list_handle_t = ptr::null_mut();
        // SAFETY: valid context, device, descriptor and out pointer.
        unsafe { ze!(ctx.api, zeCommandListCreate(ctx.raw, ctx.device, &desc, &mut raw))? };
        counters::created(HandleKind::CommandList);
        Ok(Self { ctx: ctx.clone(), raw })
    }

    /// Ends the recording of a regular list: it may be executed from now on.
    pub fn close(&self) -> Result<()> {
        // SAFETY: valid regular command list.
        unsafe { ze!(self.ctx.api, zeCommandListClose(self.raw)) }
    }
}

/// A command queue: executes closed regular command lists, in submission order.
pub struct CommandQueue {
    ctx: Arc<Context>,
    raw: sys::ze_command_queue_handle_t,
}

// SAFETY: a queue is used by one thread at a time (the backend's stream and its recordings, on the engine thread).
unsafe impl Send for CommandQueue {}
unsafe impl Sync for CommandQueue {}

impl CommandQueue {
    /// An asynchronous queue on command-queue group `ordinal`, queue 0.
    pub fn new(ctx: &Arc<Context>, ordinal: u32) -> Result<Arc<Self>> {
        let desc = queue_desc(ordinal);
        let mut raw: sys::ze_command_queue_handle_t = ptr::null_mut();
        // SAFETY: valid context, device, descriptor and out pointer.
        unsafe { ze!(ctx.api, zeCommandQueueCreate(ctx.raw, ctx.device, &desc, &mut raw))? };
        counters::created(HandleKind::CommandQueue);
        Ok(Arc::new(Self { ctx: ctx.clone(), raw }))
    }

    /// Starts executing the closed regular list `list` after the lists executed before it.
    pub fn execute(&self, list: &CommandList) -> Result<()> {
        let mut raw = list.raw;
        // SAFETY: valid queue and one closed command list of the queue's ordinal; no fence.
        unsafe { ze!(self.ctx.api, zeCommandQueueExecuteCommandLists(self.raw, 1, &mut raw, ptr::null_mut())) }
    }

    /// Blocks until every list executed on the queue has completed.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: valid queue; u64::MAX waits without a time limit.
        unsafe { ze!(self.ctx.api, zeCommandQueueSynchronize(self.raw, u64::MAX)) }
    }
}

impl Drop for CommandQueue {
    fn drop(&mut self) {
        let _ = self.synchronize();
        // SAFETY: idle queue (synchronised above); lists executed on it hold an Arc to it.
        destroyed_or_warn(HandleKind::CommandQueue, unsafe { ze!(self.ctx.api, zeCommandQueueDestroy(self.raw)) });
    }
}

impl Drop for CommandList {
    fn drop(&mut self) {
        // SAFETY: the owning stream synchronised before dropping the list.
        destroyed_or_warn(HandleKind::CommandList, unsafe { ze!(self.ctx.api, zeCommandListDestroy(self.raw)) });
    }
}

/// A pool of host-visible events.
pub struct EventPool {
    ctx: Arc<Context>,
    raw: sys::ze_event_pool_handle_t,
}

// SAFETY: event pools are thread-safe Level Zero objects.
unsafe impl Send for EventPool {}
unsafe impl Sync for EventPool {}

impl EventPool {
    pub fn new(ctx: &Arc<Context>, count: u32) -> Result<Arc<Self>> {
        let desc = sys::ze_event_pool_desc_t {
            stype: sys::ZE_STRUCTURE_TYPE_EVENT_POOL_DESC,
            pNext: ptr::null(),
            flags: sys::ZE_EVENT_POOL_FLAG_HOST_VISIBLE,
            count,
        };
        let mut raw: sys::ze_event_pool_handle_t = ptr::null_mut();
        let mut device = ctx.device;
        // SAFETY: valid context, descriptor, one device handle and out pointer.
        unsafe { ze!(ctx.api, zeEventPoolCreate(ctx.raw, &desc, 1, &mut device, &mut raw))? };
        counters::created(HandleKind::EventPool);
        Ok(Arc::new(Self { ctx: ctx.clone(), raw }))
    }
}

impl Drop for EventPool {
    fn drop(&mut self) {
        // SAFETY: events hold an Arc to their pool, so none is alive here.
        destroyed_or_warn(HandleKind::EventPool, unsafe { ze!(self.ctx.api, zeEventPoolDestroy(self.raw)) });
    }
}

/// One event of a pool, signalled by the device and waited on by later commands or by the host.
pub struct Event {
    pool: Arc<EventPool>,
    pub(crate) raw: sys::ze_event_handle_t,
}

// SAFETY: events are thread-safe Level Zero objects.
unsafe impl Send for Event {}
unsafe impl Sync for Event {}

impl Event {
    pub fn new(pool: &Arc<EventPool>, index: u32) -> Result<Self> {
        let desc = sys::ze_event_desc_t {
            stype: sys::ZE_STRUCTURE_TYPE_EVENT_DESC,
            pNext: ptr::null(),
            index,
            // Visible to the host after the command completes; later commands on the same device see it too.
            signal: sys::ZE_EVENT_SCOPE_FLAG_HOST,
            wait: sys::ZE_EVENT_SCOPE_FLAG_HOST,
        };
        let mut raw: sys::ze_event_handle_t = ptr::null_mut();
        // SAFETY: valid pool, descriptor and out pointer.
        unsafe { ze!(pool.ctx.api, zeEventCreate(pool.raw, &desc, &mut raw))? };
        counters::created(HandleKind::Event);
        Ok(Self { pool: pool.clone(), raw })
    }

    /// Back to the not-signalled state (only when no pending command signals or waits on it).
    pub fn host_reset(&self) -> Result<()> {
        // SAFETY: valid event.
        unsafe { ze!(self.pool.ctx.api, zeEventHostReset(self.raw)) }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: the owning stream synchronised before dropping its events.
        destroyed_or_warn(HandleKind::Event, unsafe { ze!(self.pool.ctx.api, zeEventDestroy(self.raw)) });
    }
}

/// Allocates `bytes` (> 0) of device memory aligned to `align`. With `relaxed`, the descriptor chains
/// `ze_relaxed_allocation_limits_exp_desc_t` (`ZE_RELAXED_ALLOCATION_LIMITS_EXP_FLAG_MAX_SIZE`), which lets the size
/// exceed the device's `maxMemAllocSize`; only for drivers that advertise the extension (the caller checks).
pub fn alloc_device(ctx: &Context, bytes: usize, align: usize, relaxed: bool) -> Result<*mut c_void> {
    let limits = sys::ze_relaxed_allocation_limits_exp_desc_t {
        stype: sys::ZE_STRUCTURE_TYPE_RELAXED_ALLOCATION_LIMITS_EXP_DESC,
        pNext: ptr::null(),
        flags: sys::ZE_RELAXED_ALLOCATION_LIMITS_EXP_FLAG_MAX_SIZE,
    };
    let desc = sys::ze_device_mem_alloc_desc_t {
        stype: sys::ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC,
        pNext: if relaxed {
            (&limits as *const sys::ze_relaxed_allocation_limits_exp_desc_t).cast()
        } else {
            ptr::null()
        },
        flags: 0,
        ordinal: 0,
    };
    let mut p: *mut c_void = ptr::null_mut();
    // SAFETY: valid context, device, descriptor (its chained struct alive for the call) and out pointer.
    unsafe { ze!(ctx.api, zeMemAllocDevice(ctx.raw, &desc, bytes, align, ctx.device, &mut p))? };
    if p.is_null() {
        return Err(LzError::Invalid(format!("zeMemAllocDevice succeeded but returned no memory for {bytes} bytes")));
    }
    counters::created(HandleKind::DeviceMemory);
    if relaxed {
        counters::relaxed_allocation();
    }
    Ok(p)
}

/// Frees an allocation of `alloc_device` (no command may still use it).
pub fn free_device(ctx: &Context, p: *mut c_void) {
    // SAFETY: `p` came from alloc_device on this context and is freed once.
    destroyed_or_warn(HandleKind::DeviceMemory, unsafe { ze!(ctx.api, zeMemFree(ctx.raw, p)) });
}
