//! `LzError`: every way the Level Zero backend fails, with the API function and the `ze_result_t` by name.

use level_zero_sys as sys;

/// A Level Zero backend error. Each message is one line (the module build log aside).
#[derive(Debug, thiserror::Error)]
pub enum LzError {
    /// The loader library could not be opened: no Level Zero on this host.
    #[error("no Level Zero driver/device was found: the loader {library} could not be loaded ({reason}); consulted {consulted}")]
    LoaderMissing { library: String, reason: String, consulted: String },
    /// The loader lacks a function the backend uses (a loader older than the API the backend was built for).
    #[error("the Level Zero loader lacks {0} (update the Level Zero loader, libze1)")]
    MissingFunction(&'static str),
    /// Level Zero was found unusable earlier in this process (the first error, repeated).
    #[error("{0}")]
    Unavailable(String),
    /// No driver or no usable device.
    #[error("no Level Zero driver/device was found: {reason}; consulted {consulted}")]
    NoDevice { reason: String, consulted: String },
    /// An API call returned an error.
    #[error("{function} failed: {name} (0x{code:08x})")]
    Call { function: &'static str, code: u32, name: &'static str },
    /// A SPIR-V module did not build; the driver's build log follows.
    #[error("Level Zero could not build the kernel module '{module}': {log}")]
    ModuleBuild { module: String, log: String },
    /// A device-selection setting (environment variable or `--device level-zero:N`) is malformed or out of range.
    #[error("{0}")]
    Selection(String),
    /// A request the backend cannot serve (sizes beyond the device's limits, wrong buffer kinds).
    #[error("{0}")]
    Invalid(String),
    /// A buffer over the device's largest allocation, on a driver without the extension that lifts the limit.
    #[error(
        "a buffer of {bytes} bytes (a block of {class} bytes) exceeds the device's largest allocation ({max_alloc} \
         bytes, maxMemAllocSize) and the driver does not advertise {extension}, which would allow it"
    )]
    AllocationTooLarge { bytes: usize, class: usize, max_alloc: u64, extension: &'static str },
}

