//! The kernels on one CUDA device: every portable module of `rserve-kernels` (and the CUDA-only glue module)
//! compiled by NVRTC to PTX, cached on disk by source hash and GPU architecture, loaded as CUDA modules; and
//! `launch`, which packs a launch's arguments in declaration order and launches it on the backend's stream.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, CudaFunction, CudaStream};
use cudarc::nvrtc::{CompileOptions, Ptx};

use super::buffer::CuBuffer;
use super::host;
use crate::cpu::be;
use crate::error::{BackendError, Result};
use crate::kernels::{Arg, Launch};

/// Loaded functions by entry-point name.
pub(super) struct Kernels {
    funcs: HashMap<&'static str, CudaFunction>,
    /// Modules compiled by NVRTC in this process (the others came from the PTX cache).
    pub(super) compiled: usize,
}

fn ptx_for(module: &str, source: &str, cc: (i32, i32)) -> Result<(String, bool)> {
    let full = host::assemble_source(module, source);
    let opts = host::nvrtc_options(cc);
    let dir = host::ptx_cache_dir();
    let file = dir.join(host::ptx_cache_file(module, &full, &opts, cc));
    if let Ok(text) = std::fs::read_to_string(&file) {
        if text.contains(".entry") {
            return Ok((text, false));
        }
    }
    let t0 = std::time::Instant::now();
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(
        &full,
        CompileOptions { options: opts, name: Some(format!("{module}.cu")), ..Default::default() },
    )
    .map_err(|e| match e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => {
            be(format!("cuda: NVRTC could not compile {module}:\n{}", log.to_string_lossy()))
        }
        other => be(format!("cuda: NVRTC failed on {module}: {other:?}")),
    })?;
    let text = ptx.to_src();
    tracing::debug!("cuda: compiled {module} in {:.2} s", t0.elapsed().as_secs_f64());
    // The cache is an optimisation: failing to write it is not an error.
    if std::fs::create_dir_all(&dir).is_ok() {
        let tmp = file.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, &text).is_ok() {
            let _ = std::fs::rename(&tmp, &file);
        }
    }
    Ok((text, true))
}

impl Kernels {
    pub(super) fn build(ctx: &Arc<CudaContext>, cc: (i32, i32)) -> Result<Self> {
        let mut funcs = HashMap::new();
        let mut compiled = 0;
        let mut modules: Vec<(&str, &str, &[&'static str])> = Vec::new();
        for (name, entries) in rserve_kernels::KERNELS {
            // OpenCL C-only modules (Intel's sub-group and matrix built-ins) have no CUDA form.
            if rserve_kernels::target(name) != rserve_kernels::Target::Portable {
                continue;
            }
            let m = rserve_kernels::module(name)
                .ok_or_else(|| BackendError::Device(format!("cuda: kernel module {name} is not embedded")))?;
            modules.push((name, m.source, entries));
        }
        modules.push((host::GLUE_MODULE, host::GLUE_SOURCE, host::GLUE_KERNELS));
        for (name, source, entries) in modules {
            let (ptx, fresh) = ptx_for(name, source, cc)?;
            compiled += fresh as usize;
            let module = ctx
                .load_module(Ptx::from_src(ptx))
                .map_err(|e| be(format!("cuda: loading the PTX of {name}: {e:?}")))?;
            for &entry in entries {
                let f = module.load_function(entry).map_err(|e| be(format!("cuda: kernel {entry}: {e:?}")))?;
                funcs.insert(entry, f);
            }
        }
        Ok(Self { funcs, compiled })
    }

    /// Launches `l` on `stream` (OpenCL-style sizes mapped onto a CUDA grid); empty grids launch nothing. With
    /// `pdl` (programmatic dependent launch) the kernel may be scheduled before the previous one on the stream has
    /// finished; its `GRID_DEP_SYNC()` waits for it before touching memory.
    pub(super) fn launch(&self, stream: &CudaStream, l: &Launch<'_, CuBuffer>, pdl: bool) -> Result<()> {
        let f = self.funcs.get(l.kernel).ok_or_else(|| be(format!("cuda: kernel {} is not loaded", l.kernel)))?;
        if l.global.contains(&0) {
            return Ok(());
        }
        let (grid, block) = host::grid_dims(l.global, [l.local, 1, 1])?;
        let mut values: Vec<ArgValue> = l
            .args
            .iter()
            .map(|a| match a {
                Arg::Buf(b) => ArgValue::Ptr(b.ptr()),
                Arg::U32(x) => ArgValue::U32(*x),
                Arg::F32(x) => ArgValue::F32(*x),
            })
            .collect();
        let mut params: Vec<*mut c_void> = values
            .iter_mut()
            .map(|a| match a {
                ArgValue::Ptr(p) => p as *mut u64 as *mut c_void,
                ArgValue::U32(x) => x as *mut u32 as *mut c_void,
                ArgValue::F32(x) => x as *mut f32 as *mut c_void,
            })
            .collect();
        // SAFETY: the arguments match the kernel's parameters in order and type (the op layer builds them in the
        // order of the kernel source and checked every index they follow); they outlive the call, which copies them.
        if !pdl {
            return unsafe { result::launch_kernel(f.cu_function(), grid, block, 0, stream.cu_stream(), &mut params) }
                .map_err(|e| be(format!("cuda: launching {}: {e:?}", l.kernel)));
        }
        // SAFETY: all-zero is a valid bit pattern for this plain C union; the one field set is the one the
        // attribute id names.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: grid.0,
            gridDimY: grid.1,
            gridDimZ: grid.2,
            blockDimX: block.0,
            blockDimY: block.1,
            blockDimZ: block.2,
            sharedMemBytes: 0,
            hStream: stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        // SAFETY: as above; `config` and `attr` outlive the call, which copies them.
        unsafe { sys::cuLaunchKernelEx(&config, f.cu_function(), params.as_mut_ptr(), std::ptr::null_mut()) }
            .result()
            .map_err(|e| be(format!("cuda: launching {}: {e:?}", l.kernel)))
    }
}

/// One kernel argument by value, alive until the launch has copied it.
enum ArgValue {
    Ptr(u64),
    U32(u32),
    F32(f32),
}
