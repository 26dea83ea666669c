//! `rserve plan MODEL`: the memory and parallelism plan of a model from its config alone (no weights are read):
//! parameters, weights memory, KV per token and per sequence, devices needed, valid TP / PP sizes, and the chosen
//! layout's KV memory and full-context requests, each with its formula; `--json` for machines. The engine's
//! planner (`rserve_engine::plan`) does the work; this file owns the flags.

use anyhow::Context;
use clap::Args;
use rserve_engine::plan::{self, DTypeChoice, DeviceChoice, PlanOptions, StepShape};
use rserve_engine::source::ResolveOptions;

use crate::human::parse_human_int;

#[derive(Debug, Clone, Args)]
pub struct PlanArgs {
    /// The model: a Hugging Face repo id, a model folder, a config.json, or a .gguf file. Only the config (or the
    /// GGUF header) is read.
    #[arg(value_name = "MODEL")]
    pub model: String,
    /// Context length (prompt + output) each request may use. Default: the model's. Accepts 1k, 128K, ...
    #[arg(long, value_parser = parse_human_int)]
    pub max_model_len: Option<u64>,
    /// Weights dtype: auto (the config's; float32 on the cpu profile), bfloat16, float16, float32.
    #[arg(long, default_value = "auto")]
    pub dtype: String,
    /// KV cache dtype: auto (the weights dtype), fp8, fp8_e4m3, fp8_e5m2, bfloat16, float16, float32.
    #[arg(long, default_value = "auto")]
    pub kv_cache_dtype: String,
    /// Fraction of each device's memory for weights and KV cache (0, 1].
    #[arg(long, default_value_t = 0.9)]
    pub gpu_memory_utilization: f64,
    /// Device: intel-max-1550-tile (default; 64 GiB, TP 1/2/4/8 per node), nvidia-h200, or cpu (this host's
    /// available memory).
    #[arg(long, conflicts_with = "device_memory")]
    pub device_profile: Option<String>,
    /// Memory of one device in bytes, instead of a profile (8 devices per node). Accepts 80g, 64G, ...
    #[arg(long, value_parser = parse_human_int)]
    pub device_memory: Option<u64>,
    /// Evaluate this tensor-parallel size (default: the smallest layout that fits).
    #[arg(long = "tp", visible_alias = "tensor-parallel-size")]
    pub tp: Option<usize>,
    /// Evaluate this pipeline-parallel size.
    #[arg(long = "pp", visible_alias = "pipeline-parallel-size")]
    pub pp: Option<usize>,
    /// Lay out this many data-parallel replicas of the layout (their MPI ranks, nodes and the mpiexec line); default:
    /// as many as one node holds.
    #[arg(long = "dp", visible_alias = "data-parallel-size")]
    pub dp: Option<usize>,
    /// Tokens per KV cache block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Exact KV cache bytes per device, as `rserve serve --kv-cache-memory-bytes`.
    #[arg(long, value_parser = parse_human_int)]
    pub kv_cache_memory_bytes: Option<u64>,
    /// Tokens per engine step (bounds the activation estimate).
    #[arg(long, default_value_t = rserve_engine::DEFAULT_MAX_NUM_BATCHED_TOKENS)]
    pub max_num_batched_tokens: usize,
    /// Sequences per engine step (bounds the logits in the activation estimate).
    #[arg(long, default_value_t = 256)]
    pub max_num_seqs: usize,
    /// Model revision on the Hugging Face hub (for repo ids).
    #[arg(long)]
    pub revision: Option<String>,
    /// Print the plan as JSON.
    #[arg(long)]
    pub json: bool,
}

impl PlanArgs {
    fn options(&self) -> anyhow::Result<PlanOptions> {
        let device = match (&self.device_memory, &self.device_profile) {
            (Some(bytes), _) => DeviceChoice::Memory(*bytes),
            (None, Some(name)) => DeviceChoice::Profile(name.clone()),
            (None, None) => DeviceChoice::Profile("intel-max-1550-tile".into()),
        };
        let max_model_len = match self.max_model_len {
            Some(v) => Some(usize::try_from(v).context("--max-model-len is too large")?),
            None => None,
        };
        Ok(PlanOptions {
            dtype: DTypeChoice::parse_dtype(&self.dtype)?,
            kv_cache_dtype: DTypeChoice::parse_kv_dtype(&self.kv_cache_dtype)?,
            max_model_len,
            gpu_memory_utilization: self.gpu_memory_utilization,
            device,
            tp: self.tp,
            pp: self.pp,
            dp: self.dp,
            block_size: self.block_size,
            step: StepShape { max_num_batched_tokens: self.max_num_batched_tokens, max_num_seqs: self.max_num_seqs },
            kv_cache_memory_bytes: self.kv_cache_memory_bytes,
        })
    }

    /// The plan, rendered as text or JSON.
    pub fn render(&self) -> anyhow::Result<String> {
        let mut resolve = ResolveOptions::from_env();
        resolve.revision = self.revision.clone();
        resolve.progress = false;
        let p = plan::plan_model(&self.model, &self.options()?, &resolve)
            .with_context(|| format!("planning {}", self.model))?;
        Ok(if self.json { p.to_json() } else { p.to_text() })
    }
}

pub fn run(args: PlanArgs) -> anyhow::Result<()> {
    let out = args.render()?;
    println!("{}", out.trim_end());
    Ok(())
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
