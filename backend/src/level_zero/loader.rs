//! The process-wide Level Zero API: `libze_loader.so.1` opened at run time (never linked), checked for every
//! function the backend calls, and initialised once with `zeInit`. Also the `ze!` call macro and the list of
//! environment variables that decide what Level Zero sees (quoted in every "no driver/device" error).
//!
//! Invariant: the environment variables the loader reads (`ZE_ENABLE_NULL_DRIVER`, `ZE_ENABLE_VALIDATION_LAYER`,
//! `ZE_AFFINITY_MASK`, ...) take effect only if set before the first call here; tests that need them run in a
//! child process.

use std::sync::OnceLock;

use level_zero_sys as sys;

use super::error::LzError;

/// Environment variable naming the loader library to open instead of `libze_loader.so.1`.
pub const LOADER_ENV: &str = "RSERVE_ZE_LOADER";

/// The variables that change which Level Zero drivers and devices this process sees, in the order errors list them.
pub const CONSULTED_VARS: &[&str] = &[
    "ZE_AFFINITY_MASK",
    "ZE_FLAT_DEVICE_HIERARCHY",
    "ZE_ENABLE_PCI_ID_DEVICE_ORDER",
    "ZE_ENABLE_NULL_DRIVER",
    "ZE_ENABLE_VALIDATION_LAYER",
    LOADER_ENV,
    "LD_LIBRARY_PATH",
];

/// `NAME=value` (or `NAME unset`) for each of `CONSULTED_VARS`, comma-separated on one line.
pub fn consulted_vars() -> String {
    CONSULTED_VARS
        .iter()
        .map(|v| match crate::env::var(v) {
            Some(val) => format!("{v}={val}"),
            None => format!("{v} unset"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Calls a Level Zero function through the loaded API and turns its `ze_result_t` into `Result<(), LzError>`.
/// Use inside `unsafe`: the arguments are raw handles and pointers that must be valid for the call.
macro_rules! ze {
    ($api:expr, $f:ident ( $($arg:expr),* $(,)? )) => {
        match $api.lib.$f.as_ref() {
            Ok(f) => $crate::level_zero::error::check(stringify!($f), f($($arg),*)),
            Err(_) => Err($crate::level_zero::error::LzError::MissingFunction(stringify!($f))),
        }
    };
}
pub(crate) use ze;

/// A NUL-terminated name from a fixed-size C `char` array of the loader's structs (`c_char` is `i8` on x86-64 and
/// `u8` on aarch64, so each is read as its byte).
pub(super) fn c_name(chars: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = chars.iter().take_while(|&&c| c != 0).map(|&c| c.to_ne_bytes()[0]).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Fails with the first function of the list the loader lacks.
macro_rules! require {
    ($lib:expr, $($f:ident),* $(,)?) => {{
        let mut missing: Option<&'static str> = None;
        $( if missing.is_none() && $lib.$f.is_err() { missing = Some(stringify!($f)); } )*
        missing
    }};
}

/// The opened loader. Lives for the whole process (Level Zero has no de-initialisation call).
pub struct Api {
    pub(crate) lib: sys::ZeLoader,
    /// The library that was opened.
    pub library: String,
}

// SAFETY: the loader's function table is immutable after loading and Level Zero's API is callable from any thread
// (objects that are not thread-safe, command lists, are owned by one `Stream` at a time).
unsafe impl Send for Api {}
unsafe impl Sync for Api {}

static API: OnceLock<Result<Api, String>> = OnceLock::new();

fn open() -> Result<Api, LzError> {
    let library = crate::env::var(LOADER_ENV).unwrap_or_else(|| sys::LOADER_SONAME.to_string());
    // SAFETY: opening the loader runs its initialisers, which only read the environment.
    let lib = unsafe { sys::ZeLoader::new(&library) }.map_err(|e| LzError::LoaderMissing {
        library: library.clone(),
        reason: e.to_string(),
        consulted: consulted_vars(),
    })?;
    if let Some(f) = require!(
        lib,
        zeInit,
        zeDriverGet,
        zeDriverGetProperties,
        zeDriverGetApiVersion,
        zeDriverGetExtensionProperties,
        zeDeviceGet,
        zeDeviceGetSubDevices,
        zeDeviceGetProperties,
        zeDeviceGetMemoryProperties,
        zeDeviceGetComputeProperties,
        zeDeviceGetCommandQueueGroupProperties,
        zeContextCreate,
        zeContextDestroy,
        zeCommandListCreateImmediate,
        zeCommandListDestroy,
        zeCommandListAppendLaunchKernel,
        zeCommandListAppendMemoryCopy,
        zeCommandListAppendMemoryFill,
        zeEventPoolCreate,
        zeEventPoolDestroy,
        zeEventCreate,
        zeEventDestroy,
        zeEventHostSynchronize,
        zeEventHostReset,
        zeModuleCreate,
        zeModuleDestroy,
        zeModuleBuildLogGetString,
        zeModuleBuildLogDestroy,
        zeKernelCreate,
        zeKernelDestroy,
        zeKernelSetGroupSize,
        zeKernelSetArgumentValue,
        zeKernelGetProperties,
        zeMemAllocDevice,
        zeMemFree,
    ) {
        return Err(LzError::MissingFunction(f));
    }
    let api = Api { lib, library };
    // SAFETY: zeInit takes only flags. 0 = all driver types (GPU and VPU).
    match unsafe { ze!(api, zeInit(0)) } {
        Ok(()) => Ok(api),
        Err(LzError::Call { code, name, .. }) => Err(LzError::NoDevice {
            reason: format!("zeInit returned {name} (0x{code:08x}): no driver is installed or none accepted this host"),
            consulted: consulted_vars(),
        }),
        Err(e) => Err(e),
    }
}

/// The initialised API, opening the loader on first use. Errors are remembered: a process that found no Level
/// Zero keeps the same answer.
pub fn api() -> Result<&'static Api, LzError> {
    match API.get_or_init(|| open().map_err(|e| e.to_string())) {
        Ok(a) => Ok(a),
        Err(msg) => Err(LzError::Unavailable(msg.clone())),
    }
}

/// The loader's components and their versions (`zelLoaderGetVersions`): the loader itself, each layer it loaded
/// (e.g. "validation layer") and the drivers' interfaces. Empty when the loader does not report them.
pub fn loader_components() -> Result<Vec<String>, LzError> {
    let api = api()?;
    let Ok(get) = api.lib.zelLoaderGetVersions.as_ref() else { return Ok(Vec::new()) };
    let mut n: usize = 0;
    // SAFETY: a null array asks for the count.
    super::error::check("zelLoaderGetVersions", unsafe { get(&mut n, std::ptr::null_mut()) })?;
    let mut v = vec![sys::zel_component_version_t::default(); n];
    if n > 0 {
        // SAFETY: the array holds n structs.
        super::error::check("zelLoaderGetVersions", unsafe { get(&mut n, v.as_mut_ptr()) })?;
    }
    Ok(v.iter()
        .take(n)
        .map(|c| {
            let l = &c.component_lib_version;
            format!("{} {}.{}.{}", c_name(&c.component_name), l.major, l.minor, l.patch)
        })
        .collect())
}
