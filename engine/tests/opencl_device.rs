//! Choosing the OpenCL platform and device: by index or by part of the platform's name, with errors that list what
//! exists, and what the engine learns about the device (name, memory rule for CPU devices).

mod backends;

use rserve_engine::backend::opencl::{list_devices, OpenClBackend, OpenClOptions};
use rserve_engine::backend::Backend;
use rserve_engine::engine::device::Device;
use rserve_engine::engine::EngineConfig;

#[test]
fn platform_by_name_or_index_and_clear_errors() {
    let Some(b) = backends::shared_opencl() else { return };
    let all = list_devices().expect("list devices");
    assert!(!all.is_empty() && all.iter().all(|(_, d)| !d.is_empty()), "{all:?}");
    let (platform, devices) = all.iter().find(|(p, _)| *p == b.info().platform).expect("the chosen platform is listed");
    assert!(devices.contains(&b.info().name));
    assert!(b.device_name().starts_with("opencl: "), "{}", b.device_name());
    if b.info().is_cpu {
        assert_eq!(b.memory_bytes(), None, "a CPU device budgets the KV cache from host memory");
    } else {
        assert_eq!(b.memory_bytes(), Some(b.info().global_mem_bytes));
    }

    let bad = |opts: OpenClOptions, want: &str| {
        let e = OpenClBackend::new(&opts).err().expect("must fail").to_string();
        assert!(e.contains(want) && e.contains(platform.as_str()), "{e}");
    };
    bad(
        OpenClOptions { platform: Some("no-such-vendor".into()), device: None },
        "no platform name contains 'no-such-vendor'",
    );
    bad(OpenClOptions { platform: Some(all.len().to_string()), device: None }, "does not exist");
    bad(OpenClOptions { platform: Some("0".into()), device: Some(devices.len() + 5) }, "has no device");

    // A part of the name, in another case, finds the same platform.
    let part: String = platform.chars().take(5).collect::<String>().to_uppercase();
    let by_name = OpenClBackend::new(&OpenClOptions { platform: Some(part), device: Some(0) }).expect("by name");
    assert_eq!(by_name.info().platform, *platform);
}

#[test]
fn engine_selects_opencl_from_its_config() {
    if std::env::var_os("OCL_ICD_VENDORS").is_none() {
        backends::opencl();
        return;
    }
    let mut cfg = EngineConfig::new("unused");
    cfg.device = "opencl".into();
    cfg.opencl_platform = Some("0".into());
    cfg.opencl_device = Some(0);
    let d = Device::select_for(&cfg).expect("opencl device");
    assert!(d.name().starts_with("opencl: "), "{}", d.name());
    cfg.opencl_platform = Some("no-such-vendor".into());
    assert!(Device::select_for(&cfg).is_err());
}
