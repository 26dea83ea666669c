//! `cl_khr_command_buffer`: a step's commands recorded once into a command-buffer and enqueued again as one command.
//!
//! opencl3 opens libOpenCL at run time, and the ICD loader exports no extension functions, so the entry points come
//! from `clGetExtensionFunctionAddressForPlatform` and are called through the extension header's typed function
//! pointers (opencl-sys's, re-exported by cl3). Only version 1.0.0 of the extension is used: its provisional versions
//! (0.9.x) declared some of these functions with other parameter lists.
//!
//! What the extension guarantees and this file relies on:
//! - kernel arguments are captured when a command is recorded (`clCommandNDRangeKernelKHR`), so setting the same
//!   kernel's arguments again for later launches changes nothing recorded;
//! - a command-buffer records for the one queue it is created with, whose properties must include the device's
//!   `CL_DEVICE_COMMAND_BUFFER_REQUIRED_QUEUE_PROPERTIES_KHR` (`CommandBufferApi::load` refuses a device that requires
//!   a property our queue lacks); without `cl_khr_command_buffer_multi_device` each command's queue argument is NULL;
//! - recorded commands are ordered only by sync points: each command here waits for the one recorded before it;
//! - enqueued on an in-order queue, a command-buffer runs after every command enqueued before it and before every
//!   command enqueued after it;
//! - `clReleaseCommandBufferKHR` deletes a command-buffer only once it has finished executing.

use std::ffi::{c_void, CStr};
use std::ptr;

use cl3::ext::{
    clCommandFillBufferKHR_fn, clCommandNDRangeKernelKHR_fn, clCreateCommandBufferKHR_fn, clEnqueueCommandBufferKHR_fn,
    clFinalizeCommandBufferKHR_fn, clReleaseCommandBufferKHR_fn, cl_command_buffer_khr, cl_sync_point_khr,
};
use opencl3::device::Device;
use opencl3::error_codes::ClError;
use opencl3::error_codes::CL_SUCCESS;
use opencl3::types::{cl_command_queue, cl_int, cl_kernel, cl_mem, cl_platform_id};

const EXTENSION: &str = "cl_khr_command_buffer";
/// `CL_MAKE_VERSION(1, 0, 0)`: the extension version whose entry points are declared as the header declares them.
const VERSION_1_0: u32 = 1 << 22;

/// The function pointer inside an extension header's `Option<unsafe extern "C" fn ...>` typedef.
trait Inner {
    type Fn;
}
impl<F> Inner for Option<F> {
    type Fn = F;
}

type CreateFn = <clCreateCommandBufferKHR_fn as Inner>::Fn;
type NdRangeFn = <clCommandNDRangeKernelKHR_fn as Inner>::Fn;
type FillFn = <clCommandFillBufferKHR_fn as Inner>::Fn;
type FinalizeFn = <clFinalizeCommandBufferKHR_fn as Inner>::Fn;
type EnqueueFn = <clEnqueueCommandBufferKHR_fn as Inner>::Fn;
type ReleaseFn = <clReleaseCommandBufferKHR_fn as Inner>::Fn;

/// The extension's entry points on one platform, every one of them loaded.
#[derive(Clone, Copy)]
pub(super) struct CommandBufferApi {
    create: CreateFn,
    nd_range: NdRangeFn,
    fill: FillFn,
    finalize: FinalizeFn,
    enqueue: EnqueueFn,
    release: ReleaseFn,
}

impl CommandBufferApi {
    /// The entry points for `device`, whose queue is created with `queue_properties`; Err says why the device records
    /// nothing (extension absent or of another version, a required queue property missing, an entry point absent).
    pub(super) fn load(device: &Device, queue_properties: u64) -> Result<Self, String> {
        let versions = device.extensions_with_version().map_err(|e| format!("querying its extensions: {e}"))?;
        let version = versions
            .iter()
            .find(|v| name_of(&v.name) == EXTENSION)
            .map(|v| v.version)
            .ok_or_else(|| format!("the device does not advertise {EXTENSION}"))?;
        if version < VERSION_1_0 {
            return Err(format!(
                "the device has {EXTENSION} {}.{}.{}, a provisional version (1.0.0 is needed)",
                version >> 22,
                (version >> 12) & 0x3ff,
                version & 0xfff
            ));
        }
        let required = device
            .device_command_buffer_required_queue_properties_khr()
            .map_err(|e| format!("querying the queue properties command-buffers require: {e}"))?;
        if required & !queue_properties != 0 {
            return Err(format!(
                "command-buffers need queue properties {required:#x}, the backend's queue has {queue_properties:#x}"
            ));
        }
        let platform = device.platform().map_err(|e| format!("querying its platform: {e}"))?;
        // SAFETY: each type is the header's declaration of the entry point of that name (extension version 1.0.0,
        // checked above).
        unsafe {
            Ok(Self {
                create: entry(platform, c"clCreateCommandBufferKHR")?,
                nd_range: entry(platform, c"clCommandNDRangeKernelKHR")?,
                fill: entry(platform, c"clCommandFillBufferKHR")?,
                finalize: entry(platform, c"clFinalizeCommandBufferKHR")?,
                enqueue: entry(platform, c"clEnqueueCommandBufferKHR")?,
                release: entry(platform, c"clReleaseCommandBufferKHR")?,
            })
        }
    }
}

/// The name in a `cl_name_version` (NUL-terminated within its fixed array).
fn name_of(name: &[u8]) -> String {
    let end = name.iter().position(|&c| c == 0).unwrap_or(name.len());
    String::from_utf8_lossy(&name[..end]).into_owned()
}

