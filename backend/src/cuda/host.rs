//! Host-side pieces of the CUDA backend that need no GPU (and are unit-tested without one): the NVRTC source of a
//! module (the portable prelude + the same `kernels/src/cl/*.cl` file the SPIR-V build uses), the NVRTC options,
//! the on-disk PTX cache key and folder, and the mapping of OpenCL-style ND-ranges onto CUDA grids.

use std::path::PathBuf;

use crate::cpu::be;
use crate::error::Result;

/// CUDA-only kernels (f32 -> bf16/f16 for cuBLAS, bias add), compiled like the portable modules.
pub const GLUE_SOURCE: &str = include_str!("../../../kernels/src/cuda/cublas_glue.cu");
/// Name of the CUDA-only module.
pub const GLUE_MODULE: &str = "cublas_glue";
/// Entry points of the CUDA-only module.
pub const GLUE_KERNELS: &[&str] = &["f32_to_bf16", "f32_to_f16", "add_bias"];

/// The text NVRTC compiles for one module: the prelude, then the module's source with its `#include "prelude.h"`
/// line dropped (NVRTC gets no include path; the prelude's guard makes the order safe). `#line` keeps compiler
/// messages pointing at the original file's lines.
pub fn assemble_source(module: &str, source: &str) -> String {
    let mut out = String::with_capacity(rserve_kernels::PRELUDE.len() + source.len() + 128);
    out.push_str("#line 1 \"prelude.h\"\n");
    out.push_str(rserve_kernels::PRELUDE);
    out.push_str(&format!("\n#line 1 \"{module}\"\n"));
    for line in source.lines() {
        let t = line.trim_start();
        if t.starts_with("#include") && t.contains("prelude.h") {
            out.push('\n'); // keep line numbers
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// NVRTC options for a device of compute capability `(major, minor)`: the launch constants as `-D` flags and a
/// virtual architecture, so the driver JIT-compiles the PTX for the exact GPU.
pub fn nvrtc_options(cc: (i32, i32)) -> Vec<String> {
    let mut o = rserve_kernels::compile_defines();
    o.push(format!("--gpu-architecture=compute_{}{}", cc.0, cc.1));
    o.push("--std=c++17".into());
    o
}

pub use crate::hash::fnv1a64;

/// File name of a cached PTX: module, hash of (source, options), and the GPU architecture.
pub fn ptx_cache_file(module: &str, source: &str, options: &[String], cc: (i32, i32)) -> String {
    let opts = options.join("\u{1f}");
    let h = fnv1a64(&[source.as_bytes(), opts.as_bytes()]);
    format!("{module}-{h:016x}-sm{}{}.ptx", cc.0, cc.1)
}

/// Where PTX is cached: `$RSERVE_CACHE_DIR/ptx`, else `$XDG_CACHE_HOME/rserve/ptx`, else `~/.cache/rserve/ptx`,
/// else the system temp folder.
pub fn ptx_cache_dir() -> PathBuf {
    let env = |k: &str| crate::env::path_var(k).map(PathBuf::from);
    if let Some(d) = env("RSERVE_CACHE_DIR") {
        return d.join("ptx");
    }
    if let Some(d) = env("XDG_CACHE_HOME") {
        return d.join("rserve").join("ptx");
    }
    if let Some(d) = env("HOME") {
        return d.join(".cache").join("rserve").join("ptx");
    }
    std::env::temp_dir().join("rserve-ptx")
}

/// A CUDA grid or block size (x, y, z).
pub type Dim3 = (u32, u32, u32);

/// CUDA grid and block for an OpenCL-style ND-range (`global` work-items in total, `local` per group, each global
/// size a multiple of its local size). Errors instead of launching a wrong grid.
pub fn grid_dims(global: [usize; 3], local: [usize; 3]) -> Result<(Dim3, Dim3)> {
    let mut g = [0u32; 3];
    let mut l = [0u32; 3];
    for d in 0..3 {
        if local[d] == 0 || !global[d].is_multiple_of(local[d]) {
            return Err(be(format!(
                "cuda: global size {} is not a multiple of the group size {}",
                global[d], local[d]
            )));
        }
        let groups = global[d] / local[d];
        // CUDA limits: x up to 2^31 - 1 groups, y and z up to 65535; 1024 threads per block.
        let max = if d == 0 { i32::MAX as usize } else { 65_535 };
        if groups > max || local[d] > 1024 {
            return Err(be(format!("cuda: grid {global:?} / {local:?} exceeds the device's launch limits")));
        }
        g[d] = groups as u32;
        l[d] = local[d] as u32;
    }
    if l.iter().map(|&x| x as u64).product::<u64>() > 1024 {
        return Err(be(format!("cuda: a block of {local:?} threads exceeds 1024")));
    }
    Ok(((g[0], g[1], g[2]), (l[0], l[1], l[2])))
}

/// cuBLAS is column-major: `out[m, n] = x[m, k] . w[n, k]^T` (row-major) is `C(n x m) = W^T(n x k) . X(k x m)` with
/// `A = w` transposed (lda = k), `B = x` as is (ldb = k), `ldc = n`. Returns `(m, n, k, lda, ldb, ldc)` in cuBLAS'
/// naming, checked to fit its `int` arguments.
pub fn gemm_shape(m: usize, k: usize, n: usize) -> Result<(i32, i32, i32, i32, i32, i32)> {
    let fit =
        |v: usize| i32::try_from(v).map_err(|_| be(format!("cuda: matmul dimension {v} exceeds cuBLAS' int range")));
    Ok((fit(n)?, fit(m)?, fit(k)?, fit(k)?, fit(k)?, fit(n)?))
}
