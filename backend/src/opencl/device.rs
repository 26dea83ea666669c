//! Choosing an OpenCL platform and device (`--opencl-platform`, `--opencl-device`), and what the engine needs to
//! know about it. The OpenCL library (`libOpenCL.so.1`) is loaded on first use, so hosts without it still run the
//! CPU backend; here its absence becomes a clear error.

use opencl3::device::{Device, CL_DEVICE_TYPE_ALL, CL_DEVICE_TYPE_CPU, CL_DEVICE_TYPE_GPU};
use opencl3::error_codes::ClError;
use opencl3::platform::{get_platforms, Platform};

use crate::error::{BackendError, Result};

/// Which device to open. Defaults: the first platform that has a GPU and its first GPU, else platform 0, device 0.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenClOptions {
    /// A platform index, or a case-insensitive part of its name ("intel", "nvidia").
    pub platform: Option<String>,
    /// A device index within the chosen platform.
    pub device: Option<usize>,
}

/// The chosen device, described.
#[derive(Debug, Clone)]
pub struct OpenClDeviceInfo {
    pub platform: String,
    pub name: String,
    /// A CPU device shares host memory (the engine then budgets the KV cache from host memory).
    pub is_cpu: bool,
    pub global_mem_bytes: u64,
    pub max_alloc_bytes: u64,
}

const DLOPEN_RUNTIME_LOAD_FAILED: i32 = -2000;
const PLATFORM_NOT_FOUND_KHR: i32 = -1001;

/// Maps an OpenCL error code to an `BackendError` naming what failed.
pub(super) fn cl_err(what: &str, e: ClError) -> BackendError {
    let text = match e.0 {
        DLOPEN_RUNTIME_LOAD_FAILED => {
            "the OpenCL library libOpenCL.so.1 could not be loaded (install ocl-icd-libopencl1 and a vendor runtime; \
             scripts/setup.d/20-opencl.sh sets up Intel's CPU runtime)"
                .to_string()
        }
        _ => e.to_string(),
    };
    BackendError::Device(format!("opencl: {what}: {text}"))
}

fn platforms() -> Result<Vec<Platform>> {
    match get_platforms() {
        Ok(p) if !p.is_empty() => Ok(p),
        Ok(_) => Err(no_platform()),
        Err(e) if e.0 == PLATFORM_NOT_FOUND_KHR => Err(no_platform()),
        Err(e) => Err(cl_err("listing platforms", e)),
    }
}

fn no_platform() -> BackendError {
    let vendors =
        crate::env::var("OCL_ICD_VENDORS").unwrap_or_else(|| "/etc/OpenCL/vendors (OCL_ICD_VENDORS unset)".into());
    BackendError::Device(format!(
        "opencl: no OpenCL platform found; the ICD loader looked in {vendors}. Install a vendor runtime (Intel's CPU \
         runtime: scripts/setup.d/20-opencl.sh, then `source scripts/env.d/20-opencl.sh`)"
    ))
}

/// Every platform with its devices, for error messages and logs: `[(platform name, [device names])]`.
pub fn list_devices() -> Result<Vec<(String, Vec<String>)>> {
    platforms()?
        .iter()
        .map(|p| {
            let name = p.name().unwrap_or_default();
            let devices = p.get_devices(CL_DEVICE_TYPE_ALL).unwrap_or_default();
            Ok((name, devices.into_iter().map(|d| Device::new(d).name().unwrap_or_default()).collect()))
        })
        .collect()
}

