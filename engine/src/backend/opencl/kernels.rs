//! The kernels on one device: every SPIR-V module of `rserve-kernels` built with `clCreateProgramWithIL`, one
//! kernel object per entry point, and `Launch`, which sets arguments in order and enqueues an ND-range.

use std::collections::HashMap;

use opencl3::command_queue::CommandQueue;
use opencl3::context::Context;
use opencl3::device::Device;
use opencl3::kernel::Kernel;
use opencl3::program::Program;
use rserve_kernels::launch::*;

use super::buffer::ClBuffer;
use super::cl_err;
use crate::error::{EngineError, Result};

/// Work-group size each kernel is launched with.
pub(super) fn work_group(kernel: &str) -> usize {
    match kernel {
        "rms_norm" | "add_rms_norm" => ROW_WG,
        "paged_attention_decode" => ATTN_WG,
        "paged_attention_prefill" => PREFILL_WG,
        k if k.starts_with("matmul_rows") => GEMV_WG,
        k if k.starts_with("matmul_vec") => GEMV_VEC_WG,
        k if k.starts_with("matmul_tiled") => GEMM_WG,
        _ => ELEM_WG,
    }
}

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
            let t0 = std::time::Instant::now();
            let m = rserve_kernels::module(module)
                .ok_or_else(|| EngineError::Backend(format!("opencl: kernel module {module} is not embedded")))?;
            let mut p = Program::create_from_il(ctx, m.spirv).map_err(|e| cl_err(&format!("loading {module}.spv"), e))?;
            if let Err(e) = p.build(&[dev.id()], "") {
                let log = p.get_build_log(dev.id()).unwrap_or_default();
                return Err(EngineError::Backend(format!(
                    "opencl: building {module}.spv for '{device_name}' failed ({e}):\n{log}"
                )));
            }
            for &name in names.iter() {
                let k = Kernel::create(&p, name).map_err(|e| cl_err(&format!("creating kernel {name}"), e))?;
                let max = k.get_work_group_size(dev.id()).map_err(|e| cl_err(&format!("querying kernel {name}"), e))?;
                if max < work_group(name) {
                    return Err(EngineError::Backend(format!(
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

    pub(super) fn launch<'a>(&'a self, name: &'static str) -> Result<Launch<'a>> {
        let kernel = self
            .kernels
            .get(name)
            .ok_or_else(|| EngineError::Backend(format!("opencl: kernel {name} is not built")))?;
        Ok(Launch { kernel, name, next: 0, err: None })
    }
}

/// One kernel launch being prepared: arguments in declaration order, then `run`.
pub(super) struct Launch<'a> {
    kernel: &'a Kernel,
    name: &'static str,
    next: u32,
    err: Option<EngineError>,
}

impl Launch<'_> {
    fn set<T>(mut self, v: &T) -> Self {
        if self.err.is_none() {
            // SAFETY: the value is a cl_mem, u32 or f32 matching the kernel's parameter at this index (the sources
            // and the launch sites are kept in step; a mismatch in count is caught by the runtime at enqueue).
            if let Err(e) = unsafe { self.kernel.set_arg(self.next, v) } {
                self.err = Some(cl_err(&format!("{}: argument {}", self.name, self.next), e));
            }
        }
        self.next += 1;
        self
    }

    pub(super) fn buf(self, b: &ClBuffer) -> Self {
        let m = b.mem();
        self.set(&m)
    }

    pub(super) fn u32(mut self, v: usize) -> Self {
        match u32::try_from(v) {
            Ok(x) => self.set(&x),
            Err(_) => {
                self.err.get_or_insert_with(|| {
                    EngineError::Backend(format!("opencl: {}: argument {} = {v} does not fit in 32 bits", self.name, self.next))
                });
                self.next += 1;
                self
            }
        }
    }

    pub(super) fn f32(self, v: f32) -> Self {
        self.set(&v)
    }

    /// Enqueues the kernel on `global` work-items (each a multiple of `local`). Empty grids launch nothing.
    pub(super) fn run(self, queue: &CommandQueue, global: [usize; 3], local: [usize; 3]) -> Result<()> {
        if let Some(e) = self.err {
            return Err(e);
        }
        if global.contains(&0) {
            return Ok(());
        }
        // SAFETY: every argument was set above; the grid and work-group sizes are valid for the kernel (checked
        // against its maximum work-group size when it was built).
        unsafe {
            queue.enqueue_nd_range_kernel(self.kernel.get(), 3, std::ptr::null(), global.as_ptr(), local.as_ptr(), &[])
        }
        .map(drop)
        .map_err(|e| cl_err(&format!("launching {}", self.name), e))
    }
}

/// `n` rounded up to a multiple of `m`.
pub(super) fn round_up(n: usize, m: usize) -> usize {
    n.div_ceil(m) * m
}
