//! `EngineConfig`: everything needed to load a model and start the engine thread, as the CLI resolved it.

/// Compute dtype choice (`--dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DTypeArg {
    /// The config's `torch_dtype` on devices that compute in it; float32 on the CPU backend.
    Auto,
    BFloat16,
    Float16,
    Float32,
}

impl DTypeArg {
    /// Parses vLLM's spellings: auto, bfloat16, float16/half, float32/float.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "auto" => Some(Self::Auto),
            "bfloat16" | "bf16" => Some(Self::BFloat16),
            "float16" | "half" | "fp16" => Some(Self::Float16),
            "float32" | "float" | "fp32" => Some(Self::Float32),
            _ => None,
        }
    }

    /// The weights' dtype on a device: `auto` is float32 on the CPU backend (the precision of the transformers
    /// goldens the CPU is held to; `--dtype bfloat16` is the opt-in there, docs/decisions/) and for GGUF files
    /// (dequantized to f32 at load); elsewhere the config's dtype, a float32 checkpoint served
    /// in bfloat16 (as vLLM does) and bfloat16 when the config names none. `rserve plan` resolves it the same way
    /// (`plan::dtype::resolve_dtype`), so its KV and weight sizes are the server's.
    pub fn resolve(self, host: bool, gguf: bool, torch_dtype: Option<&str>) -> candle_core::DType {
        use candle_core::DType;
        match self {
            Self::BFloat16 => DType::BF16,
            Self::Float16 => DType::F16,
            Self::Float32 => DType::F32,
            Self::Auto if host || gguf => DType::F32,
            Self::Auto => match torch_dtype {
                Some("float16" | "half") => DType::F16,
                _ => DType::BF16,
            },
        }
    }
}

/// The CPU compute threads by default: one per physical core of the cores this process may use (the logical CPUs
/// divided by the hardware threads per core that Linux reports for cpu0; all logical CPUs where it does not).
pub fn default_cpu_threads() -> usize {
    let logical = std::thread::available_parallelism().map_or(1, |n| n.get());
    let smt = std::fs::read_to_string("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list")
        .ok()
        .map(|list| {
            list.trim()
                .split(',')
                .map(|r| match r.split_once('-') {
                    Some((a, b)) => b.parse::<usize>().unwrap_or(0).saturating_sub(a.parse().unwrap_or(0)) + 1,
                    None => 1,
                })
                .sum::<usize>()
        })
        .unwrap_or(1)
        .max(1);
    (logical / smt).max(1)
}