fn describe(all: &[(String, Vec<String>)]) -> String {
    all.iter()
        .enumerate()
        .map(|(i, (p, ds))| {
            let ds: Vec<String> = ds.iter().enumerate().map(|(j, d)| format!("{j}: {d}")).collect();
            format!("platform {i} '{p}' [{}]", ds.join(", "))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn not_found(what: String) -> BackendError {
    let all = list_devices().map(|a| describe(&a)).unwrap_or_default();
    BackendError::InvalidArgument(format!("opencl: {what}; available: {all}"))
}

/// The platforms, their names, and the index of the one `--opencl-platform` chooses.
fn choose_platform(opts: &OpenClOptions) -> Result<(Vec<Platform>, Vec<String>, usize)> {
    let plats = platforms()?;
    let names: Vec<String> = plats.iter().map(|p| p.name().unwrap_or_default()).collect();
    let has_gpu = |p: &Platform| p.get_devices(CL_DEVICE_TYPE_GPU).is_ok_and(|d| !d.is_empty());
    let pi = match &opts.platform {
        Some(s) => match s.parse::<usize>() {
            Ok(i) if i < plats.len() => i,
            Ok(i) => return Err(not_found(format!("--opencl-platform {i} does not exist"))),
            Err(_) => names
                .iter()
                .position(|n| n.to_lowercase().contains(&s.to_lowercase()))
                .ok_or_else(|| not_found(format!("no platform name contains '{s}'")))?,
        },
        None => plats.iter().position(has_gpu).unwrap_or(0),
    };
    Ok((plats, names, pi))
}

/// The device index each of `n` data-parallel replicas opens: `--opencl-device D` gives D, D + 1, ...; without it,
/// the platform's GPUs in order when it has at least `n`, else every replica shares the default device (a CPU
/// device, or one GPU; the caller says so in the log).
pub fn replica_devices(opts: &OpenClOptions, n: usize) -> Result<Vec<usize>> {
    let (plats, names, pi) = choose_platform(opts)?;
    let devices = plats[pi].get_devices(CL_DEVICE_TYPE_ALL).unwrap_or_default();
    if let Some(d) = opts.device {
        let last = d + n - 1;
        if last >= devices.len() {
            return Err(not_found(format!(
                "--data-parallel-size {n} from --opencl-device {d} needs devices {d}..={last} of platform '{}'",
                names[pi]
            )));
        }
        return Ok((d..=last).collect());
    }
    let gpus = plats[pi].get_devices(CL_DEVICE_TYPE_GPU).unwrap_or_default();
    let gpu_indices: Vec<usize> = gpus.iter().filter_map(|g| devices.iter().position(|d| d == g)).collect();
    if gpu_indices.len() >= n {
        return Ok(gpu_indices[..n].to_vec());
    }
    Ok(vec![gpu_indices.first().copied().unwrap_or(0); n])
}

/// Resolves the options to one device.
pub(super) fn select(opts: &OpenClOptions) -> Result<(Device, OpenClDeviceInfo)> {
    let (plats, names, pi) = choose_platform(opts)?;
    let devices = plats[pi].get_devices(CL_DEVICE_TYPE_ALL).unwrap_or_default();
    let di = match opts.device {
        Some(i) if i < devices.len() => i,
        Some(i) => return Err(not_found(format!("platform '{}' has no device {i}", names[pi]))),
        None => {
            let gpus = plats[pi].get_devices(CL_DEVICE_TYPE_GPU).unwrap_or_default();
            gpus.first().and_then(|g| devices.iter().position(|d| d == g)).unwrap_or(0)
        }
    };
    let id = *devices.get(di).ok_or_else(|| not_found(format!("platform '{}' has no devices", names[pi])))?;
    let dev = Device::new(id);
    let q = |what: &str, e| cl_err(&format!("querying the device's {what}"), e);
    let info = OpenClDeviceInfo {
        platform: names[pi].clone(),
        name: dev.name().map_err(|e| q("name", e))?,
        is_cpu: dev.dev_type().map_err(|e| q("type", e))? & CL_DEVICE_TYPE_CPU != 0,
        global_mem_bytes: dev.global_mem_size().map_err(|e| q("memory size", e))?,
        max_alloc_bytes: dev.max_mem_alloc_size().map_err(|e| q("largest allocation", e))?,
    };
    let il = dev.il_version().unwrap_or_default();
    if !il.contains("SPIR-V") {
        return Err(BackendError::Device(format!(
            "opencl: device '{}' does not accept SPIR-V (IL versions: '{il}'); rserve's kernels need OpenCL 2.1+ \
             or cl_khr_il_program",
            info.name
        )));
    }
    Ok((dev, info))
}
