//! Finding the Level Zero device to run on: drivers, their GPU devices and tiles, under `ZE_FLAT_DEVICE_HIERARCHY`
//! and `ZE_AFFINITY_MASK` (rules in `hierarchy`), with the properties the backend needs (memory size, largest
//! allocation and whether the driver may exceed it, compute queue group). Every failure says which variables were
//! consulted.

use std::ptr;

use level_zero_sys as sys;

use super::error::LzError;
use super::hierarchy::{candidates, pick, AffinityMask, Candidate, Hierarchy};
use super::loader::{api, c_name, consulted_vars, ze, Api};

type Result<T> = std::result::Result<T, LzError>;

/// Intel's PCI vendor id.
pub const INTEL_VENDOR_ID: u32 = 0x8086;

/// The driver extension that lets one allocation exceed `maxMemAllocSize` (`ZE_RELAXED_ALLOCATION_LIMITS_EXP_NAME`).
pub const RELAXED_ALLOCATION_LIMITS: &str = "ZE_experimental_relaxed_allocation_limits";

/// What the backend needs to know about a device.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    pub name: String,
    pub vendor_id: u32,
    pub device_id: u32,
    /// The IP version (`ze_device_ip_version_ext_t`: architecture, release, revision); 0 when the driver does not
    /// report it (the null driver, drivers without the extension).
    pub ip_version: u32,
    /// A tile of a multi-tile card reached as a sub-device.
    pub sub_device: Option<u32>,
    /// Total device memory (sum of `zeDeviceGetMemoryProperties`), bytes.
    pub memory_bytes: u64,
    /// Largest single allocation (`maxMemAllocSize`; 0 when the driver does not say).
    pub max_alloc: u64,
    /// The driver advertises `RELAXED_ALLOCATION_LIMITS`: larger allocations are possible with its descriptor.
    pub relaxed_alloc_limits: bool,
    /// The command-queue group used for kernels and copies.
    pub compute_ordinal: u32,
    /// Most work-items in one work-group (`maxTotalGroupSize`; 0 when the driver does not say).
    pub max_group_size: u32,
}

/// The chosen device.
pub struct Selected {
    pub driver: sys::ze_driver_handle_t,
    pub device: sys::ze_device_handle_t,
    pub info: DeviceInfo,
    /// Its index among the candidates, and how many there were.
    pub index: usize,
    pub of: usize,
    pub hierarchy: Hierarchy,
}

// SAFETY: driver and device handles are owned by the driver for the life of the process and are thread-safe.
unsafe impl Send for Selected {}

fn no_device(reason: String) -> LzError {
    LzError::NoDevice { reason, consulted: consulted_vars() }
}

/// The hierarchy and mask in effect, with warnings logged for masks that cannot mean what they say.
pub fn settings() -> Result<(Hierarchy, Option<AffinityMask>)> {
    let h = Hierarchy::parse(crate::env::var("ZE_FLAT_DEVICE_HIERARCHY").as_deref())?;
    let mask = match crate::env::var("ZE_AFFINITY_MASK") {
        Some(v) => AffinityMask::parse(&v)?,
        None => None,
    };
    if let Some(w) = mask.as_ref().and_then(|m| m.notation_warning(h)) {
        tracing::warn!("{w}");
    }
    Ok((h, mask))
}

/// Level Zero's two-call enumeration: `get(count, null)` reports the count, `get(count, array)` fills the array
/// with at most `count` handles and says how many it wrote.
fn enumerate<T>(mut get: impl FnMut(&mut u32, *mut *mut T) -> Result<()>) -> Result<Vec<*mut T>> {
    let mut n = 0u32;
    get(&mut n, ptr::null_mut())?;
    let mut v = vec![ptr::null_mut(); n as usize];
    if n > 0 {
        get(&mut n, v.as_mut_ptr())?;
        v.truncate(n as usize);
    }
    Ok(v)
}

fn drivers(api: &Api) -> Result<Vec<sys::ze_driver_handle_t>> {
    // SAFETY: `enumerate` passes a null array or one that holds `n` handles.
    enumerate(|n, v| unsafe { ze!(api, zeDriverGet(n, v)) })
}

fn devices(api: &Api, driver: sys::ze_driver_handle_t) -> Result<Vec<sys::ze_device_handle_t>> {
    // SAFETY: as in `drivers`.
    enumerate(|n, v| unsafe { ze!(api, zeDeviceGet(driver, n, v)) })
}

