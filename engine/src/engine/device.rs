//! Device selection: which backend runs the model (`--device`), how much memory it offers for the KV budget, and
//! building the `StepRunner` on it. New backends add an arm here; nothing else in the engine changes.

use crate::backend::cpu::CpuBackend;
use crate::config::ModelParams;
use crate::error::{EngineError, Result};
use crate::runner::{ModelRunner, StepRunner};
use crate::weights::Weights;

/// A chosen device, before the model is on it.
pub enum Device {
    Cpu(CpuBackend),
}

impl Device {
    /// Resolves `--device` (auto picks the best available device; today the CPU).
    pub fn select(name: &str) -> Result<Self> {
        match name {
            "auto" | "cpu" => Ok(Device::Cpu(CpuBackend::new())),
            other => Err(EngineError::InvalidArgument(format!(
                "--device {other} is not available in this build (supported: auto, cpu)"
            ))),
        }
    }

    /// Memory the device offers for weights + KV cache; None: host memory (the CPU budget rule applies).
    pub fn memory_bytes(&self) -> Option<u64> {
        match self {
            Device::Cpu(_) => None,
        }
    }

    pub fn name(&self) -> String {
        match self {
            Device::Cpu(b) => crate::backend::Backend::device_name(b),
        }
    }

    /// Uploads the model and allocates `num_blocks` KV blocks on this device.
    pub fn build_runner(
        self,
        params: &ModelParams,
        weights: &Weights,
        num_blocks: usize,
        block_size: usize,
    ) -> Result<Box<dyn StepRunner>> {
        match self {
            Device::Cpu(b) => Ok(Box::new(ModelRunner::new(b, params, weights, num_blocks, block_size)?)),
        }
    }
}
