//! The kernels on one CUDA device: every portable module of `rserve-kernels` (and the CUDA-only glue module)
//! compiled by NVRTC to PTX, cached on disk by source hash and GPU architecture, loaded as CUDA modules; and
//! `Launch`, which packs arguments in declaration order and launches on the backend's stream.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, CudaFunction, CudaStream};
use cudarc::nvrtc::{CompileOptions, Ptx};

use super::buffer::CuBuffer;
use super::host;
use crate::backend::cpu::be;
use crate::error::{EngineError, Result};

/// Loaded functions by entry-point name.
pub(super) struct Kernels {
    funcs: HashMap<&'static str, CudaFunction>,
    /// Modules compiled by NVRTC in this process (the others came from the PTX cache).
    pub(super) compiled: usize,
    /// Launch with programmatic dependent launch (`pdl_enabled`): every kernel starts with `GRID_DEP_SYNC()`.
    pdl: bool,
}

/// Whether kernels on a device of compute capability `cc` are launched with programmatic dependent launch: on 9.0
/// and newer (where the prelude's `GRID_DEP_SYNC()` waits for the previous kernel), unless `RSERVE_CUDA_PDL=0`.
pub(super) fn pdl_enabled(cc: (i32, i32)) -> bool {
    cc.0 >= 9 && std::env::var("RSERVE_CUDA_PDL").map_or(true, |v| v != "0")
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
            let m = rserve_kernels::module(name)
                .ok_or_else(|| EngineError::Backend(format!("cuda: kernel module {name} is not embedded")))?;
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
        let pdl = pdl_enabled(cc);
        tracing::debug!("cuda: programmatic dependent launch {}", if pdl { "on" } else { "off" });
        Ok(Self { funcs, compiled, pdl })
    }

    /// Whether kernels are launched with programmatic dependent launch.
    pub(super) fn pdl(&self) -> bool {
        self.pdl
    }

    pub(super) fn launch(&self, name: &'static str) -> Result<Launch<'_>> {
        let f = self.funcs.get(name).ok_or_else(|| be(format!("cuda: kernel {name} is not loaded")))?;
        Ok(Launch { f, name, args: Vec::with_capacity(16), err: None, pdl: self.pdl })
    }
}

/// One kernel argument, stored by value until launch.
enum Arg {
    Ptr(u64),
    U32(u32),
    F32(f32),
}

/// One launch being prepared: arguments in declaration order, then `run`.
pub(super) struct Launch<'a> {
    f: &'a CudaFunction,
    name: &'static str,
    args: Vec<Arg>,
    err: Option<EngineError>,
    pdl: bool,
}

impl Launch<'_> {
    pub(super) fn buf(mut self, b: &CuBuffer) -> Self {
        self.args.push(Arg::Ptr(b.ptr()));
        self
    }

    pub(super) fn u32(mut self, v: usize) -> Self {
        match u32::try_from(v) {
            Ok(x) => self.args.push(Arg::U32(x)),
            Err(_) => {
                let i = self.args.len();
                self.err.get_or_insert_with(|| be(format!("cuda: {}: argument {i} = {v} does not fit in 32 bits", self.name)));
                self.args.push(Arg::U32(0));
            }
        }
        self
    }

    pub(super) fn f32(mut self, v: f32) -> Self {
        self.args.push(Arg::F32(v));
        self
    }

    /// Launches on `global` work-items in groups of `local` (OpenCL-style sizes); empty grids launch nothing.
    pub(super) fn run(mut self, stream: &CudaStream, global: [usize; 3], local: [usize; 3]) -> Result<()> {
        if let Some(e) = self.err.take() {
            return Err(e);
        }
        if global.contains(&0) {
            return Ok(());
        }
        let (grid, block) = host::grid_dims(global, local)?;
        let mut params: Vec<*mut c_void> = self
            .args
            .iter_mut()
            .map(|a| match a {
                Arg::Ptr(p) => p as *mut u64 as *mut c_void,
                Arg::U32(x) => x as *mut u32 as *mut c_void,
                Arg::F32(x) => x as *mut f32 as *mut c_void,
            })
            .collect();
        // SAFETY: the arguments match the kernel's parameters in order and type (the sources and the launch sites
        // are kept in step and every index they follow was checked on the host); they outlive the call, which
        // copies them.
        if !self.pdl {
            return unsafe { result::launch_kernel(self.f.cu_function(), grid, block, 0, stream.cu_stream(), &mut params) }
                .map_err(|e| be(format!("cuda: launching {}: {e:?}", self.name)));
        }
        // Programmatic dependent launch: the kernel may be scheduled before the previous one on the stream has
        // finished; its `GRID_DEP_SYNC()` waits for it before touching memory.
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
        unsafe { sys::cuLaunchKernelEx(&config, self.f.cu_function(), params.as_mut_ptr(), std::ptr::null_mut()) }
            .result()
            .map_err(|e| be(format!("cuda: launching {}: {e:?}", self.name)))
    }
}

/// `n` rounded up to a multiple of `m`.
pub(super) fn round_up(n: usize, m: usize) -> usize {
    n.div_ceil(m) * m
}
