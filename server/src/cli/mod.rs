//! The command line, mirroring `vllm serve`: `rserve MODEL [flags]` (same as `rserve serve MODEL`), plus `generate`
//! and `convert`. Flags are grouped in `--help` like vLLM's (ModelConfig, CacheConfig, ParallelConfig, …). Here the
//! implemented flags are parsed and checked; a value we cannot honour yet is a start-up error (`CliError`), never
//! silently ignored. Every other `vllm serve` flag is classified in `vllm_flags` and applied by `compat` before clap
//! runs (ignored with a warning, or refused with a reason); `config_file` reads `--config FILE.yaml`, `env` lists the
//! `VLLM_*` variables rserve reads, `flag_docs` writes README's flag table from all of it.

mod api_keys;
mod compat;
mod config_file;
pub mod env;
pub mod flag_docs;
mod help_topic;
pub mod limits;
mod pooling;
pub mod vllm_flags;

pub use compat::Notice;

pub use crate::human::parse_human_int;
use crate::openai::reasoning::ReasoningParser;
use crate::openai::tool_parsers::ToolParser;
use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Args, CommandFactory, Parser, Subcommand};
use rserve_engine::engine::{DTypeArg, EngineConfig};

/// Subcommand names; any other first argument is taken as the model of `serve`.
const SUBCOMMANDS: &[&str] = &["serve", "generate", "convert", "bench", "plan", "run-batch", "help", "help-flags"];

#[derive(Debug, Parser)]
#[command(
    name = "rserve",
    version,
    about = "rserve: an OpenAI-compatible LLM server (vLLM-compatible command line).",
    long_about = None,
    after_help = "`rserve MODEL [OPTIONS]` is the same as `rserve serve MODEL [OPTIONS]`."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

// Parsed once at start-up; boxing the large variants would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve a model over the OpenAI-compatible HTTP API (the default command).
    Serve(ServeArgs),
    /// Generate text for one prompt and print it as it streams.
    Generate(GenerateArgs),
    /// Convert a GGUF file into a Hugging Face style model folder.
    Convert(ConvertArgs),
    /// Plan memory and parallelism (weights, KV cache, devices, TP x PP) from the model's config alone.
    Plan(crate::plan::PlanArgs),
    /// Run a file of OpenAI batch requests offline (like `vllm run-batch`): `-i IN.jsonl -o OUT.jsonl MODEL`.
    RunBatch(crate::run_batch::RunBatchArgs),
    /// Benchmarks: `bench serve` load-tests an OpenAI-compatible server (like `vllm bench serve`).
    #[command(subcommand)]
    Bench(Box<rserve_benches::BenchCommand>),
    /// Print, as Markdown tables, what rserve does with every `vllm serve` flag and `VLLM_*` variable (README's
    /// flag section).
    HelpFlags,
}

/// A flag given twice takes its last value, as argparse does (a `--config` file's flag, then the command line's).
#[derive(Debug, Clone, Args)]
#[command(args_override_self = true)]
pub struct ServeArgs {
    /// The model: a Hugging Face repo id, a local model folder, or a .gguf file.
    #[arg(value_name = "MODEL_TAG")]
    pub model_tag: Option<String>,
    /// Read flags from a YAML file (keys are flag names without `--`); flags on the command line win over it.
    #[arg(long, value_name = "FILE.yaml")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub frontend: FrontendArgs,
    /// The vLLM flags accepted without effect (logged at start-up).
    #[arg(skip)]
    pub notices: Vec<Notice>,
}