/// How to load and run the model. Defaults mirror `vllm serve`.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// HF repo id, local directory or `.gguf` file.
    pub model: String,
    pub revision: Option<String>,
    /// Tokenizer override (repo id or directory); None: the model's own.
    pub tokenizer: Option<String>,
    /// `--tokenizer-revision`: the revision of a `--tokenizer` repo; None: `main`.
    pub tokenizer_revision: Option<String>,
    pub dtype: DTypeArg,
    /// None: the model's `max_position_embeddings` (capped by what the KV cache holds).
    pub max_model_len: Option<usize>,
    pub gpu_memory_utilization: f64,
    /// Exact KV cache size in bytes; overrides the utilization-based budget.
    pub kv_cache_memory_bytes: Option<u64>,
    /// `--kv-cache-dtype`: "auto" (the compute dtype), or bfloat16 / float16 / float32 (`kv_cache_dtype_choice`;
    /// other than the compute dtype only on the CPU backend).
    pub kv_cache_dtype: String,
    pub max_num_seqs: usize,
    /// None: the scheduler's default (`rserve_scheduler::DEFAULT_MAX_NUM_BATCHED_TOKENS`).
    pub max_num_batched_tokens: Option<usize>,
    /// `--max-num-partial-prefills`: most requests prefilling in one step; None: no limit.
    pub max_num_partial_prefills: Option<usize>,
    /// `--max-long-partial-prefills`: most of them with a prompt above the threshold; None: 1 when
    /// `max_num_partial_prefills` is set (vLLM's default), else no limit.
    pub max_long_partial_prefills: Option<usize>,
    /// `--long-prefill-token-threshold`: prompts above it are long and no prefill chunk is longer; None (or 0): 4 % of
    /// `max_model_len` when more than one partial prefill is allowed, else none.
    pub long_prefill_token_threshold: Option<usize>,
    pub block_size: usize,
    pub enable_prefix_caching: bool,
    /// `--chat-template`: a file path or an inline template.
    pub chat_template: Option<String>,
    /// `--generation-config`: "auto" (the model's generation_config.json), "vllm" (none), or a folder.
    pub generation_config: String,
    pub seed: u64,
    /// `--device`: auto, cpu, level-zero[:N], opencl, cuda[:N] (`engine::device`).
    pub device: String,
    /// Maximum number of waiting requests before new ones are refused (503).
    pub max_waiting: usize,
    /// Tensor-parallel ranks (`-tp`); > 1 needs an MPI launch (`mpiexec -n tp*pp`).
    pub tensor_parallel_size: usize,
    /// Pipeline-parallel stages (`-pp`).
    pub pipeline_parallel_size: usize,
    /// This engine's index among the data-parallel replicas of one server (`-dp`; vLLM's `engine` metrics label).
    pub data_parallel_rank: usize,
    /// Data-parallel replicas of the server (`-dp`): under `mpiexec` the world is `dp x tp x pp` ranks
    /// (`dist::layout::World`); in a single process with `-tp 1 -pp 1`, replicas in this process (`engine::replicas`).
    pub data_parallel_size: usize,
    /// Threads of this engine's CPU compute pool (rayon; `--cpu-threads`); None: one per physical core
    /// (`default_cpu_threads`). Set per replica when `-dp` splits the cores (`engine::replicas`).
    pub cpu_threads: Option<usize>,
    /// `--enable-expert-parallel`: each TP rank holds whole experts (a 1/tp share) instead of a slice of each.
    pub enable_expert_parallel: bool,
    /// The command line, for the exact `mpiexec` line printed when the launch does not match `-tp x -pp`.
    pub launch_args: Vec<String>,
    /// `--opencl-platform` (with `--device opencl`): a platform index or part of its name; None: the first with a GPU.
    pub opencl_platform: Option<String>,
    /// `--opencl-device`: a device index within that platform; None: its first GPU, else device 0.
    pub opencl_device: Option<usize>,
    /// The CPU backend keeps GGUF Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q4_K / Q5_K / Q6_K weights packed
    /// (`backend::cpu::quant`; the default, what a llama.cpp user expects of a quantized file). False with
    /// `--cpu-dequantize-weights`: every weight dequantized to the compute dtype, the reference the goldens hold the
    /// CPU to.
    pub cpu_packed_weights: bool,
    /// `--load-format`: "auto" (the checkpoint's weights) or "dummy" (random weights of the config's shapes).
    pub load_format: String,
    /// `--enforce-eager`: no CUDA graphs (decode steps run op by op).
    pub enforce_eager: bool,
    /// Async scheduling (the default; `--no-async-scheduling` turns it off): a step is scheduled and launched while
    /// the one before it runs, where the runner overlaps steps.
    pub async_scheduling: bool,
    /// `--profile`: timing output of the CUDA runner.
    pub profile: crate::runner::ProfileMode,
    /// `--download-dir`: the Hugging Face cache folder to look models and tokenizers up in and download to; None: the
    /// environment's (`HF_HUB_CACHE`, `HF_HOME`, ...).
    pub download_dir: Option<std::path::PathBuf>,
    /// `--hf-token`: the Hub token; `Some("")` (the flag without a value) means the stored token file, None the
    /// environment's.
    pub hf_token: Option<String>,
    /// `--max-logprobs`: most log-probs a request may ask for; None: the vocabulary size (vLLM's -1).
    pub max_logprobs: Option<usize>,
    /// Testing only (the hidden `--testing-fail-engine-after-requests N`): the engine thread exits when request N + 1
    /// arrives, so that tests can watch a server whose engine died.
    pub testing_fail_after_requests: Option<usize>,
    /// Testing only (the hidden `--testing-panic-in-step-after N`): the step after the first N panics inside the
    /// engine thread, so that tests can watch what a crash in a step does (`engine::faults`).
    pub testing_panic_in_step_after: Option<usize>,
    /// Testing only (the hidden `--testing-error-in-step-after N`): step N + 1 fails once with a backend error (as
    /// when the device runs out of memory), so that tests can watch the failed-step path.
    pub testing_error_in_step_after: Option<usize>,
    /// `--max-request-time`: a request still running this long after it arrived is ended (finish reason `abort`,
    /// its KV blocks freed); None: no limit.
    pub max_request_time: Option<std::time::Duration>,
    /// `--override-generation-config`: keys of generation_config.json (`temperature`, `top_p`, `top_k`, `min_p`,
    /// `repetition_penalty`, `max_new_tokens`) that win over the model's file.
    pub override_generation_config: serde_json::Map<String, serde_json::Value>,
    /// The `model_name` label of the metrics (vLLM's first served model name); `model` when unset.
    pub served_model_name: Option<String>,
    /// `--runner` (and the legacy `--task`): generate or pool; `Auto` decides from the architecture.
    pub runner: RunnerChoice,
    /// `--convert`: serve a model as an embedder or a classifier (with `--runner pooling`); `Auto` decides from the
    /// architecture.
    pub convert: ConvertChoice,
    /// `--pooler-config`: what the command line overrides of the model's pooler.
    pub pooler_config: rserve_model_io::config::pooling::PoolerOverride,
}

