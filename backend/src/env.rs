//! Every environment variable the device backends read, in one place, each documented. Kernel variants and
//! profiling are not among them: those are `KernelTuning` and the `--profile` flag. What remains are the variables
//! of the platforms themselves (their loaders read them too, so rserve must agree with them) and one cache folder.
//!
//! | variable | read by | meaning |
//! | --- | --- | --- |
//! | `RSERVE_CACHE_DIR` | CUDA | folder of rserve's caches; PTX goes to its `ptx/` (else `$XDG_CACHE_HOME/rserve/ptx`, else `~/.cache/rserve/ptx`) |
//! | `XDG_CACHE_HOME`, `HOME` | CUDA | the fallbacks of the PTX cache folder above |
//! | `OCL_ICD_VENDORS` | OpenCL | the ICD loader's folder of vendor runtimes; named in the "no platform" error |
//! | `RSERVE_ZE_LOADER` | Level Zero | the loader library to open instead of `libze_loader.so.1` |
//! | `RSERVE_ZE_MODULE_FORMAT` | Level Zero | `auto` (default: PVC native binaries on a PVC, SPIR-V elsewhere), `native` (the binaries whatever the device reports, the XMX matmul module included; the null-driver tests set it) or `spirv` |
//! | `ZE_FLAT_DEVICE_HIERARCHY` | Level Zero | `FLAT` (each tile a device, the default), `COMPOSITE` or `COMBINED` |
//! | `ZE_AFFINITY_MASK` | Level Zero | which devices (tiles) this process sees, as the loader applies it |
//! | `ZE_ENABLE_PCI_ID_DEVICE_ORDER`, `ZE_ENABLE_NULL_DRIVER`, `ZE_ENABLE_VALIDATION_LAYER`, `LD_LIBRARY_PATH` | Level Zero | read by the loader, not by rserve; quoted in "no driver/device" errors |

use std::ffi::OsString;

/// The value of `name`, if set and valid Unicode.
pub fn var(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// The value of `name`, if set and not empty (paths may be any bytes).
pub fn path_var(name: &str) -> Option<OsString> {
    std::env::var_os(name).filter(|v| !v.is_empty())
}