/// Everything that shapes the engine (shared by `serve` and `generate`).
#[derive(Debug, Clone, Args)]
pub struct EngineArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub cache: CacheArgs,
    #[command(flatten)]
    pub parallel: ParallelArgs,
    #[command(flatten)]
    pub scheduler: SchedulerArgs,
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Testing only: the engine thread exits when request N + 1 arrives, as if it had failed (for the tests of a
    /// server whose engine died: `/health` 503, 5xx answers, a clean exit on SIGTERM).
    #[arg(long, hide = true, value_name = "N")]
    pub testing_fail_engine_after_requests: Option<usize>,
    /// Testing only: engine step N + 1 panics (the tests of a crash inside a step: errors to the requests in flight,
    /// `/health` 503, the exit vLLM makes when its engine dies).
    #[arg(long, hide = true, value_name = "N")]
    pub testing_panic_in_step_after: Option<usize>,
    /// Testing only: engine step N + 1 fails once with a backend error, as when the device runs out of memory.
    #[arg(long, hide = true, value_name = "N")]
    pub testing_error_in_step_after: Option<usize>,
}

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "ModelConfig")]
pub struct ModelArgs {
    /// The model (alternative to the positional MODEL_TAG).
    #[arg(long)]
    pub model: Option<String>,
    /// Tokenizer to use instead of the model's own: a Hub repo id (looked up and downloaded like models) or a folder.
    #[arg(long)]
    pub tokenizer: Option<String>,
    /// Revision (branch, tag or commit) of a --tokenizer repo (default: main).
    #[arg(long)]
    pub tokenizer_revision: Option<String>,
    /// Hugging Face token for gated or private repos (default, and given without a value: HF_TOKEN, else the token
    /// file `hf auth login` writes).
    #[arg(long, num_args = 0..=1, default_missing_value = "")]
    pub hf_token: Option<String>,
    /// Weights quantization. rserve serves unquantized weights (GGUF files are dequantized at load): only "gguf"
    /// for a .gguf model, or "none".
    #[arg(long)]
    pub quantization: Option<String>,
    /// Most log-probs a request may ask for (`logprobs` / `top_logprobs`); -1: the vocabulary size.
    #[arg(long, default_value_t = 20, allow_negative_numbers = true)]
    pub max_logprobs: i64,
    /// Model revision (branch, tag or commit) on the Hugging Face hub.
    #[arg(long)]
    pub revision: Option<String>,
    /// Compute dtype: auto (float32 on the CPU and for GGUF files, else the config's dtype), bfloat16, float16
    /// (half), float32 (float).
    #[arg(long, default_value = "auto", value_parser = parse_dtype)]
    pub dtype: DTypeArg,
    /// Context length (prompt + output). Default: the model's. Accepts 1k (1000), 1K (1024), …
    #[arg(long, value_parser = parse_human_int)]
    pub max_model_len: Option<u64>,
    /// Random seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Names the API accepts for the model (the first is reported). Default: the model argument.
    #[arg(long, num_args = 1.., action = clap::ArgAction::Set)]
    pub served_model_name: Vec<String>,
    /// Sampling defaults: "auto" (the model's generation_config.json), "vllm" (none), or a folder.
    #[arg(long, default_value = "auto")]
    pub generation_config: String,
    /// Generation config keys over the model's, a JSON object: temperature, top_p, top_k, min_p,
    /// repetition_penalty, max_new_tokens (the most tokens any request generates, and the default max_tokens).
    #[arg(long, value_parser = parse_json_object)]
    pub override_generation_config: Option<JsonObject>,
    /// A chat template (a file path or the template itself) replacing the model's.
    #[arg(long, help_heading = "Frontend")]
    pub chat_template: Option<String>,
    /// Accepted for compatibility (rserve never runs code from model repositories).
    #[arg(long)]
    pub trust_remote_code: bool,
    /// Run every step op by op: never record decode steps (CUDA graphs on `--device cuda`, command lists on
    /// `--device level-zero`, command-buffers on `--device opencl` where the runtime has `cl_khr_command_buffer`; the
    /// CPU always runs op by op).
    #[arg(long)]
    pub enforce_eager: bool,
    /// Timing output: `graph` prints the wall and device-busy time per recorded decode step every 64 steps that
    /// follow one another (`--device cuda`); `ops` a per-op breakdown of eager steps on `--device cuda` (with `--enforce-eager` for
    /// decode steps).
    #[arg(long, value_parser = ["off", "graph", "ops"], default_value = "off")]
    pub profile: String,
    /// What the model is served for: generate, pooling (embeddings, classification, score, rerank), or auto (from
    /// the architecture: a `...ForCausalLM` generates, an encoder or a `...ForSequenceClassification` pools).
    #[arg(long, default_value = "auto")]
    pub runner: String,
    /// What a pooling runner makes of the model: embed, classify, none (as its architecture is), or auto.
    #[arg(long, default_value = "auto")]
    pub convert: String,
    /// vLLM's older spelling of --runner / --convert: generate, embed (embedding), classify, score, auto.
    #[arg(long)]
    pub task: Option<String>,
    /// The model's pooler overridden, a JSON object: pooling_type (CLS, MEAN, MAX, LAST), normalize,
    /// use_activation, dimensions, ...
    #[arg(long)]
    pub pooler_config: Option<String>,
}

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "CacheConfig")]
pub struct CacheArgs {
    /// Fraction of device memory for the model and the KV cache (0, 1].
    #[arg(long, default_value_t = 0.9)]
    pub gpu_memory_utilization: f64,
    /// Exact KV cache size in bytes (overrides --gpu-memory-utilization). Accepts 1g (10^9), 1G (2^30), …
    #[arg(long, value_parser = parse_human_int)]
    pub kv_cache_memory_bytes: Option<u64>,
    /// Tokens per KV cache block: 1, 8, 16, 32, 64 or 128.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Share KV blocks of equal prompt prefixes (default on).
    #[arg(long, overrides_with = "no_enable_prefix_caching")]
    pub enable_prefix_caching: bool,
    /// Turn prefix caching off (also --disable-prefix-caching).
    #[arg(long, overrides_with = "enable_prefix_caching", alias = "disable-prefix-caching")]
    pub no_enable_prefix_caching: bool,
    /// KV cache dtype: auto (the compute dtype), bfloat16, float16 or float32; one other than the compute dtype on
    /// the CPU only (keys and values stored in 16 bits, widened as attention reads them).
    #[arg(long, default_value = "auto")]
    pub kv_cache_dtype: String,
}

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "ParallelConfig")]
pub struct ParallelArgs {
    /// Tensor-parallel ranks (also -tp); above 1, one MPI rank each (`mpiexec -n tp*pp`, a build with MPI).
    #[arg(long, default_value_t = 1)]
    pub tensor_parallel_size: usize,
    /// Pipeline-parallel stages (also -pp); above 1, tp MPI ranks each.
    #[arg(long, default_value_t = 1)]
    pub pipeline_parallel_size: usize,
    /// Data-parallel replicas (also -dp): N engines behind one endpoint, each with its own device (cuda / level-zero:
    /// devices 0..N-1; opencl: the platform's GPUs; cpu: an equal share of the cores), scheduler and KV cache;
    /// requests go to the replica where they start soonest, preferring one that holds their prefix. With -tp / -pp,
    /// each replica is tp*pp MPI ranks (`mpiexec -n dp*tp*pp`).
    #[arg(long, default_value_t = 1)]
    pub data_parallel_size: usize,
    /// How workers are run: mp or uni (single process). ray is not supported.
    #[arg(long)]
    pub distributed_executor_backend: Option<String>,
    /// Expert parallelism for mixture-of-experts models (also -ep): under -tp each rank holds whole experts, a
    /// 1/tp share of them, instead of a 1/tp slice of every expert; attention stays tensor-parallel.
    #[arg(long)]
    pub enable_expert_parallel: bool,
}

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "SchedulerConfig")]
pub struct SchedulerArgs {
    /// Most sequences running at once.
    #[arg(long, default_value_t = 256)]
    pub max_num_seqs: usize,
    /// Most tokens per engine step (prefill chunks + decodes). Default: chosen by the engine.
    #[arg(long, value_parser = parse_human_int)]
    pub max_num_batched_tokens: Option<u64>,
    /// Most requests computing prompt tokens in one step (vLLM's chunked-prefill limit); running decodes are never
    /// limited. Default: no limit.
    #[arg(long)]
    pub max_num_partial_prefills: Option<usize>,
    /// Most of those with a prompt longer than --long-prefill-token-threshold; shorter prompts may go first. Default:
    /// 1 with --max-num-partial-prefills, else no limit.
    #[arg(long)]
    pub max_long_partial_prefills: Option<usize>,
    /// Prompts longer than this are long, and no prefill chunk is longer. Default (or 0): 4% of --max-model-len
    /// when --max-num-partial-prefills is above 1, else none.
    #[arg(long, value_parser = parse_human_int)]
    pub long_prefill_token_threshold: Option<u64>,
    /// Most requests waiting for a slot; beyond it new requests get 503 with Retry-After.
    #[arg(long, default_value_t = 1024)]
    pub max_num_waiting: usize,
    /// Most requests in flight (waiting or running); beyond it new requests get 503. Default: no limit.
    #[arg(long)]
    pub max_num_queued_reqs: Option<usize>,
    /// Seconds a request may run, from its arrival; then it ends with finish reason `abort` and the text it has,
    /// its KV cache blocks freed. Default: no limit.
    #[arg(long, value_name = "SECONDS")]
    pub max_request_time: Option<f64>,
    /// Schedule each step while the one before it runs on the device, feeding its sampled ids to the next step on
    /// the device (the default; steps whose sampling needs the output so far, such as grammar masks or penalties,
    /// still wait for the step before).
    #[arg(long, overrides_with = "no_async_scheduling")]
    pub async_scheduling: bool,
    /// Schedule each step after the one before it ended.
    #[arg(long, overrides_with = "async_scheduling")]
    pub no_async_scheduling: bool,
}

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "DeviceConfig")]
pub struct DeviceArgs {
    /// Device: auto, cpu, opencl, cuda[:N] or level-zero[:N].
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// With --device opencl: the OpenCL platform, as an index or part of its name (default: the first with a GPU).
    #[arg(long)]
    pub opencl_platform: Option<String>,
    /// With --device opencl: the device index within that platform (default: its first GPU, else 0).
    #[arg(long)]
    pub opencl_device: Option<usize>,
    /// On the CPU (the default): keep GGUF Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q4_K / Q5_K / Q6_K weights in their
    /// blocks and multiply them with integer dot products against activations quantized to 8 bits per block, in two
    /// terms for a Q8_0 file (llama.cpp's scheme: fast; 4-bit log-probs move by up to ~0.4 from the dequantized
    /// reference, Q8_0's by ~0.002).
    #[arg(long, overrides_with = "cpu_dequantize_weights")]
    pub cpu_packed_weights: bool,
    /// On the CPU: dequantize GGUF weights to the compute dtype at load and multiply in floating point instead of
    /// keeping them packed (the exact reference that matches transformers' float32 outputs; slower, more memory).
    #[arg(long, overrides_with = "cpu_packed_weights")]
    pub cpu_dequantize_weights: bool,
    /// On the CPU: threads of the compute pool (matmuls, attention, elementwise ops). Default: one per physical core.
    #[arg(long, value_name = "N")]
    pub cpu_threads: Option<usize>,
    /// Weights: auto, safetensors or gguf (the checkpoint's files) or dummy (random weights of the config's shapes,
    /// for benchmarks).
    #[arg(long, default_value = "auto")]
    pub load_format: String,
    /// The Hugging Face cache folder models and tokenizers are looked up in and downloaded to (default: HF_HUB_CACHE,
    /// else HF_HOME/hub).
    #[arg(long)]
    pub download_dir: Option<PathBuf>,
}

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Frontend")]
pub struct FrontendArgs {
    /// Host name or address to listen on.
    #[arg(long, default_value = "0.0.0.0")]
    pub host: String,
    /// Port to listen on (0: any free port; the log line names it).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on /v1 routes (one of the keys given).
    #[arg(long, num_args = 1.., action = clap::ArgAction::Set, env = "VLLM_API_KEY", hide_env_values = true)]
    pub api_key: Vec<String>,
    /// A file of API keys, one per line (blank lines and # comments skipped), accepted like --api-key's; keeps keys
    /// out of the process list and job scripts.
    #[arg(long, value_name = "PATH")]
    pub api_key_file: Option<PathBuf>,
    /// Seconds running requests may take to finish after SIGINT/SIGTERM.
    #[arg(long, default_value_t = 30.0)]
    pub shutdown_timeout: f64,
    /// Log level of the HTTP access log: critical, error, warning, info, debug, trace.
    #[arg(long, default_value = "info", value_parser = ["critical", "error", "warning", "info", "debug", "trace"])]
    pub uvicorn_log_level: String,
    /// Do not log one line per HTTP request.
    #[arg(long)]
    pub disable_uvicorn_access_log: bool,
    /// Answer every response with an `X-Request-Id` header: the request's own, else a random one.
    #[arg(long)]
    pub enable_request_id_headers: bool,
    /// Paths the HTTP access log leaves out, comma-separated (e.g. "/health,/metrics,/ping").
    #[arg(long)]
    pub disable_access_log_for_endpoints: Option<String>,
    /// Log one line per accepted generation request.
    #[arg(long)]
    pub enable_log_requests: bool,
    /// Do not log the periodic throughput line.
    #[arg(long)]
    pub disable_log_stats: bool,
    /// Let the model decide when to call tools (`tool_choice: "auto"`, the default with tools); needs
    /// --tool-call-parser.
    #[arg(long)]
    pub enable_auto_tool_choice: bool,
    /// Chat template variables every chat request gets, a JSON object (e.g. '{"enable_thinking": false}'); a
    /// request's own `chat_template_kwargs` win over them.
    #[arg(long, value_parser = parse_json_object)]
    pub default_chat_template_kwargs: Option<JsonObject>,
    /// How the model writes tool calls: llama3_json (Llama 3.1-3.3), hermes (Qwen2.5, Qwen3, Hermes), mistral.
    #[arg(long, value_enum)]
    pub tool_call_parser: Option<ToolParser>,
    /// How the model's reasoning is split from its answer (the `reasoning` field of chat answers): deepseek_r1
    /// (DeepSeek-R1 and its distills, QwQ), deepseek_v3 (DeepSeek V3.1+ with `thinking`), qwen3, gpt_oss (harmony
    /// channels and tool calls), mistral (`[THINK]`).
    #[arg(long, value_enum, help_heading = "StructuredOutputsConfig")]
    pub reasoning_parser: Option<ReasoningParser>,
    /// Origins browsers may call the API from, a JSON list (e.g. '["https://app.example"]', '["*"]' for any).
    /// Cross-origin browser access is disabled by default.
    #[arg(long, default_value = "[]", value_parser = parse_json_list)]
    pub allowed_origins: JsonList,
    /// Methods allowed in cross-origin requests, a JSON list ("*": all).
    #[arg(long, default_value = r#"["*"]"#, value_parser = parse_json_list)]
    pub allowed_methods: JsonList,
    /// Headers allowed in cross-origin requests, a JSON list ("*": whatever the browser asks for).
    #[arg(long, default_value = r#"["*"]"#, value_parser = parse_json_list)]
    pub allowed_headers: JsonList,
    /// Allow credentials (cookies, Authorization) in cross-origin requests.
    #[arg(long)]
    pub allow_credentials: bool,
    /// Serve HTTPS: the private key (PEM); needs --ssl-certfile.
    #[arg(long)]
    pub ssl_keyfile: Option<PathBuf>,
    /// Serve HTTPS: the certificate chain (PEM); needs --ssl-keyfile.
    #[arg(long)]
    pub ssl_certfile: Option<PathBuf>,
    /// Reload the key and certificate when their files change (checked every few seconds), without a restart.
    #[arg(long)]
    pub enable_ssl_refresh: bool,
    /// CA certificates (PEM) that client certificates are checked against.
    #[arg(long)]
    pub ssl_ca_certs: Option<PathBuf>,
    /// Client certificates, as Python's ssl module numbers it: 0 not asked for, 1 optional, 2 required (these two
    /// need --ssl-ca-certs).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=2))]
    pub ssl_cert_reqs: u8,
    /// The path prefix a proxy strips before forwarding (FastAPI's root_path): requests are served with and without
    /// it.
    #[arg(long)]
    pub root_path: Option<String>,
    /// Count the generation requests in progress for `GET /load`.
    #[arg(long)]
    pub enable_server_load_tracking: bool,
    /// Log level (default: VLLM_LOGGING_LEVEL, else INFO; RUST_LOG overrides both).
    #[arg(long, ignore_case = true, value_parser = ["CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG", "NOTSET"])]
    pub log_level: Option<String>,
    #[command(flatten)]
    pub limits: limits::LimitArgs,
}