/// vLLM's `--runner`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunnerChoice {
    /// `...ForCausalLM` generates; an encoder (`BertModel`, `XLMRobertaModel`), a `...ForSequenceClassification` or
    /// a `...Model` without a head pools.
    Auto,
    Generate,
    Pooling,
}

/// vLLM's `--convert`: what a pooling runner makes of the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConvertChoice {
    /// A `...ForSequenceClassification` classifies, anything else embeds.
    Auto,
    /// As `Auto` (the model is served as its architecture is).
    None,
    /// Embed (a causal LM's hidden states pooled; its LM head unused).
    Embed,
    /// Classify.
    Classify,
}

impl EngineConfig {
    pub fn new(model: impl Into<String>) -> Self {
        Self {
            model: model.into(),
            revision: None,
            tokenizer: None,
            tokenizer_revision: None,
            dtype: DTypeArg::Auto,
            max_model_len: None,
            gpu_memory_utilization: 0.9,
            kv_cache_memory_bytes: None,
            kv_cache_dtype: "auto".into(),
            max_num_seqs: 256,
            max_num_batched_tokens: None,
            max_num_partial_prefills: None,
            max_long_partial_prefills: None,
            long_prefill_token_threshold: None,
            block_size: 16,
            enable_prefix_caching: true,
            chat_template: None,
            generation_config: "auto".into(),
            seed: 0,
            device: "auto".into(),
            max_waiting: 4096,
            tensor_parallel_size: 1,
            pipeline_parallel_size: 1,
            data_parallel_rank: 0,
            data_parallel_size: 1,
            cpu_threads: None,
            enable_expert_parallel: false,
            launch_args: std::env::args().collect(),
            opencl_platform: None,
            opencl_device: None,
            cpu_packed_weights: true,
            load_format: "auto".into(),
            enforce_eager: false,
            async_scheduling: true,
            profile: Default::default(),
            testing_fail_after_requests: None,
            testing_panic_in_step_after: None,
            testing_error_in_step_after: None,
            max_request_time: None,
            override_generation_config: serde_json::Map::new(),
            served_model_name: None,
            download_dir: None,
            hf_token: None,
            max_logprobs: Some(20),
            runner: RunnerChoice::Auto,
            convert: ConvertChoice::Auto,
            pooler_config: Default::default(),
        }
    }

    /// `--kv-cache-dtype` as an element type; None: `auto`. fp8 and unknown names are refused.
    pub fn kv_cache_dtype_choice(&self) -> crate::Result<Option<crate::backend::WeightDType>> {
        use crate::backend::WeightDType;
        use crate::plan::{DTypeChoice, Precision};
        match DTypeChoice::parse_kv_dtype(&self.kv_cache_dtype)? {
            DTypeChoice::Auto => Ok(None),
            DTypeChoice::Fixed(Precision::Float32) => Ok(Some(WeightDType::F32)),
            DTypeChoice::Fixed(Precision::BFloat16) => Ok(Some(WeightDType::BF16)),
            DTypeChoice::Fixed(Precision::Float16) => Ok(Some(WeightDType::F16)),
            DTypeChoice::Fixed(Precision::Fp8) => Err(crate::EngineError::InvalidArgument(format!(
                "--kv-cache-dtype {} is not supported yet (supported: auto, bfloat16, float16, float32)",
                self.kv_cache_dtype
            ))),
        }
    }

    /// World rank `rank`'s place in its replica's `-tp` x `-pp` grid (and whether experts are shared out, `-ep`).
    pub fn layout(&self, rank: usize) -> crate::dist::layout::Layout {
        crate::dist::layout::Layout {
            tp: self.tensor_parallel_size,
            pp: self.pipeline_parallel_size,
            rank: self.world().rank_in_replica(rank),
            expert_parallel: self.enable_expert_parallel,
        }
    }

    /// The MPI job this configuration asks for: `-dp` x `-tp` x `-pp` ranks.
    pub fn world(&self) -> crate::dist::layout::World {
        crate::dist::layout::World {
            dp: self.data_parallel_size.max(1),
            tp: self.tensor_parallel_size.max(1),
            pp: self.pipeline_parallel_size.max(1),
        }
    }

    /// How models and tokenizers are looked up: the environment's options with `--revision`, `--download-dir` and
    /// `--hf-token` applied.
    pub fn resolve_options(&self) -> crate::source::ResolveOptions {
        let mut opts = crate::source::ResolveOptions::from_env();
        opts.revision = self.revision.clone();
        if let Some(dir) = &self.download_dir {
            opts.cache_dir = dir.clone();
        }
        match self.hf_token.as_deref() {
            // Without a value vLLM uses the stored login, which the environment's options already fall back to.
            Some("") | None => {}
            Some(token) => opts.token = Some(token.to_owned()),
        }
        opts
    }
}