fn sub_devices(api: &Api, device: sys::ze_device_handle_t) -> Result<Vec<sys::ze_device_handle_t>> {
    // SAFETY: as in `drivers`.
    enumerate(|n, v| unsafe { ze!(api, zeDeviceGetSubDevices(device, n, v)) })
}

fn properties(api: &Api, device: sys::ze_device_handle_t) -> Result<sys::ze_device_properties_t> {
    let mut p = sys::ze_device_properties_t { stype: sys::ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES, ..Default::default() };
    // SAFETY: valid device and properties struct.
    unsafe { ze!(api, zeDeviceGetProperties(device, &mut p))? };
    Ok(p)
}

/// `ze_device_ip_version_ext_t` (ZE_extension_device_ip_version), which the committed bindings (loader 1.8 headers)
/// predate.
#[repr(C)]
struct IpVersionExt {
    stype: sys::ze_structure_type_t,
    p_next: *mut std::ffi::c_void,
    ip_version: u32,
}

/// `ZE_STRUCTURE_TYPE_DEVICE_IP_VERSION_EXT`.
const STYPE_DEVICE_IP_VERSION_EXT: sys::ze_structure_type_t = 0x0001_000f;

/// The device's IP version, chained to its properties; 0 when the driver leaves it unset (drivers ignore extension
/// structures they do not know).
fn ip_version(api: &Api, device: sys::ze_device_handle_t) -> Result<u32> {
    let mut ext = IpVersionExt { stype: STYPE_DEVICE_IP_VERSION_EXT, p_next: ptr::null_mut(), ip_version: 0 };
    let mut p = sys::ze_device_properties_t {
        stype: sys::ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES,
        pNext: (&mut ext as *mut IpVersionExt).cast(),
        ..Default::default()
    };
    // SAFETY: valid device, properties struct and a chained extension struct alive for the call.
    unsafe { ze!(api, zeDeviceGetProperties(device, &mut p))? };
    Ok(ext.ip_version)
}

/// The names of the extensions `driver` advertises (`zeDriverGetExtensionProperties`).
fn driver_extensions(api: &Api, driver: sys::ze_driver_handle_t) -> Result<Vec<String>> {
    let mut n = 0u32;
    // SAFETY: a null array asks for the count.
    unsafe { ze!(api, zeDriverGetExtensionProperties(driver, &mut n, ptr::null_mut()))? };
    let mut v = vec![sys::ze_driver_extension_properties_t::default(); n as usize];
    if n > 0 {
        // SAFETY: the array holds n structs.
        unsafe { ze!(api, zeDriverGetExtensionProperties(driver, &mut n, v.as_mut_ptr()))? };
    }
    Ok(v.iter().take(n as usize).map(|e| c_name(&e.name)).collect())
}

fn memory_bytes(api: &Api, device: sys::ze_device_handle_t) -> Result<u64> {
    let mut n = 0u32;
    // SAFETY: a null array asks for the count.
    unsafe { ze!(api, zeDeviceGetMemoryProperties(device, &mut n, ptr::null_mut()))? };
    if n == 0 {
        return Ok(0);
    }
    let mut v = vec![
        sys::ze_device_memory_properties_t {
            stype: sys::ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES,
            ..Default::default()
        };
        n as usize
    ];
    // SAFETY: the array holds n structs with stype set.
    unsafe { ze!(api, zeDeviceGetMemoryProperties(device, &mut n, v.as_mut_ptr()))? };
    Ok(v.iter().take(n as usize).map(|m| m.totalSize).sum())
}

fn max_group_size(api: &Api, device: sys::ze_device_handle_t) -> Result<u32> {
    let mut p = sys::ze_device_compute_properties_t {
        stype: sys::ZE_STRUCTURE_TYPE_DEVICE_COMPUTE_PROPERTIES,
        ..Default::default()
    };
    // SAFETY: valid device and properties struct.
    unsafe { ze!(api, zeDeviceGetComputeProperties(device, &mut p))? };
    Ok(p.maxTotalGroupSize)
}

fn compute_ordinal(api: &Api, device: sys::ze_device_handle_t) -> Result<u32> {
    let mut n = 0u32;
    // SAFETY: a null array asks for the count.
    unsafe { ze!(api, zeDeviceGetCommandQueueGroupProperties(device, &mut n, ptr::null_mut()))? };
    let mut v = vec![
        sys::ze_command_queue_group_properties_t {
            stype: sys::ZE_STRUCTURE_TYPE_COMMAND_QUEUE_GROUP_PROPERTIES,
            ..Default::default()
        };
        n as usize
    ];
    if n > 0 {
        // SAFETY: the array holds n structs with stype set.
        unsafe { ze!(api, zeDeviceGetCommandQueueGroupProperties(device, &mut n, v.as_mut_ptr()))? };
    }
    v.iter()
        .take(n as usize)
        .position(|g| g.flags & sys::ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COMPUTE != 0)
        .map(|i| i as u32)
        .ok_or_else(|| LzError::Invalid("the Level Zero device has no compute command-queue group".into()))
}

