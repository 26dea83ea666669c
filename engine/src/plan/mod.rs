//! The memory and parallelism planner behind `rserve plan`: from a model's `config.json` (or GGUF header) alone,
//! the parameters, weights memory, KV bytes per token and per sequence, the devices a full-context sequence
//! needs, the valid tensor- and pipeline-parallel sizes, and for the chosen layout the KV memory left, the
//! full-context requests that fit, and what a shorter context or more pipeline stages buy. Every number carries the
//! formula that produced it (`Plan::lines`).
//!
//! Code map: `source` finds the config (never the weights), `shape` / `shape_gguf` read it into a `ModelShape`
//! for any decoder architecture, `params` counts parameters, `memory` holds the arithmetic shared with the server's
//! start-up KV sizing (`engine::budget`, so the plan and the start-up log agree), `device` the device profiles,
//! `layout` the TP / PP rules and the per-device memory of a layout, `build` assembles a `Plan`, `render` prints it.
//! Invariant: nothing here reads tensor data; a plan costs a few file reads.

mod build;
pub mod device;
pub mod dtype;
pub mod layout;
pub mod memory;
pub mod params;
mod render;
pub mod shape;
pub mod shape_gguf;
pub mod source;

use serde::Serialize;

pub use build::plan as plan_shape;
pub use device::DeviceProfile;
pub use dtype::{DTypeChoice, Precision};
pub use layout::LayoutPlan;
pub use memory::StepShape;
pub use shape::ModelShape;
pub use source::ConfigSource;

use crate::source::ResolveOptions;
use crate::Result;

/// Which device the plan sizes for.
#[derive(Debug, Clone, PartialEq)]
pub enum DeviceChoice {
    /// A named profile (`--device-profile`).
    Profile(String),
    /// A device of this many bytes (`--device-memory`).
    Memory(u64),
}

/// The planner's inputs, as `rserve plan` flags give them.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanOptions {
    pub dtype: DTypeChoice,
    pub kv_cache_dtype: DTypeChoice,
    /// None: the model's `max_position_embeddings`.
    pub max_model_len: Option<usize>,
    pub gpu_memory_utilization: f64,
    pub device: DeviceChoice,
    /// Evaluate this TP size (with `pp`, exactly this layout).
    pub tp: Option<usize>,
    pub pp: Option<usize>,
    /// Data-parallel replicas of the layout (`-dp`): the table lays out their MPI ranks; None: as many as a node holds.
    pub dp: Option<usize>,
    pub block_size: usize,
    pub step: StepShape,
    /// Exact KV bytes per device, as the server's `--kv-cache-memory-bytes`.
    pub kv_cache_memory_bytes: Option<u64>,
}

impl Default for PlanOptions {
    /// bf16-style auto dtypes, utilization 0.9, a PVC tile, block size 16: the defaults of `rserve plan`.
    fn default() -> Self {
        PlanOptions {
            dtype: DTypeChoice::Auto,
            kv_cache_dtype: DTypeChoice::Auto,
            max_model_len: None,
            gpu_memory_utilization: 0.9,
            device: DeviceChoice::Profile("intel-max-1550-tile".into()),
            tp: None,
            pp: None,
            dp: None,
            block_size: 16,
            step: StepShape::default(),
            kv_cache_memory_bytes: None,
        }
    }
}

/// One printed line: what, how much, and the formula behind it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Line {
    pub name: String,
    pub value: String,
    pub formula: String,
}

/// A shorter `--max-model-len` on the chosen layout, and the smallest layout it would need.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ContextOption {
    pub max_model_len: usize,
    pub kv_bytes_per_sequence: u64,
    pub min_memory_bytes: u64,
    pub devices_needed: usize,
    /// The layout the planner would choose at this length (TP, PP).
    pub smallest_layout: Option<(usize, usize)>,
    /// Full-context requests of this length on the chosen layout.
    pub requests_on_chosen_layout: Option<u64>,
}

/// Where the parameter count comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ParamSource {
    ConfigShapes,
    SafetensorsHeaders,
    GgufTensorDirectory,
}

/// The whole plan.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    pub model: String,
    pub source: String,
    pub shape: ModelShape,
    pub device: DeviceProfile,
    pub dtype: Precision,
    pub dtype_reason: String,
    pub kv_cache_dtype: Precision,
    pub kv_cache_dtype_reason: String,
    pub max_model_len: usize,
    pub gpu_memory_utilization: f64,
    pub block_size: usize,
    pub step: StepShape,
    pub kv_cache_memory_bytes: Option<u64>,
    pub parameters: u64,
    pub parameters_source: ParamSource,
    pub parameters_from_config: u64,
    /// A mixture of experts: the parameters one token uses (the config's count less the experts it is not routed
    /// to); None for a dense model.
    pub active_parameters: Option<u64>,
    pub weights_bytes: u64,
    pub kv_bytes_per_token: u64,
    pub kv_bytes_per_sequence: u64,
    /// With a window-aware cache (sliding-window layers keep only their window), when that is smaller.
    pub kv_bytes_per_sequence_windowed: Option<u64>,
    pub min_memory_bytes: u64,
    pub usable_bytes_per_device: u64,
    pub devices_needed: usize,
    pub valid_tp: Vec<usize>,
    pub preferred_tp: Vec<usize>,
    pub valid_pp: Vec<usize>,
    pub layout: Option<LayoutPlan>,
    /// `-dp` as asked (`PlanOptions::dp`).
    pub data_parallel: Option<usize>,
    pub shorter_context: Vec<ContextOption>,
    pub larger_pp: Vec<LayoutPlan>,
    pub warnings: Vec<String>,
    pub lines: Vec<Line>,
}

impl Plan {
    /// The plan as a readable table, every line with its formula.
    pub fn to_text(&self) -> String {
        render::text(self)
    }

    /// The plan as pretty-printed JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }
}

/// Reads the model description of `source`: its shape, and the parameter count of the weight headers when the
/// weights are on disk.
pub fn read_source(source: &ConfigSource) -> Result<(ModelShape, Option<(u64, ParamSource)>)> {
    match source {
        ConfigSource::Json { config, safetensors } => {
            let shape = crate::config::hf::read_config_file(config, ModelShape::from_config_json)?;
            let headers = if safetensors.is_empty() {
                None
            } else {
                Some((crate::weights::safetensors_param_count(safetensors)?, ParamSource::SafetensorsHeaders))
            };
            Ok((shape, headers))
        }
        ConfigSource::Gguf { file } => {
            let content = crate::config::gguf_meta::read_gguf_header(file)?;
            let shape = shape_gguf::shape_from_gguf(&content)?;
            Ok((shape, Some((shape_gguf::gguf_param_count(&content), ParamSource::GgufTensorDirectory))))
        }
    }
}

/// Plans `spec` (a Hub repo id, a model folder, a `config.json`, or a `.gguf`) without reading any weights.
pub fn plan_model(spec: &str, opts: &PlanOptions, resolve: &ResolveOptions) -> Result<Plan> {
    let source = source::locate(spec, resolve)?;
    let (shape, headers) = read_source(&source)?;
    build::plan(spec, &source.path().display().to_string(), shape, headers, opts)
}
