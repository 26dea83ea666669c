//! Which form of a kernel module the Level Zero backend hands the driver: the PVC native binary that `rserve-kernels`
//! embeds (`ZE_MODULE_FORMAT_NATIVE`, compiled ahead of time by `ocloc -device pvc`) or the SPIR-V
//! (`ZE_MODULE_FORMAT_IL_SPIRV`, compiled by the driver at start-up). The rule is pure (`choose`) and tested here;
//! `backend` applies it per module, falls back to SPIR-V when the driver refuses a native binary, and counts what it
//! built (`module_builds`).
//!
//! The match: a device is PVC when its IP version (`ze_device_ip_version_ext_t`, architecture 12, release 60, any
//! revision) says so, or, on drivers that leave the IP version at 0, when its PCI id is one of PVC's. The binaries
//! carry no stepping check of their own (the zebin's revision range is not enforced), and a driver that still
//! refuses one (another stepping, a zebin version it does not read) costs one failed `zeModuleCreate` and a warning,
//! then the SPIR-V build. `RSERVE_ZE_MODULE_FORMAT=native|spirv` overrides the match (`auto`, the default, applies
//! it): the loader's null driver reports vendor 0, device 0 and no IP version, so its tests take the native path only
//! through the override (docs/decisions/2026-12-05-level-zero-pvc-native-binaries.md).

use std::sync::atomic::{AtomicU64, Ordering};

use super::discovery::{DeviceInfo, INTEL_VENDOR_ID};
use super::error::LzError;

/// The environment variable that overrides the device match.
pub const FORMAT_VAR: &str = "RSERVE_ZE_MODULE_FORMAT";

/// PVC's IP version without the revision: architecture 12, release 60 (`ocloc ids pvc` prints 12.60.7).
const PVC_ARCH_RELEASE: (u32, u32) = (12, 60);

/// PCI device ids of PVC (Data Center GPU Max 1100, 1350, 1550 and their variants), for drivers without the IP
/// version extension.
const PVC_DEVICE_IDS: &[u32] =
    &[0x0bd0, 0x0bd4, 0x0bd5, 0x0bd6, 0x0bd7, 0x0bd8, 0x0bd9, 0x0bda, 0x0bdb, 0x0b69, 0x0b6e];

/// The form a module is created from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModuleFormat {
    /// The PVC native binary (zebin).
    Native,
    /// SPIR-V, compiled by the driver.
    Spirv,
}

/// What `RSERVE_ZE_MODULE_FORMAT` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FormatPolicy {
    /// Native binaries on PVC, SPIR-V elsewhere.
    #[default]
    Auto,
    /// Native binaries whatever the device reports (a module without one still builds from SPIR-V).
    Native,
    /// SPIR-V always.
    Spirv,
}

impl FormatPolicy {
    /// Parses the variable's value (unset: `Auto`).
    pub fn parse(value: Option<&str>) -> Result<Self, LzError> {
        match value.map(str::trim) {
            None | Some("") | Some("auto") => Ok(Self::Auto),
            Some("native") => Ok(Self::Native),
            Some("spirv") => Ok(Self::Spirv),
            Some(other) => Err(LzError::Invalid(format!("{FORMAT_VAR}={other}: expected auto, native or spirv"))),
        }
    }

    /// The policy the environment sets.
    pub fn from_env() -> Result<Self, LzError> {
        Self::parse(crate::env::var(FORMAT_VAR).as_deref())
    }
}

/// The (architecture, release, revision) of a Level Zero IP version (`architecture << 22 | release << 14 |
/// revision`).
pub fn ip_parts(ip: u32) -> (u32, u32, u32) {
    (ip >> 22, (ip >> 14) & 0xff, ip & 0x3f)
}

/// Whether the device is a PVC, by IP version, else (IP version 0: not reported) by PCI id.
pub fn is_pvc(info: &DeviceInfo) -> bool {
    if info.vendor_id != INTEL_VENDOR_ID {
        return false;
    }
    if info.ip_version != 0 {
        let (arch, release, _) = ip_parts(info.ip_version);
        return (arch, release) == PVC_ARCH_RELEASE;
    }
    PVC_DEVICE_IDS.contains(&info.device_id)
}

/// The format to try first for one module, and why (for the log).
pub fn choose(policy: FormatPolicy, info: &DeviceInfo, has_native: bool) -> (ModuleFormat, &'static str) {
    match policy {
        FormatPolicy::Spirv => (ModuleFormat::Spirv, "RSERVE_ZE_MODULE_FORMAT=spirv"),
        _ if !has_native => (ModuleFormat::Spirv, "no PVC binary was built for this module"),
        FormatPolicy::Native => (ModuleFormat::Native, "RSERVE_ZE_MODULE_FORMAT=native"),
        FormatPolicy::Auto if is_pvc(info) => (ModuleFormat::Native, "the device is a PVC"),
        FormatPolicy::Auto => (ModuleFormat::Spirv, "the device is not a PVC"),
    }
}

/// Whether the device builds the matrix-engine module (`rserve_kernels::Target::MatrixEngine`, the XMX matmul):
/// on a PVC, and under `RSERVE_ZE_MODULE_FORMAT=native` (whose binaries are PVC's).
pub fn builds_matrix_engine(policy: FormatPolicy, info: &DeviceInfo) -> bool {
    policy == FormatPolicy::Native || is_pvc(info)
}