impl FrontendArgs {
    /// `--disable-access-log-for-endpoints`, split at commas (as vLLM does; a query string is not part of a path).
    pub fn access_log_skip(&self) -> Vec<String> {
        let list = self.disable_access_log_for_endpoints.as_deref().unwrap_or("");
        list.split(',').map(str::trim).filter(|p| !p.is_empty()).map(str::to_owned).collect()
    }
}

/// A list flag given as JSON, as vLLM takes `--allowed-origins` and its siblings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonList(pub Vec<String>);

fn parse_json_list(s: &str) -> Result<JsonList, String> {
    serde_json::from_str::<Vec<String>>(s)
        .map(JsonList)
        .map_err(|e| format!("expected a JSON list of strings such as '[\"*\"]' ({e})"))
}

/// A flag given as a JSON object, as vLLM takes `--default-chat-template-kwargs`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JsonObject(pub serde_json::Map<String, serde_json::Value>);

fn parse_json_object(s: &str) -> Result<JsonObject, String> {
    serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(s)
        .map(JsonObject)
        .map_err(|e| format!("expected a JSON object such as '{{\"enable_thinking\": false}}' ({e})"))
}

/// vLLM's `VLLM_SERVER_DEV_MODE` (an integer, 0 by default): nonzero serves the development routes
/// (`/server_info`, `/reset_prefix_cache`) as vLLM does.
pub const SERVER_DEV_MODE_ENV: &str = "VLLM_SERVER_DEV_MODE";