/// Entry point `name` of `platform` as a function pointer of type `F`.
///
/// # Safety
/// `F` must be a function pointer type matching the entry point's C declaration.
unsafe fn entry<F: Copy>(platform: cl_platform_id, name: &CStr) -> Result<F, String> {
    const { assert!(size_of::<F>() == size_of::<*mut c_void>()) };
    let lib = cl3::load_library().as_ref().map_err(|e| format!("the OpenCL library: {e}"))?;
    let address = lib
        .clGetExtensionFunctionAddressForPlatform(platform, name.as_ptr())
        .ok_or("the OpenCL library has no clGetExtensionFunctionAddressForPlatform")?;
    if address.is_null() {
        return Err(format!("the platform has no {}", name.to_string_lossy()));
    }
    // SAFETY: a non-null address of the entry point; the caller vouches for its type.
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&address) })
}

fn check(status: cl_int) -> Result<(), ClError> {
    if status == CL_SUCCESS {
        Ok(())
    } else {
        Err(ClError(status))
    }
}

/// One command-buffer: recording until `finalize`, then enqueued any number of times. Released when dropped.
pub(super) struct CommandBuffer {
    raw: cl_command_buffer_khr,
    api: CommandBufferApi,
    /// The sync point of the last recorded command, which the next one waits for.
    last: Option<cl_sync_point_khr>,
    commands: u64,
}

// SAFETY: OpenCL objects may be used from any thread (the OpenCL API is thread-safe for everything but setting one
// kernel's arguments from two threads); the backend uses a command-buffer from one thread at a time.
unsafe impl Send for CommandBuffer {}

impl CommandBuffer {
    /// A new command-buffer recording for `queue` (which must outlive it).
    pub(super) fn new(api: CommandBufferApi, queue: cl_command_queue) -> Result<Self, ClError> {
        let mut status = CL_SUCCESS;
        // SAFETY: one valid queue; no properties (the defaults: no simultaneous use, which the backend never needs:
        // the blocking writes of a step's inputs before each enqueue wait until the previous enqueue has run).
        let raw = unsafe { (api.create)(1, &queue, ptr::null(), &mut status) };
        check(status)?;
        Ok(Self { raw, api, last: None, commands: 0 })
    }

    /// Commands recorded.
    pub(super) fn commands(&self) -> u64 {
        self.commands
    }

    /// (wait list length, wait list pointer, where the new command's sync point goes) for the next command.
    fn chain(&mut self) -> (u32, *const cl_sync_point_khr) {
        match &self.last {
            Some(p) => (1, p as *const cl_sync_point_khr),
            None => (0, ptr::null()),
        }
    }

    /// Records a launch of `kernel` with the arguments it has now, over `global` work-items in groups of `local`.
    pub(super) fn kernel(&mut self, kernel: cl_kernel, global: &[usize; 3], local: &[usize; 3]) -> Result<(), ClError> {
        let (n, wait) = self.chain();
        let mut point: cl_sync_point_khr = 0;
        // SAFETY: a recording command-buffer and a valid kernel whose arguments are all set; the sizes point to three
        // values each (work_dim 3); the wait list holds `n` sync points of this command-buffer.
        let status = unsafe {
            (self.api.nd_range)(
                self.raw,
                ptr::null_mut(),
                ptr::null(),
                kernel,
                3,
                ptr::null(),
                global.as_ptr(),
                local.as_ptr(),
                n,
                wait,
                &mut point,
                ptr::null_mut(),
            )
        };
        check(status)?;
        self.last = Some(point);
        self.commands += 1;
        Ok(())
    }

    /// Records a fill of the first `bytes` bytes of `mem` (a multiple of the pattern's size) with `pattern`.
    pub(super) fn fill(&mut self, mem: cl_mem, pattern: &[u8], bytes: usize) -> Result<(), ClError> {
        let (n, wait) = self.chain();
        let mut point: cl_sync_point_khr = 0;
        // SAFETY: a recording command-buffer and a buffer of at least `bytes` bytes; the pattern is copied when the
        // command is recorded.
        let status = unsafe {
            (self.api.fill)(
                self.raw,
                ptr::null_mut(),
                ptr::null(),
                mem,
                pattern.as_ptr().cast(),
                pattern.len(),
                0,
                bytes,
                n,
                wait,
                &mut point,
                ptr::null_mut(),
            )
        };
        check(status)?;
        self.last = Some(point);
        self.commands += 1;
        Ok(())
    }

    /// Ends recording: the command-buffer becomes executable.
    pub(super) fn finalize(&mut self) -> Result<(), ClError> {
        // SAFETY: a valid command-buffer.
        check(unsafe { (self.api.finalize)(self.raw) })
    }

    /// Enqueues the finalized command-buffer on the queue it was created for.
    pub(super) fn enqueue(&self) -> Result<(), ClError> {
        // SAFETY: a valid, finalized command-buffer; no queues given (its own), no events.
        check(unsafe { (self.api.enqueue)(0, ptr::null_mut(), self.raw, 0, ptr::null(), ptr::null_mut()) })
    }
}

impl Drop for CommandBuffer {
    fn drop(&mut self) {
        // SAFETY: the one reference this value holds; the runtime deletes it once it has finished executing.
        let status = unsafe { (self.api.release)(self.raw) };
        if status != CL_SUCCESS {
            tracing::warn!("opencl: releasing a command-buffer failed: {}", ClError(status));
        }
    }
}
