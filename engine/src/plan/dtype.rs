//! Element types the planner sizes with (`--dtype`, `--kv-cache-dtype`) and how `auto` resolves.

use serde::Serialize;

use super::shape::ModelShape;
use crate::{EngineError, Result};

/// A storage precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    Float32,
    BFloat16,
    Float16,
    Fp8,
}

impl Precision {
    pub fn bytes(self) -> usize {
        match self {
            Precision::Float32 => 4,
            Precision::BFloat16 | Precision::Float16 => 2,
            Precision::Fp8 => 1,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Precision::Float32 => "float32",
            Precision::BFloat16 => "bfloat16",
            Precision::Float16 => "float16",
            Precision::Fp8 => "fp8",
        }
    }

    /// vLLM's spellings of the compute dtypes.
    fn parse_compute(s: &str) -> Option<Self> {
        match s {
            "bfloat16" | "bf16" => Some(Precision::BFloat16),
            "float16" | "half" | "fp16" => Some(Precision::Float16),
            "float32" | "float" | "fp32" => Some(Precision::Float32),
            _ => None,
        }
    }
}

/// `--dtype` / `--kv-cache-dtype` before `auto` is resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DTypeChoice {
    #[default]
    Auto,
    Fixed(Precision),
}

impl DTypeChoice {
    /// Parses `--dtype`: auto, bfloat16, float16 (half), float32 (float).
    pub fn parse_dtype(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(DTypeChoice::Auto),
            other => Precision::parse_compute(other).map(DTypeChoice::Fixed).ok_or_else(|| {
                EngineError::InvalidArgument(format!("--dtype {other} is unknown (auto, bfloat16, float16, float32)"))
            }),
        }
    }

    /// Parses `--kv-cache-dtype`: auto (the compute dtype), fp8 (fp8_e4m3, fp8_e5m2), or a compute dtype.
    pub fn parse_kv_dtype(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(DTypeChoice::Auto),
            "fp8" | "fp8_e4m3" | "fp8_e5m2" => Ok(DTypeChoice::Fixed(Precision::Fp8)),
            other => Precision::parse_compute(other).map(DTypeChoice::Fixed).ok_or_else(|| {
                EngineError::InvalidArgument(format!(
                    "--kv-cache-dtype {other} is unknown (auto, fp8, fp8_e4m3, fp8_e5m2, bfloat16, float16, float32)"
                ))
            }),
        }
    }
}

/// The weights' precision and why: `auto` is float32 on the CPU backend (the goldens' precision; 16 bits only with
/// `--dtype`) and for GGUF files
/// (dequantized to f32), else the config's dtype, with float32 checkpoints served in bfloat16 (as vLLM does) and
/// bfloat16 when the config names none: the server's rule (`engine::DTypeArg::resolve`).
pub fn resolve_dtype(choice: DTypeChoice, shape: &ModelShape, host: bool) -> (Precision, String) {
    if let DTypeChoice::Fixed(p) = choice {
        return (p, "--dtype".into());
    }
    if host {
        return (Precision::Float32, "auto: the CPU backend computes in float32".into());
    }
    if shape.architecture.ends_with("(GGUF)") {
        return (Precision::Float32, "auto: GGUF weights are dequantized to float32".into());
    }
    match shape.torch_dtype.as_deref().and_then(Precision::parse_compute) {
        Some(Precision::Float32) => (Precision::BFloat16, "auto: config dtype float32, served as bfloat16".into()),
        Some(p) => (p, "auto: config dtype".into()),
        None => (Precision::BFloat16, "auto: the config names no dtype".into()),
    }
}

/// The KV cache's precision: `auto` is the compute dtype on every backend (on the CPU float32 unless `--dtype` asks
/// for 16 bits), as the server's `Backend::kv_cache_dtype`.
pub fn resolve_kv_dtype(choice: DTypeChoice, compute: Precision, host: bool) -> (Precision, String) {
    match choice {
        DTypeChoice::Fixed(p) => (p, "--kv-cache-dtype".into()),
        DTypeChoice::Auto if host => (compute, "auto: the compute dtype (the CPU backend's)".into()),
        DTypeChoice::Auto => (compute, "auto: the compute dtype".into()),
    }
}
