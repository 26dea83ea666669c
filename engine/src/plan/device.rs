//! Device profiles the planner sizes for: memory per device, the tensor-parallel sizes a node allows (TP stays
//! inside a node), and how many devices a node has. Also the host's available memory, which is the "device
//! memory" of the CPU backend.

use serde::Serialize;

use crate::{EngineError, Result};

/// One kind of device.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceProfile {
    pub name: String,
    /// Memory of one device, in bytes.
    pub memory_bytes: u64,
    /// TP sizes usable inside one node, ascending.
    pub tp_sizes: Vec<usize>,
    pub devices_per_node: usize,
    /// The CPU backend: memory is the host's, and the KV budget follows the server's CPU rule (at most 4 GiB
    /// unless --kv-cache-memory-bytes is given).
    pub host: bool,
    /// Where the memory figure comes from.
    pub source: String,
}

/// The named profiles `--device-profile` accepts.
pub const PROFILE_NAMES: &[&str] = &["intel-max-1550-tile", "nvidia-h200", "cpu"];

/// One Intel Data Center GPU Max 1550 tile (a Max 1550 is two tiles; an Aurora node has 6 GPUs = 12 tiles).
const PVC_TILE_BYTES: u64 = 64 << 30;
/// An H200's memory as CUDA sees it: nvidia-smi on an H200 reports 143771 MiB total, 616 MiB reserved by the
/// driver, 143156 MiB free on an idle device (marketed as 141 GB).
const H200_BYTES: u64 = 143_156 << 20;

/// `MemAvailable` from /proc/meminfo, when readable.
pub fn host_available_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

impl DeviceProfile {
    /// A GPU-like device: TP groups of 1, 2, 4 or 8 inside a node of `devices_per_node`.
    fn accelerator(name: &str, memory_bytes: u64, devices_per_node: usize, source: &str) -> Self {
        DeviceProfile {
            name: name.into(),
            memory_bytes,
            tp_sizes: vec![1, 2, 4, 8],
            devices_per_node,
            host: false,
            source: source.into(),
        }
    }

    /// A named profile.
    pub fn named(name: &str) -> Result<Self> {
        match name {
            // 12 tiles per node, but TP groups of 2, 4 or 8 (never 12: it divides no usual head count and crosses the
            // node's Xe Link groups).
            "intel-max-1550-tile" | "pvc-tile" => {
                Ok(Self::accelerator("intel-max-1550-tile", PVC_TILE_BYTES, 12, "64 GiB HBM2e per tile"))
            }
            "nvidia-h200" | "h200" => Ok(Self::accelerator(
                "nvidia-h200",
                H200_BYTES,
                8,
                "143156 MiB usable per GPU (nvidia-smi: 143771 MiB total, 616 MiB reserved)",
            )),
            "cpu" => {
                let (memory_bytes, source) = match host_available_bytes() {
                    Some(b) => (b, "MemAvailable of this host (/proc/meminfo)".to_string()),
                    None => (8 << 30, "8 GiB (MemAvailable unreadable)".to_string()),
                };
                Ok(DeviceProfile {
                    name: "cpu".into(),
                    memory_bytes,
                    tp_sizes: vec![1],
                    devices_per_node: 1,
                    host: true,
                    source,
                })
            }
            other => Err(EngineError::InvalidArgument(format!(
                "--device-profile {other} is unknown (known: {}; or pass --device-memory BYTES)",
                PROFILE_NAMES.join(", ")
            ))),
        }
    }

    /// A device of `bytes` memory in an 8-device node (`--device-memory`).
    pub fn with_memory(bytes: u64) -> Result<Self> {
        if bytes == 0 {
            return Err(EngineError::InvalidArgument("--device-memory must be positive".into()));
        }
        Ok(Self::accelerator("custom", bytes, 8, "--device-memory"))
    }

    /// The largest TP size a node allows.
    pub fn max_tp(&self) -> usize {
        self.tp_sizes.last().copied().unwrap_or(1)
    }
}
