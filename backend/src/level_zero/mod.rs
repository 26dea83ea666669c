//! The Level Zero backend: rserve's kernels (SPIR-V, or PVC native binaries, from `rserve-kernels`) on Intel GPUs
//! through Level Zero.
//!
//! Layers, bottom up: `loader` opens `libze_loader.so.1` at run time (`level-zero-sys`, bindgen) and initialises it;
//! `error` names every `ze_result_t`; `handles` owns each Level Zero object and `counters` counts them; `hierarchy`
//! holds the pure device-selection rules (`ZE_FLAT_DEVICE_HIERARCHY`, `ZE_AFFINITY_MASK`) and `discovery` applies
//! them to the drivers found; `stream` orders commands with events on an immediate command list; `memory` is the
//! stream-ordered device allocator (with relaxed limits above `maxMemAllocSize`); `aot` chooses between the PVC
//! native binary and the SPIR-V of each module; `backend` ties them into the `Backend` and the `KernelDevice` of
//! the device-neutral op layer (`backend::kernels`).
//!
//! Boundary: no other module of the engine calls Level Zero; `engine::device` only calls `open` and `auto`.

pub mod aot;
mod backend;
pub mod counters;
mod discovery;
mod error;
mod handles;
pub mod hierarchy;
mod loader;
mod memory;
mod stream;

pub use aot::{module_builds, ModuleBuilds};
pub use backend::{LevelZeroBackend, LzRecording};
pub use counters::{handle_counts, relaxed_allocations, HandleCounts, HandleKind};
pub use discovery::{DeviceInfo, INTEL_VENDOR_ID, RELAXED_ALLOCATION_LIMITS};
pub use error::{result_name, LzError};
pub use loader::{consulted_vars, loader_components, CONSULTED_VARS, LOADER_ENV};
pub use memory::{AllocLimits, LzBuffer};
pub use stream::StreamStats;

/// `Some(index)` for a `--device` value that names Level Zero: `level-zero` (index None: the first device) or
/// `level-zero:N`; None for other values. A malformed index is an error.
pub fn parse_device_arg(arg: &str) -> Option<Result<Option<usize>, LzError>> {
    let rest = arg.strip_prefix("level-zero")?;
    if rest.is_empty() {
        return Some(Ok(None));
    }
    let idx = rest.strip_prefix(':')?;
    Some(
        idx.parse::<usize>().map(Some).map_err(|_| {
            LzError::Selection(format!("--device {arg}: the device index must be a number (level-zero:N)"))
        }),
    )
}

/// The device a `--device level-zero[:N]` value names.
fn select(arg: &str) -> Result<discovery::Selected, LzError> {
    let index = match parse_device_arg(arg) {
        Some(r) => r?,
        None => return Err(LzError::Selection(format!("--device {arg} does not name a Level Zero device"))),
    };
    discovery::select(index)
}

/// Opens the Level Zero device a `--device level-zero[:N]` value names.
pub fn open(arg: &str) -> Result<LevelZeroBackend, LzError> {
    LevelZeroBackend::new(select(arg)?)
}

/// `open`, with `limits` in place of the allocation limits the driver reports (its `DeviceInfo` says them too): for
/// tests on the loader's null driver, which reports neither `maxMemAllocSize` (0) nor the relaxed-limits extension.
pub fn open_with_limits(arg: &str, limits: AllocLimits) -> Result<LevelZeroBackend, LzError> {
    let mut sel = select(arg)?;
    sel.info.max_alloc = limits.max_alloc;
    sel.info.relaxed_alloc_limits = limits.relaxed;
    LevelZeroBackend::new(sel)
}

/// True when `--device auto` would choose Level Zero: an Intel GPU is visible through the loader.
pub fn auto_available() -> bool {
    discovery::intel_gpu().is_ok()
}

/// For `--device auto`: the first Level Zero device when an Intel GPU is visible; None otherwise, after logging why.
pub fn auto() -> Option<LevelZeroBackend> {
    match discovery::intel_gpu() {
        Ok(name) => match open("level-zero") {
            Ok(b) => Some(b),
            Err(e) => {
                tracing::warn!(
                    "--device auto: found {name} but could not open it through Level Zero ({e}); using the CPU"
                );
                None
            }
        },
        Err(why) => {
            tracing::info!("--device auto: using the CPU: {why}");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_argument() {
        assert!(matches!(parse_device_arg("level-zero"), Some(Ok(None))));
        assert!(matches!(parse_device_arg("level-zero:3"), Some(Ok(Some(3)))));
        assert!(matches!(parse_device_arg("level-zero:x"), Some(Err(_))));
        assert!(parse_device_arg("cpu").is_none());
        assert!(parse_device_arg("level-zeros").is_none());
    }
}