/// Reads `VLLM_SERVER_DEV_MODE` as vLLM does (`bool(int(value))`).
pub fn server_dev_mode() -> Result<bool, CliError> {
    match std::env::var(SERVER_DEV_MODE_ENV) {
        Err(_) => Ok(false),
        Ok(v) => v.trim().parse::<i64>().map(|n| n != 0).map_err(|_| CliError::DevMode(v)),
    }
}

#[derive(Debug, Clone, Args)]
pub struct GenerateArgs {
    /// The model: a Hugging Face repo id, a local model folder, or a .gguf file.
    #[arg(value_name = "MODEL_TAG")]
    pub model_tag: Option<String>,
    /// The prompt.
    #[arg(long, short = 'p', help_heading = "SamplingParams")]
    pub prompt: String,
    /// Most tokens to generate (default 128).
    #[arg(long, default_value_t = 128, help_heading = "SamplingParams")]
    pub max_tokens: usize,
    /// Wrap the prompt as a user message with the chat template.
    #[arg(long, help_heading = "SamplingParams")]
    pub chat: bool,
    /// Sampling temperature (default: the model's generation config, else 1.0; 0 = greedy).
    #[arg(long, help_heading = "SamplingParams")]
    pub temperature: Option<f64>,
    #[arg(long, help_heading = "SamplingParams")]
    pub top_p: Option<f64>,
    #[arg(long, help_heading = "SamplingParams")]
    pub top_k: Option<i64>,
    #[arg(long, help_heading = "SamplingParams")]
    pub min_p: Option<f64>,
    #[arg(long, help_heading = "SamplingParams")]
    pub repetition_penalty: Option<f64>,
    /// Keep generating after the end-of-sequence token.
    #[arg(long, help_heading = "SamplingParams")]
    pub ignore_eos: bool,
    #[command(flatten)]
    pub engine: EngineArgs,
}

