//! The kernels on one device: every SPIR-V module of `rserve-kernels` built with `clCreateProgramWithIL`, one
//! kernel object per entry point; `set_args` sets a launch's arguments in order, `enqueue` enqueues its ND-range.

use std::collections::HashMap;

use opencl3::command_queue::CommandQueue;
use opencl3::context::Context;
use opencl3::device::Device;
use opencl3::kernel::Kernel;
use opencl3::program::Program;
use rserve_kernels::work_group;

use super::buffer::ClBuffer;
use super::cl_err;
use crate::error::{BackendError, Result};
use crate::kernels::{Arg, Launch};

/// Built programs and their kernels by entry-point name.
pub(super) struct Kernels {
    // Kernels are declared before programs so they are released first.
    kernels: HashMap<&'static str, Kernel>,
    _programs: Vec<Program>,
}

impl Kernels {
    pub(super) fn build(ctx: &Context, dev: &Device, device_name: &str) -> Result<Self> {
        let mut programs = Vec::new();
        let mut kernels = HashMap::new();
        for (module, names) in rserve_kernels::KERNELS {
            // The matrix-engine module is Level Zero's on PVC; OpenCL runs its emulated form (`xmx_emu`).
            if rserve_kernels::target(module) == rserve_kernels::Target::MatrixEngine {
                continue;
            }
            let t0 = std::time::Instant::now();
            let m = rserve_kernels::module(module)
                .ok_or_else(|| BackendError::Device(format!("opencl: kernel module {module} is not embedded")))?;
            let mut p =
                Program::create_from_il(ctx, m.spirv).map_err(|e| cl_err(&format!("loading {module}.spv"), e))?;
            if let Err(e) = p.build(&[dev.id()], "") {
                let log = p.get_build_log(dev.id()).unwrap_or_default();
                return Err(BackendError::Device(format!(
                    "opencl: building {module}.spv for '{device_name}' failed ({e}):\n{log}"
                )));
            }
            for &name in names.iter() {
                let k = Kernel::create(&p, name).map_err(|e| cl_err(&format!("creating kernel {name}"), e))?;
                let max = k.get_work_group_size(dev.id()).map_err(|e| cl_err(&format!("querying kernel {name}"), e))?;
                if max < work_group(name) {
                    return Err(BackendError::Device(format!(
                        "opencl: kernel {name} runs at most {max} work-items per group on '{device_name}', it needs {}",
                        work_group(name)
                    )));
                }
                kernels.insert(name, k);
            }
            programs.push(p);
            tracing::debug!("opencl: built {module}.spv in {:.2} s", t0.elapsed().as_secs_f64());
        }
        Ok(Self { kernels, _programs: programs })
    }

    /// Sets the arguments of `l` in order: the kernel to launch or record next, or None for an empty grid (nothing
    /// to launch).
    pub(super) fn set_args(&self, l: &Launch<'_, ClBuffer>) -> Result<Option<&Kernel>> {
        let kernel = self
            .kernels
            .get(l.kernel)
            .ok_or_else(|| BackendError::Device(format!("opencl: kernel {} is not built", l.kernel)))?;
        for (i, a) in l.args.iter().enumerate() {
            // SAFETY: each value is a cl_mem, u32 or f32 matching the kernel's parameter at this index (the op layer
            // builds arguments in the order of the kernel source; a count mismatch is caught by the runtime).
            let r = unsafe {
                match a {
                    Arg::Buf(b) => kernel.set_arg(i as u32, &b.mem()),
                    Arg::U32(v) => kernel.set_arg(i as u32, v),
                    Arg::F32(v) => kernel.set_arg(i as u32, v),
                }
            };
            r.map_err(|e| cl_err(&format!("{}: argument {i}", l.kernel), e))?;
        }
        Ok((!l.global.contains(&0)).then_some(kernel))
    }
}

/// Enqueues `kernel` (its arguments set for `l` by `Kernels::set_args`) on `queue`.
pub(super) fn enqueue(queue: &CommandQueue, kernel: &Kernel, l: &Launch<'_, ClBuffer>) -> Result<()> {
    let local = [l.local, 1, 1];
    // SAFETY: every argument was set; the grid and work-group sizes are valid for the kernel (checked against its
    // maximum work-group size when it was built).
    unsafe { queue.enqueue_nd_range_kernel(kernel.get(), 3, std::ptr::null(), l.global.as_ptr(), local.as_ptr(), &[]) }
        .map(drop)
        .map_err(|e| cl_err(&format!("launching {}", l.kernel), e))
}