/// The name of a `ze_result_t` (the codes of the Level Zero 1.x core API); "ZE_RESULT_UNKNOWN_CODE" otherwise.
pub fn result_name(code: sys::ze_result_t) -> &'static str {
    const NAMES: &[(sys::ze_result_t, &str)] = &[
        (sys::ZE_RESULT_SUCCESS, "ZE_RESULT_SUCCESS"),
        (sys::ZE_RESULT_NOT_READY, "ZE_RESULT_NOT_READY"),
        (sys::ZE_RESULT_ERROR_DEVICE_LOST, "ZE_RESULT_ERROR_DEVICE_LOST"),
        (sys::ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY, "ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY"),
        (sys::ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY, "ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY"),
        (sys::ZE_RESULT_ERROR_MODULE_BUILD_FAILURE, "ZE_RESULT_ERROR_MODULE_BUILD_FAILURE"),
        (sys::ZE_RESULT_ERROR_MODULE_LINK_FAILURE, "ZE_RESULT_ERROR_MODULE_LINK_FAILURE"),
        (sys::ZE_RESULT_ERROR_DEVICE_REQUIRES_RESET, "ZE_RESULT_ERROR_DEVICE_REQUIRES_RESET"),
        (sys::ZE_RESULT_ERROR_DEVICE_IN_LOW_POWER_STATE, "ZE_RESULT_ERROR_DEVICE_IN_LOW_POWER_STATE"),
        (sys::ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS, "ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS"),
        (sys::ZE_RESULT_ERROR_NOT_AVAILABLE, "ZE_RESULT_ERROR_NOT_AVAILABLE"),
        (sys::ZE_RESULT_ERROR_DEPENDENCY_UNAVAILABLE, "ZE_RESULT_ERROR_DEPENDENCY_UNAVAILABLE"),
        (sys::ZE_RESULT_WARNING_DROPPED_DATA, "ZE_RESULT_WARNING_DROPPED_DATA"),
        (sys::ZE_RESULT_ERROR_UNINITIALIZED, "ZE_RESULT_ERROR_UNINITIALIZED"),
        (sys::ZE_RESULT_ERROR_UNSUPPORTED_VERSION, "ZE_RESULT_ERROR_UNSUPPORTED_VERSION"),
        (sys::ZE_RESULT_ERROR_UNSUPPORTED_FEATURE, "ZE_RESULT_ERROR_UNSUPPORTED_FEATURE"),
        (sys::ZE_RESULT_ERROR_INVALID_ARGUMENT, "ZE_RESULT_ERROR_INVALID_ARGUMENT"),
        (sys::ZE_RESULT_ERROR_INVALID_NULL_HANDLE, "ZE_RESULT_ERROR_INVALID_NULL_HANDLE"),
        (sys::ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE, "ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE"),
        (sys::ZE_RESULT_ERROR_INVALID_NULL_POINTER, "ZE_RESULT_ERROR_INVALID_NULL_POINTER"),
        (sys::ZE_RESULT_ERROR_INVALID_SIZE, "ZE_RESULT_ERROR_INVALID_SIZE"),
        (sys::ZE_RESULT_ERROR_UNSUPPORTED_SIZE, "ZE_RESULT_ERROR_UNSUPPORTED_SIZE"),
        (sys::ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT, "ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT"),
        (sys::ZE_RESULT_ERROR_INVALID_SYNCHRONIZATION_OBJECT, "ZE_RESULT_ERROR_INVALID_SYNCHRONIZATION_OBJECT"),
        (sys::ZE_RESULT_ERROR_INVALID_ENUMERATION, "ZE_RESULT_ERROR_INVALID_ENUMERATION"),
        (sys::ZE_RESULT_ERROR_UNSUPPORTED_ENUMERATION, "ZE_RESULT_ERROR_UNSUPPORTED_ENUMERATION"),
        (sys::ZE_RESULT_ERROR_UNSUPPORTED_IMAGE_FORMAT, "ZE_RESULT_ERROR_UNSUPPORTED_IMAGE_FORMAT"),
        (sys::ZE_RESULT_ERROR_INVALID_NATIVE_BINARY, "ZE_RESULT_ERROR_INVALID_NATIVE_BINARY"),
        (sys::ZE_RESULT_ERROR_INVALID_GLOBAL_NAME, "ZE_RESULT_ERROR_INVALID_GLOBAL_NAME"),
        (sys::ZE_RESULT_ERROR_INVALID_KERNEL_NAME, "ZE_RESULT_ERROR_INVALID_KERNEL_NAME"),
        (sys::ZE_RESULT_ERROR_INVALID_FUNCTION_NAME, "ZE_RESULT_ERROR_INVALID_FUNCTION_NAME"),
        (sys::ZE_RESULT_ERROR_INVALID_GROUP_SIZE_DIMENSION, "ZE_RESULT_ERROR_INVALID_GROUP_SIZE_DIMENSION"),
        (sys::ZE_RESULT_ERROR_INVALID_GLOBAL_WIDTH_DIMENSION, "ZE_RESULT_ERROR_INVALID_GLOBAL_WIDTH_DIMENSION"),
        (sys::ZE_RESULT_ERROR_INVALID_KERNEL_ARGUMENT_INDEX, "ZE_RESULT_ERROR_INVALID_KERNEL_ARGUMENT_INDEX"),
        (sys::ZE_RESULT_ERROR_INVALID_KERNEL_ARGUMENT_SIZE, "ZE_RESULT_ERROR_INVALID_KERNEL_ARGUMENT_SIZE"),
        (sys::ZE_RESULT_ERROR_INVALID_KERNEL_ATTRIBUTE_VALUE, "ZE_RESULT_ERROR_INVALID_KERNEL_ATTRIBUTE_VALUE"),
        (sys::ZE_RESULT_ERROR_INVALID_MODULE_UNLINKED, "ZE_RESULT_ERROR_INVALID_MODULE_UNLINKED"),
        (sys::ZE_RESULT_ERROR_INVALID_COMMAND_LIST_TYPE, "ZE_RESULT_ERROR_INVALID_COMMAND_LIST_TYPE"),
        (sys::ZE_RESULT_ERROR_OVERLAPPING_REGIONS, "ZE_RESULT_ERROR_OVERLAPPING_REGIONS"),
        (sys::ZE_RESULT_WARNING_ACTION_REQUIRED, "ZE_RESULT_WARNING_ACTION_REQUIRED"),
        (sys::ZE_RESULT_ERROR_UNKNOWN, "ZE_RESULT_ERROR_UNKNOWN"),
    ];
    NAMES.iter().find(|(c, _)| *c == code).map(|(_, n)| *n).unwrap_or("ZE_RESULT_UNKNOWN_CODE")
}

/// `Ok` for `ZE_RESULT_SUCCESS`, else the typed error naming `function` and the result.
pub fn check(function: &'static str, code: sys::ze_result_t) -> Result<(), LzError> {
    if code == sys::ZE_RESULT_SUCCESS {
        Ok(())
    } else {
        super::counters::call_failed();
        Err(LzError::Call { function, code, name: result_name(code) })
    }
}

/// The engine sees a Level Zero failure as a backend error with its full description (the engine's error type
/// names no backend, so this module depends on it and not the other way round).
impl From<LzError> for crate::error::BackendError {
    fn from(e: LzError) -> Self {
        crate::error::BackendError::Device(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_are_named_by_the_header_constants() {
        // 0x78000001 is what zeInit returns without a driver (TOOLCHAIN.md section 3).
        assert_eq!(result_name(0x7800_0001), "ZE_RESULT_ERROR_UNINITIALIZED");
        assert_eq!(result_name(sys::ZE_RESULT_ERROR_INVALID_NULL_POINTER), "ZE_RESULT_ERROR_INVALID_NULL_POINTER");
        assert_eq!(result_name(0x1234_5678), "ZE_RESULT_UNKNOWN_CODE");
        let e = check("zeInit", 0x7800_0001).unwrap_err();
        assert_eq!(e.to_string(), "zeInit failed: ZE_RESULT_ERROR_UNINITIALIZED (0x78000001)");
        assert!(check("zeInit", sys::ZE_RESULT_SUCCESS).is_ok());
    }
}