/// Process-wide counts of modules built, by the form the driver accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ModuleBuilds {
    /// Created from a PVC native binary.
    pub native: u64,
    /// Created from SPIR-V.
    pub spirv: u64,
    /// Native binaries the driver refused (each then built from SPIR-V, counted in `spirv`).
    pub native_refused: u64,
}

static NATIVE: AtomicU64 = AtomicU64::new(0);
static SPIRV: AtomicU64 = AtomicU64::new(0);
static REFUSED: AtomicU64 = AtomicU64::new(0);

pub(crate) fn built(format: ModuleFormat) {
    match format {
        ModuleFormat::Native => NATIVE.fetch_add(1, Ordering::Relaxed),
        ModuleFormat::Spirv => SPIRV.fetch_add(1, Ordering::Relaxed),
    };
}

pub(crate) fn native_refused() {
    REFUSED.fetch_add(1, Ordering::Relaxed);
}

/// The counts now.
pub fn module_builds() -> ModuleBuilds {
    ModuleBuilds {
        native: NATIVE.load(Ordering::Relaxed),
        spirv: SPIRV.load(Ordering::Relaxed),
        native_refused: REFUSED.load(Ordering::Relaxed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(vendor_id: u32, device_id: u32, ip_version: u32) -> DeviceInfo {
        DeviceInfo {
            name: "test".into(),
            vendor_id,
            device_id,
            ip_version,
            sub_device: None,
            memory_bytes: 0,
            max_alloc: 0,
            relaxed_alloc_limits: false,
            compute_ordinal: 0,
            max_group_size: 0,
        }
    }

    const fn ip(arch: u32, release: u32, revision: u32) -> u32 {
        arch << 22 | release << 14 | revision
    }

    #[test]
    fn ip_version_fields() {
        // The value ocloc's `ids pvc` names 12.60.7.
        assert_eq!(ip(12, 60, 7), 0x030f_0007);
        assert_eq!(ip_parts(0x030f_0007), (12, 60, 7));
    }

    #[test]
    fn pvc_by_ip_version_then_by_pci_id() {
        assert!(is_pvc(&device(INTEL_VENDOR_ID, 0x0bd5, ip(12, 60, 7))));
        // Any PVC stepping; the PCI id does not matter when the IP version is reported.
        assert!(is_pvc(&device(INTEL_VENDOR_ID, 0x1234, ip(12, 60, 3))));
        // Another Xe architecture (DG2 is 12.55) is not a PVC, whatever its PCI id.
        assert!(!is_pvc(&device(INTEL_VENDOR_ID, 0x0bd5, ip(12, 55, 8))));
        // No IP version: the PCI id decides.
        assert!(is_pvc(&device(INTEL_VENDOR_ID, 0x0bda, 0)));
        assert!(!is_pvc(&device(INTEL_VENDOR_ID, 0x56c0, 0)));
        // Not Intel: never (the null driver reports vendor 0, device 0, no IP version).
        assert!(!is_pvc(&device(0, 0x0bd5, ip(12, 60, 7))));
        assert!(!is_pvc(&device(0, 0, 0)));
    }

    #[test]
    fn choice_by_policy_device_and_binary() {
        let pvc = device(INTEL_VENDOR_ID, 0x0bd5, ip(12, 60, 7));
        let null = device(0, 0, 0);
        assert_eq!(choose(FormatPolicy::Auto, &pvc, true).0, ModuleFormat::Native);
        assert_eq!(choose(FormatPolicy::Auto, &null, true).0, ModuleFormat::Spirv);
        assert_eq!(choose(FormatPolicy::Auto, &pvc, false).0, ModuleFormat::Spirv);
        assert_eq!(choose(FormatPolicy::Native, &null, true).0, ModuleFormat::Native);
        assert_eq!(choose(FormatPolicy::Native, &null, false).0, ModuleFormat::Spirv);
        assert_eq!(choose(FormatPolicy::Spirv, &pvc, true).0, ModuleFormat::Spirv);
    }

    #[test]
    fn matrix_engine_on_pvc_or_with_native_binaries() {
        let pvc = device(INTEL_VENDOR_ID, 0x0bd5, ip(12, 60, 7));
        let null = device(0, 0, 0);
        assert!(builds_matrix_engine(FormatPolicy::Auto, &pvc));
        assert!(builds_matrix_engine(FormatPolicy::Spirv, &pvc));
        assert!(builds_matrix_engine(FormatPolicy::Native, &null));
        assert!(!builds_matrix_engine(FormatPolicy::Auto, &null));
        assert!(!builds_matrix_engine(FormatPolicy::Spirv, &null));
    }

    #[test]
    fn policy_values() {
        assert_eq!(FormatPolicy::parse(None).unwrap(), FormatPolicy::Auto);
        assert_eq!(FormatPolicy::parse(Some("auto")).unwrap(), FormatPolicy::Auto);
        assert_eq!(FormatPolicy::parse(Some("native")).unwrap(), FormatPolicy::Native);
        assert_eq!(FormatPolicy::parse(Some("spirv")).unwrap(), FormatPolicy::Spirv);
        let e = FormatPolicy::parse(Some("zebin")).unwrap_err().to_string();
        assert!(e.contains("RSERVE_ZE_MODULE_FORMAT=zebin"), "{e}");
    }
}
