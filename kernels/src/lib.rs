//! Portable kernel sources and their ahead-of-time build (SPIR-V, NVRTC).
//!
//! The CPU backend in `rserve-engine` is the reference every device backend is checked against; the device kernels
//! (OpenCL C with a prelude that also compiles for CUDA) land here with the SPIR-V build (issue 5). Until then this
//! crate only names the kernels the `Backend` ops map to, so the op list and the kernel list cannot drift apart.

/// The kernels a device backend must provide, one per `Op` variant of the engine's backend seam.
pub const KERNEL_NAMES: &[&str] = &[
    "embedding",
    "rms_norm",
    "matmul",
    "rope",
    "write_kv",
    "paged_attention",
    "silu_mul",
    "add",
];