/// One root GPU device of a driver.
struct Root {
    driver: sys::ze_driver_handle_t,
    device: sys::ze_device_handle_t,
    subs: Vec<sys::ze_device_handle_t>,
    props: sys::ze_device_properties_t,
}

/// Every GPU root device of every driver, in driver order.
fn gpu_roots(api: &Api) -> Result<(usize, Vec<Root>, Vec<String>)> {
    let drivers = drivers(api)?;
    let mut roots = Vec::new();
    let mut others = Vec::new();
    for &driver in &drivers {
        for device in devices(api, driver)? {
            let props = properties(api, device)?;
            if props.type_ != sys::ZE_DEVICE_TYPE_GPU {
                others.push(c_name(&props.name));
                continue;
            }
            let subs = sub_devices(api, device)?;
            roots.push(Root { driver, device, subs, props });
        }
    }
    Ok((drivers.len(), roots, others))
}

/// Opens the loader and picks GPU device `index` (default 0) of the candidates under the hierarchy.
pub fn select(index: Option<usize>) -> Result<Selected> {
    let (h, mask) = settings()?;
    let api = api()?;
    let (num_drivers, roots, others) = gpu_roots(api)?;
    if num_drivers == 0 {
        return Err(no_device("the Level Zero loader lists no driver".into()));
    }
    if roots.is_empty() {
        let seen = if others.is_empty() { "no devices".to_string() } else { format!("only {}", others.join(", ")) };
        return Err(no_device(format!("{num_drivers} driver(s) but no GPU device ({seen})")));
    }
    if let Some(m) = &mask {
        if roots.len() > m.max_devices() {
            tracing::warn!(
                "ZE_AFFINITY_MASK selects at most {} device(s) but the driver lists {}: the driver did not apply it",
                m.max_devices(),
                roots.len()
            );
        }
    }
    let counts: Vec<u32> = roots.iter().map(|r| r.subs.len() as u32).collect();
    let cands = candidates(&counts, h);
    let Candidate { root, sub } = pick(&cands, index, h)?;
    let r = &roots[root];
    let (device, props) = match sub {
        Some(s) => {
            let d = r.subs[s as usize];
            (d, properties(api, d)?)
        }
        None => (r.device, r.props),
    };
    let info = DeviceInfo {
        name: c_name(&props.name),
        vendor_id: props.vendorId,
        device_id: props.deviceId,
        ip_version: ip_version(api, device)?,
        sub_device: sub,
        memory_bytes: memory_bytes(api, device)?,
        max_alloc: props.maxMemAllocSize,
        relaxed_alloc_limits: driver_extensions(api, r.driver)?.iter().any(|e| e == RELAXED_ALLOCATION_LIMITS),
        compute_ordinal: compute_ordinal(api, device)?,
        max_group_size: max_group_size(api, device)?,
    };
    Ok(Selected { driver: r.driver, device, info, index: index.unwrap_or(0), of: cands.len(), hierarchy: h })
}

/// For `--device auto`: the name of the first Intel GPU Level Zero shows, or why there is none (one line).
pub fn intel_gpu() -> std::result::Result<String, String> {
    let api = api().map_err(|e| e.to_string())?;
    let (_, roots, _) = gpu_roots(api).map_err(|e| e.to_string())?;
    match roots.iter().find(|r| r.props.vendorId == INTEL_VENDOR_ID) {
        Some(r) => Ok(c_name(&r.props.name)),
        None if roots.is_empty() => Err("Level Zero lists no GPU".into()),
        None => Err(format!(
            "Level Zero lists no Intel GPU (found {})",
            roots
                .iter()
                .map(|r| format!("{} vendor 0x{:04x}", c_name(&r.props.name), r.props.vendorId))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_relaxed_limits_extension_is_named_as_in_the_header() {
        let header = sys::ZE_RELAXED_ALLOCATION_LIMITS_EXP_NAME;
        assert_eq!(RELAXED_ALLOCATION_LIMITS.as_bytes(), &header[..header.len() - 1]);
    }
}