#[derive(Debug, Clone, Args)]
pub struct ConvertArgs {
    /// The GGUF file.
    pub gguf: PathBuf,
    /// The output folder (created).
    pub out_dir: PathBuf,
    /// Dtype of the written tensors: float32, bfloat16 or float16.
    #[arg(long, default_value = "float32")]
    pub dtype: String,
}

/// A flag value that cannot be honoured.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CliError {
    #[error("no model given: pass it as `rserve MODEL` (or --model MODEL)")]
    NoModel,
    #[error("--{0} must be at least 1")]
    ZeroParallel(&'static str),
    #[error(
        "--distributed-executor-backend {0} is not supported: rserve runs its ranks on MPI, the launcher PBS jobs \
         already have; use --distributed-executor-backend mpi (the default) and start: {1}"
    )]
    ExecutorBackend(String, String),
    #[error(
        "--kv-cache-dtype {0} is not supported; use auto (the model's compute dtype), bfloat16, float16 or float32"
    )]
    KvCacheDtype(String),
    #[error("--device {0} is not supported yet; use auto, cpu, opencl, cuda[:N] or level-zero[:N]")]
    Device(String),
    #[error("--gpu-memory-utilization must be in (0, 1], got {0}")]
    MemoryUtilization(f64),
    #[error("--block-size must be one of 1, 8, 16, 32, 64, 128, got {0}")]
    BlockSize(usize),
    #[error("--max-num-seqs must be at least 1")]
    MaxNumSeqs,
    #[error("--{0} must be at least 1")]
    ZeroLength(&'static str),
    #[error("--{0} {1} is too large for this machine")]
    TooLarge(&'static str, u64),
    #[error("--served-model-name must not be empty")]
    EmptyServedName,
    #[error("--shutdown-timeout must be a non-negative number of seconds, got {0}")]
    ShutdownTimeout(f64),
    #[error("VLLM_SERVER_DEV_MODE must be an integer (0 or 1), got {0:?}")]
    DevMode(String),
    #[error("--ssl-keyfile and --ssl-certfile must be provided together")]
    SslPair,
    #[error("--ssl-ca-certs, --ssl-cert-reqs and the other TLS flags need --ssl-keyfile and --ssl-certfile")]
    SslWithoutHttps,
    #[error("--ssl-cert-reqs {0} asks for client certificates: give the CA to check them with --ssl-ca-certs")]
    SslCertReqsWithoutCa(u8),
    #[error("--root-path must start with '/' and not end with it, e.g. /api/v1, got {0:?}")]
    RootPath(String),
    #[error("--dtype {0} is not supported for convert; use float32, bfloat16 or float16")]
    ConvertDtype(String),
    #[error("{flag} is not supported by rserve: {why}")]
    Refused { flag: String, why: &'static str },
    #[error("{flag} {value} is not supported by rserve: {why}")]
    RefusedValue { flag: String, value: String, why: &'static str },
    #[error("--config: {0}")]
    ConfigFile(String),
    #[error("--load-format {0} is not supported; use auto, safetensors, gguf or dummy")]
    LoadFormat(String),
    #[error(
        "--quantization {value} does not match the checkpoint: rserve serves unquantized weights (a .gguf model is \
         dequantized at load, so only `gguf` for a .gguf model, or `none`)"
    )]
    Quantization { value: String },
    #[error("--max-logprobs must be -1 (the vocabulary) or at least 0, got {0}")]
    MaxLogprobs(i64),
    #[error("--{0} must be a positive number of seconds, got {1}")]
    Seconds(&'static str, f64),
    #[error("{0} must be a number, got {1:?}")]
    Env(&'static str, String),
    #[error("--api-key-file: {0}")]
    ApiKeyFile(String),
    #[error("--runner {0} is not supported; use auto, generate or pooling")]
    Runner(String),
    #[error("--convert {0} is not supported; use auto, none, embed or classify")]
    Convert(String),
    #[error("--task {0} is not supported; use generate, embed, classify or score (or --runner / --convert)")]
    Task(String),
    #[error("{0}")]
    PoolerConfig(String),
}

fn parse_dtype(s: &str) -> Result<DTypeArg, String> {
    DTypeArg::parse(s).ok_or_else(|| format!("unknown dtype '{s}' (auto, bfloat16, float16, half, float32, float)"))
}

/// Rewrites argv so that `rserve MODEL …` means `rserve serve MODEL …`, and vLLM's `-tp N` / `-pp N` / `-dp N` work
/// (in `rserve plan` too).
pub fn normalize_args(args: Vec<OsString>) -> Vec<OsString> {
    let mut out: Vec<OsString> = Vec::with_capacity(args.len() + 1);
    for (i, a) in args.into_iter().enumerate() {
        let s = a.to_string_lossy();
        let replaced = match s.as_ref() {
            "-tp" => Some("--tensor-parallel-size".to_owned()),
            "-pp" => Some("--pipeline-parallel-size".to_owned()),
            "-dp" => Some("--data-parallel-size".to_owned()),
            x if x.starts_with("-tp=") => Some(format!("--tensor-parallel-size={}", &x[4..])),
            x if x.starts_with("-pp=") => Some(format!("--pipeline-parallel-size={}", &x[4..])),
            x if x.starts_with("-dp=") => Some(format!("--data-parallel-size={}", &x[4..])),
            _ => None,
        };
        if i == 1 {
            let is_top_flag = matches!(s.as_ref(), "-h" | "--help" | "-V" | "--version");
            if !is_top_flag && !SUBCOMMANDS.contains(&s.as_ref()) {
                out.push(OsString::from("serve"));
            }
        }
        out.push(replaced.map(OsString::from).unwrap_or(a));
    }
    out
}

fn to_usize(flag: &'static str, v: u64) -> Result<usize, CliError> {
    usize::try_from(v).map_err(|_| CliError::TooLarge(flag, v))
}

impl EngineArgs {
    /// Checks the flags and builds the engine configuration for `model`.
    pub fn engine_config(&self, model: &str, max_num_waiting: usize) -> Result<EngineConfig, CliError> {
        let p = &self.parallel;
        if p.tensor_parallel_size == 0 {
            return Err(CliError::ZeroParallel("tensor-parallel-size"));
        }
        if p.pipeline_parallel_size == 0 {
            return Err(CliError::ZeroParallel("pipeline-parallel-size"));
        }
        if p.data_parallel_size == 0 {
            return Err(CliError::ZeroParallel("data-parallel-size"));
        }
        if let Some(b) = &p.distributed_executor_backend {
            if !matches!(b.as_str(), "mp" | "uni" | "mpi") {
                let n = p.tensor_parallel_size * p.pipeline_parallel_size;
                let args: Vec<String> = std::env::args().collect();
                return Err(CliError::ExecutorBackend(b.clone(), format!("mpiexec -n {n} {}", args.join(" "))));
            }
        }
        let c = &self.cache;
        if !matches!(
            c.kv_cache_dtype.as_str(),
            "auto" | "bfloat16" | "bf16" | "float16" | "half" | "fp16" | "float32" | "float" | "fp32"
        ) {
            return Err(CliError::KvCacheDtype(c.kv_cache_dtype.clone()));
        }
        if self.device.cpu_threads == Some(0) {
            return Err(CliError::ZeroParallel("cpu-threads"));
        }
        if !matches!(self.device.device.as_str(), "auto" | "cpu" | "opencl" | "cuda" | "level-zero")
            && !self.device.device.starts_with("cuda:")
            && !self.device.device.starts_with("level-zero:")
        {
            return Err(CliError::Device(self.device.device.clone()));
        }
        if !(c.gpu_memory_utilization > 0.0 && c.gpu_memory_utilization <= 1.0) {
            return Err(CliError::MemoryUtilization(c.gpu_memory_utilization));
        }
        if ![1, 8, 16, 32, 64, 128].contains(&c.block_size) {
            return Err(CliError::BlockSize(c.block_size));
        }
        let s = &self.scheduler;
        if s.max_num_seqs == 0 {
            return Err(CliError::MaxNumSeqs);
        }
        let m = &self.model;
        let max_model_len = match m.max_model_len {
            Some(0) => return Err(CliError::ZeroLength("max-model-len")),
            Some(v) => Some(to_usize("max-model-len", v)?),
            None => None,
        };
        let max_num_batched_tokens = match s.max_num_batched_tokens {
            Some(0) => return Err(CliError::ZeroLength("max-num-batched-tokens")),
            Some(v) => Some(to_usize("max-num-batched-tokens", v)?),
            None => None,
        };
        let mut cfg = EngineConfig::new(model);
        cfg.revision = m.revision.clone();
        cfg.tokenizer = m.tokenizer.clone();
        cfg.tokenizer_revision = m.tokenizer_revision.clone();
        cfg.dtype = m.dtype;
        cfg.max_model_len = max_model_len;
        cfg.gpu_memory_utilization = c.gpu_memory_utilization;
        cfg.kv_cache_memory_bytes = c.kv_cache_memory_bytes;
        cfg.kv_cache_dtype = c.kv_cache_dtype.clone();
        cfg.max_num_seqs = s.max_num_seqs;
        cfg.max_num_batched_tokens = max_num_batched_tokens;
        cfg.max_num_partial_prefills = s.max_num_partial_prefills;
        cfg.max_long_partial_prefills = s.max_long_partial_prefills;
        cfg.long_prefill_token_threshold =
            s.long_prefill_token_threshold.map(|v| to_usize("long-prefill-token-threshold", v)).transpose()?;
        cfg.block_size = c.block_size;
        cfg.enable_prefix_caching = !c.no_enable_prefix_caching;
        cfg.chat_template = m.chat_template.clone();
        cfg.generation_config = m.generation_config.clone();
        cfg.seed = m.seed;
        cfg.device = self.device.device.clone();
        cfg.opencl_platform = self.device.opencl_platform.clone();
        cfg.opencl_device = self.device.opencl_device;
        // Packed unless the reference is asked for (the later of the two flags wins: clap's `overrides_with`).
        cfg.cpu_packed_weights = !self.device.cpu_dequantize_weights;
        cfg.cpu_threads = self.device.cpu_threads;
        cfg.load_format = self.load_format(model)?;
        cfg.download_dir = self.device.download_dir.clone();
        cfg.hf_token = m.hf_token.clone();
        cfg.max_logprobs = match m.max_logprobs {
            -1 => None,
            n if n >= 0 => Some(to_usize("max-logprobs", n as u64)?),
            n => return Err(CliError::MaxLogprobs(n)),
        };
        cfg.enforce_eager = m.enforce_eager;
        cfg.async_scheduling = !s.no_async_scheduling;
        cfg.profile = rserve_engine::runner::ProfileMode::parse(&m.profile).unwrap_or_default();
        cfg.max_waiting = max_num_waiting;
        cfg.tensor_parallel_size = p.tensor_parallel_size;
        cfg.pipeline_parallel_size = p.pipeline_parallel_size;
        cfg.data_parallel_size = p.data_parallel_size;
        cfg.enable_expert_parallel = p.enable_expert_parallel;
        cfg.testing_fail_after_requests = self.testing_fail_engine_after_requests;
        cfg.testing_panic_in_step_after = self.testing_panic_in_step_after;
        cfg.testing_error_in_step_after = self.testing_error_in_step_after;
        cfg.max_request_time = limits::seconds("max-request-time", s.max_request_time)?;
        cfg.override_generation_config = m.override_generation_config.clone().unwrap_or_default().0;
        (cfg.runner, cfg.convert) = pooling::runner_and_convert(&m.runner, &m.convert, m.task.as_deref())?;
        cfg.pooler_config = pooling::pooler_config(m.pooler_config.as_deref())?;
        Ok(cfg)
    }

    /// `--load-format`, checked: the checkpoint's own formats all mean "auto" (rserve reads safetensors or GGUF as
    /// the model is), `dummy` random weights; anything else is refused.
    fn load_format(&self, model: &str) -> Result<String, CliError> {
        self.check_quantization(model)?;
        match self.device.load_format.as_str() {
            "auto" | "safetensors" | "gguf" => Ok("auto".into()),
            "dummy" => Ok("dummy".into()),
            other => Err(CliError::LoadFormat(other.into())),
        }
    }

    /// `--quantization` names what the checkpoint is: nothing, or GGUF for a .gguf file.
    fn check_quantization(&self, model: &str) -> Result<(), CliError> {
        match self.model.quantization.as_deref() {
            None | Some("None" | "none") => Ok(()),
            Some("gguf") if model.to_ascii_lowercase().ends_with(".gguf") => Ok(()),
            Some(other) => Err(CliError::Quantization { value: other.into() }),
        }
    }

    /// The model from the positional argument or `--model`.
    pub fn resolve_model(&self, positional: Option<&str>) -> Result<String, CliError> {
        positional.or(self.model.model.as_deref()).map(str::to_owned).ok_or(CliError::NoModel)
    }
}

impl ServeArgs {
    /// Served names: `--served-model-name`, else the model argument.
    pub fn served_model_names(&self, model: &str) -> Result<Vec<String>, CliError> {
        let names = &self.engine.model.served_model_name;
        if names.iter().any(|n| n.is_empty()) {
            return Err(CliError::EmptyServedName);
        }
        Ok(if names.is_empty() { vec![model.to_owned()] } else { names.clone() })
    }

    /// `--root-path`, checked: `None` when empty or "/".
    pub fn root_path(&self) -> Result<Option<String>, CliError> {
        match self.frontend.root_path.as_deref() {
            None | Some("") | Some("/") => Ok(None),
            Some(p) if p.starts_with('/') && !p.ends_with('/') => Ok(Some(p.to_owned())),
            Some(p) => Err(CliError::RootPath(p.to_owned())),
        }
    }

    pub fn shutdown_timeout(&self) -> Result<std::time::Duration, CliError> {
        let t = self.frontend.shutdown_timeout;
        if !(t.is_finite() && t >= 0.0) {
            return Err(CliError::ShutdownTimeout(t));
        }
        Ok(std::time::Duration::from_secs_f64(t))
    }
}

impl ConvertArgs {
    pub fn candle_dtype(&self) -> Result<candle_core::DType, CliError> {
        match self.dtype.as_str() {
            "float32" | "float" | "fp32" | "f32" => Ok(candle_core::DType::F32),
            "bfloat16" | "bf16" => Ok(candle_core::DType::BF16),
            "float16" | "half" | "fp16" | "f16" => Ok(candle_core::DType::F16),
            other => Err(CliError::ConvertDtype(other.to_owned())),
        }
    }
}

/// Parses the process arguments: `normalize_args`, then vLLM's flags applied (`compat`), then clap. A refused flag
/// or a bad `--config` file is an error; clap's own errors (an unknown flag, a bad value) exit as clap does.
pub fn parse() -> Result<Cli, CliError> {
    parse_from(std::env::args_os().collect())
}

/// `parse` on a given command line.
pub fn parse_from(args: Vec<OsString>) -> Result<Cli, CliError> {
    let mut args = normalize_args(args);
    // vLLM's `--help=all|GROUP|FLAG|KEYWORD`: printed, then exit, as `--help` does.
    if let Some(topic) = help_topic::requested(&args) {
        let mut cli = Cli::command();
        cli.build();
        let sub = args[1].to_string_lossy().into_owned();
        let cmd = cli.find_subcommand(&sub).cloned().unwrap_or_default();
        match help_topic::render(&cmd, &topic) {
            Ok(text) => {
                print!("{text}");
                std::process::exit(0);
            }
            Err(e) => {
                eprintln!("Error: {e}");
                std::process::exit(1);
            }
        }
    }
    // `run-batch` takes serve's engine flags, so vLLM's spellings and the flag table apply to it as to `serve`.
    let run_batch = args.get(1).is_some_and(|a| a == "run-batch");
    if run_batch {
        args[1] = OsString::from("serve");
    }
    let mut prepared = compat::prepare(args)?;
    if run_batch {
        prepared.args[1] = OsString::from("run-batch");
    }
    let mut cli = Cli::parse_from(prepared.args);
    match &mut cli.command {
        Command::Serve(s) => s.notices = prepared.notices,
        Command::RunBatch(r) => r.notices = prepared.notices,
        _ => {}
    }
    Ok(cli)
}

/// The long names and aliases of `serve`'s clap arguments, with their `--`.
pub fn serve_clap_names() -> &'static [String] {
    static NAMES: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    NAMES.get_or_init(|| {
        let cmd = Cli::command();
        let serve = cmd.find_subcommand("serve").expect("serve is a subcommand");
        serve
            .get_arguments()
            .flat_map(|a| a.get_long().into_iter().chain(a.get_all_aliases().unwrap_or_default()))
            .map(|l| format!("--{l}"))
            .collect()
    })
}

/// Whether clap knows this spelling (`--no-enable-prefix-caching`) as a `serve` flag.
pub fn clap_knows(name: &str) -> bool {
    serve_clap_names().iter().any(|n| n == name)
}

#[cfg(test)]
mod tests;
