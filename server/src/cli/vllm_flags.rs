//! Every `vllm serve` flag, classified: what rserve does with it. One row per vLLM argument (all its spellings: the
//! long name, `--no-x` / `--disable-x` negations, short aliases such as `-tp`), checked against the fixture generated
//! from vLLM's own parser (`tests/fixtures/vllm/serve_flags.json`, `scripts/reference/vllm_serve_flags.py`) by
//! `vllm_flags_tests.rs`: a flag a new vLLM adds fails that test until it is classified here.
//!
//! A row is `Implemented` (a clap argument of `serve` acts on it), `Ignored` (accepted, one warning at start-up with
//! the reason), `Refused` (start-up stops with the reason, exit code 1) or `Only` (the values listed are what rserve
//! does anyway and pass silently; any other value is refused with the reason). The negation of a refused switch
//! (`--disable-lora`) asks for what rserve does anyway: it is accepted with a warning. `compat.rs` applies the table
//! to the command line before clap sees it.

/// How a flag takes values (from vLLM's `nargs`); it tells `compat` what to drop with an ignored flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arity {
    /// A switch (`nargs=0`).
    Switch,
    /// Exactly one value.
    One,
    /// One value, optional (`nargs='?'`).
    Optional,
    /// One or more values (`nargs='+'`, or an `append` flag given once).
    Many,
}

/// What rserve does with a flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// A clap argument of `serve` implements it.
    Implemented,
    /// Accepted; one warning at start-up gives the reason it changes nothing.
    Ignored(&'static str),
    /// Start-up stops with this reason.
    Refused(&'static str),
    /// These values are rserve's behaviour anyway (accepted silently); others are refused with the reason.
    Only(&'static [&'static str], &'static str),
}

/// Where a flag comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// `vllm serve` of the fixture's vLLM version.
    Vllm,
    /// Removed from vLLM before the fixture's version, still common in job scripts.
    VllmLegacy,
    /// rserve's own (no vLLM counterpart).
    Rserve,
}

/// One row: every spelling of one argument.
#[derive(Debug, Clone, Copy)]
pub struct VllmFlag {
    /// The spellings; the first is the canonical long name (the one clap knows for implemented flags).
    pub names: &'static [&'static str],
    pub arity: Arity,
    pub support: Support,
    pub origin: Origin,
}

impl VllmFlag {
    /// True for a spelling that turns a switch off (`--no-x`, `--disable-x`): any long name but the first.
    pub fn is_negation(&self, name: &str) -> bool {
        self.arity == Arity::Switch && name.starts_with("--") && name != self.names[0]
    }
}

/// The row of a spelling (`--swap-space`, `-tp`, `--no-enable-prefix-caching`), if any.
pub fn lookup(name: &str) -> Option<&'static VllmFlag> {
    FLAGS.iter().find(|f| f.names.contains(&name))
}

use Arity::{Many as N, One as V, Optional as O, Switch as S};
use Support::{Ignored, Implemented, Only, Refused};

const fn v(names: &'static [&'static str], arity: Arity, support: Support) -> VllmFlag {
    VllmFlag { names, arity, support, origin: Origin::Vllm }
}
const fn legacy(names: &'static [&'static str], arity: Arity, support: Support) -> VllmFlag {
    VllmFlag { names, arity, support, origin: Origin::VllmLegacy }
}
const fn rserve(names: &'static [&'static str], arity: Arity) -> VllmFlag {
    VllmFlag { names, arity, support: Implemented, origin: Origin::Rserve }
}

// Why a flag changes nothing, or why it is refused (one line each; the log and README print them).
const CHUNKED_PREFILL: &str = "chunked prefill is always on in rserve (vLLM v1's scheduler)";
const CONTENT_FORMAT: &str = "text message content is passed to chat templates as a string";
const CONTEXT_PARALLEL: &str = "context parallelism is not implemented; use -tp / -pp";
const CUDA_GRAPHS: &str =
    "decode CUDA graphs are captured per batch bucket up to --max-num-seqs (--enforce-eager: none)";
const DATA_PARALLEL: &str = "-dp runs every replica behind one endpoint with its own router (in this process, or \
    under mpiexec as dp x tp x pp ranks driven by rank 0); external load balancers and vLLM's rank / address options \
    do not apply";
const DEVICE_IDS: &str = "choose devices with --device cuda:N / level-zero:N or CUDA_VISIBLE_DEVICES";
const DOWNLOAD_FILES: &str = "rserve downloads only config, tokenizer, generation config and safetensors weights";
const ENVIRON: &str = "rserve does not validate VLLM_* variables it does not read";
const FINGERPRINT: &str = "responses carry no system_fingerprint";
const HEADLESS: &str = "no headless engine mode: under mpiexec, ranks other than 0 are the headless workers";
const HF_CONFIG: &str = "rserve reads the model's own config.json, unmodified";
const KERNELS: &str = "rserve runs its own kernels; vLLM's attention / kernel backend choices do not apply";
const KV_BLOCKS: &str = "size the KV cache with --kv-cache-memory-bytes or --gpu-memory-utilization";
const KV_CACHE: &str = "rserve's KV cache has one layout (paged, one dtype); the option does not apply";
const LOADER: &str = "rserve memory-maps safetensors and shows no tqdm; loader options do not apply";
const LOGGING_CONFIG: &str = "logging is set by VLLM_LOGGING_LEVEL, --log-level or RUST_LOG";
const LOG_LEN: &str = "request log lines do not include the prompt";
const LOG_OUTPUTS: &str = "request logging (--enable-log-requests) does not log outputs";
const LORA: &str = "LoRA adapters are not supported yet";
const MEMORY_POOL: &str = "rserve's device memory pool is its own (no cumem allocator)";
const METRICS_KNOB: &str = "rserve's /metrics and tracing have no such option";
const MMAP: &str = "safetensors files are memory-mapped; there is no load strategy to choose";
const MODEL_IMPL: &str = "rserve has one model implementation (its own)";
const MPI_LAUNCH: &str = "multi-node runs are launched with mpiexec (MPI ranks), not vLLM's master address";
const MPI_NOT_NCCL: &str = "ranks communicate over MPI, not NCCL / torch.distributed";
const MULTIMODAL: &str = "rserve serves text-only models; multimodal options do not apply";
const NEEDS_TOKENIZER: &str = "rserve needs the tokenizer (token-id-only serving is not implemented)";
const NOT_YET: &str = "not implemented yet";
const NO_ANTHROPIC: &str = "no Anthropic Messages API";
const NO_COHERE: &str = "no Cohere API";
const NO_DIFFUSION: &str = "no diffusion models";
const NO_DOCS: &str = "rserve serves no /docs, /redoc or /openapi.json pages";
const NO_GRPC: &str = "no gRPC server; rserve serves the OpenAI-compatible HTTP API";
const NO_KV_EVENTS: &str = "no KV cache events are published";
const NO_KV_TRANSFER: &str = "disaggregated prefill / KV and weight transfer are not implemented";
const NO_MAMBA: &str = "no Mamba / hybrid models in rserve";
const NO_MIDDLEWARE: &str = "no Python ASGI middleware can be loaded";
const NO_EP: &str = "expert parallelism is static: -ep gives each TP rank whole experts, a fixed 1/tp share \
    (no load balancing, elastic resizing, all-to-all kernels or weight filter options)";
const NO_ROUTED_OUT: &str = "the experts a token was routed to are not returned";
const NO_OFFLOAD: &str = "weights and KV cache stay on the device; no CPU offload";
const NO_OTLP: &str = "no OpenTelemetry trace export";
const NO_PLUGINS: &str = "rserve loads no Python plugins, classes or extra configuration";
const NO_REASONING: &str = "no reasoning-effort handling";
const NO_REASONING_PARSER: &str = "only the built-in reasoning parsers are available (--reasoning-parser)";
const NO_REMOTE_CODE: &str = "rserve never runs code from model repositories";
const NO_SLEEP: &str = "no sleep mode";
const NO_SLIDING_WINDOW: &str =
    "sliding-window layers always attend through their window (their cache keeps only the window)";
const NO_SPECULATIVE: &str = "no speculative decoding: every token comes from the model itself (same output)";
const NO_STACK: &str = "errors carry no Python stack trace";
const NO_TOKENIZER_INFO: &str = "no /tokenizer_info endpoint";
const NO_TOOL_SERVER: &str = "no built-in tool servers";
const NO_TORCH_COMPILE: &str = "no torch.compile: rserve's kernels are compiled ahead of time";
const NO_UDS: &str = "no Unix-socket listener yet; use --host and --port";
const NO_USAGE_DETAILS: &str = "usage always carries prompt_tokens_details; no per-request timing fields";
const NO_WATERMARK: &str = "no output watermarking";
const NUMA: &str = "bind CPUs / NUMA nodes with the launcher (numactl, mpiexec --bind-to)";
const ONE_SERVER: &str = "one HTTP server process (async, all cores) serves every request";
const LATE_INTERACTION: &str =
    "rserve serves no late-interaction (ColBERT) models, so there is no such kernel to choose";
const PREFIX_HASH: &str = "prefix-cache blocks are hashed with rserve's own hash chain";
const PROFILER: &str = "use rserve's --profile (CUDA step timings) instead of vLLM's torch profiler";
const PROMPT_EMBEDS: &str = "prompt embeddings as input are not supported";
const QUANTIZATION: &str = "rserve serves unquantized weights (GGUF files are dequantized at load)";
const QUEUE: &str = "the queue is bounded in requests (--max-num-queued-reqs, --max-num-waiting), not tokens";
const REQUEST_TEMPLATE: &str = "a request's own chat_template is refused by rserve";
const RESPONSE_ROLE: &str = "chat responses always use the role 'assistant'";
const SAMPLER: &str = "rserve's sampler has no such option";
const SCALE_OUT: &str = "no scale-out endpoints";
const SCHEDULER: &str = "rserve's scheduler (vLLM v1's policy: FCFS, token budget) has no such option";
const SSE_KEEPALIVE: &str = "no SSE keep-alive comments";
const SSL_CIPHERS: &str = "rustls uses its own safe cipher suites (TLS 1.3, and ECDHE AEAD suites for TLS 1.2)";
const STEP_BUDGET: &str = "a step's budget is --max-num-batched-tokens and --max-num-seqs";
const STREAM_INTERVAL: &str = "tokens are streamed as soon as they are detokenized";
const STRUCTURED_OUTPUTS: &str = "structured outputs always run on llguidance";
const TOKENIZER_MODE: &str = "rserve reads Hugging Face tokenizer.json files (or GGUF metadata) only";
const TOKENS_ONLY: &str = "no tokens-only mode";
const TOOLS_ALWAYS: &str = "the request's tools are always passed to the chat template";
const TOOL_STRICT: &str = "tool calls follow the request's tool_choice and strict fields";
const TUNING: &str = "a vLLM tuning knob with no counterpart in rserve's engine";
const USAGE_ON_REQUEST: &str = "usage is included when the request asks for it (stream_options.include_usage)";
const VLLM_INTERNAL: &str = "internal to vLLM's Rust frontend";
const CONFIG_FORMAT: &str = "rserve reads Hugging Face config.json (or GGUF metadata) only";
const LOGPROBS_MODE: &str = "log-probs are the model's raw log-softmax (vLLM's raw_logprobs)";
const FCFS: &str = "requests are scheduled first come, first served (no priorities)";
// Older vLLM flags (before the fixture's version) that job scripts still pass.
const NO_SWAP: &str = "no CPU swap space: preempted requests are recomputed, as in vLLM v1";
const MULTI_STEP: &str = "each step is scheduled on its own (vLLM v1 dropped multi-step scheduling too)";

/// The table. Order: vLLM's (the fixture's), then the legacy flags, then rserve's own.
pub static FLAGS: &[VllmFlag] = &[
    // options
    v(&["--headless"], S, Refused(HEADLESS)),
    v(&["--headless-client-handshake-address"], V, Ignored(VLLM_INTERNAL)),
    v(&["--api-server-count", "-asc"], V, Ignored(ONE_SERVER)),
    v(&["--config"], V, Implemented),
    v(&["--grpc"], S, Refused(NO_GRPC)),
    // Frontend
    v(&["--lora-modules"], N, Refused(LORA)),
    v(&["--chat-template"], V, Implemented),
    v(&["--chat-template-content-format"], V, Ignored(CONTENT_FORMAT)),
    v(&["--trust-request-chat-template", "--no-trust-request-chat-template"], S, Ignored(REQUEST_TEMPLATE)),
    v(&["--trust-request-mm-kwargs", "--no-trust-request-mm-kwargs"], S, Ignored(MULTIMODAL)),
    v(&["--default-chat-template-kwargs"], V, Implemented),
    v(&["--reasoning-effort-map"], V, Ignored(NO_REASONING)),
    v(&["--response-role"], V, Ignored(RESPONSE_ROLE)),
    v(&["--return-tokens-as-token-ids", "--no-return-tokens-as-token-ids"], S, Refused(NOT_YET)),
    v(&["--enable-auto-tool-choice", "--disable-auto-tool-choice"], S, Implemented),
    v(&["--exclude-tools-when-tool-choice-none", "--no-exclude-tools-when-tool-choice-none"], S, Ignored(TOOLS_ALWAYS)),
    v(&["--tool-call-parser"], V, Implemented),
    v(&["--tool-parser-plugin"], V, Ignored(NO_PLUGINS)),
    v(&["--tool-strict-level"], V, Ignored(TOOL_STRICT)),
    v(&["--tool-server"], V, Refused(NO_TOOL_SERVER)),
    v(&["--max-log-len"], V, Ignored(LOG_LEN)),
    v(&["--enable-prompt-tokens-details", "--disable-prompt-tokens-details"], S, Ignored(NO_USAGE_DETAILS)),
    v(&["--enable-per-request-metrics", "--disable-per-request-metrics"], S, Ignored(NO_USAGE_DETAILS)),
    v(&["--enable-server-load-tracking", "--disable-server-load-tracking"], S, Implemented),
    v(&["--enable-force-include-usage", "--disable-force-include-usage"], S, Ignored(USAGE_ON_REQUEST)),
    v(&["--sse-keep-alive-interval"], V, Ignored(SSE_KEEPALIVE)),
    v(&["--enable-tokenizer-info-endpoint", "--disable-tokenizer-info-endpoint"], S, Ignored(NO_TOKENIZER_INFO)),
    v(&["--enable-log-outputs", "--disable-log-outputs"], S, Ignored(LOG_OUTPUTS)),
    v(&["--enable-log-deltas", "--disable-log-deltas"], S, Ignored(LOG_OUTPUTS)),
    v(&["--cohere-is-reasoning-model", "--no-cohere-is-reasoning-model"], S, Ignored(NO_COHERE)),
    v(&["--cohere-format"], V, Ignored(NO_COHERE)),
    v(&["--anthropic-disabled-thinking-effort"], V, Ignored(NO_ANTHROPIC)),
    v(&["--log-error-stack", "--no-log-error-stack"], S, Ignored(NO_STACK)),
    v(&["--tokens-only", "--no-tokens-only"], S, Refused(TOKENS_ONLY)),
    v(&["--enable-scale-out", "--disable-scale-out"], S, Refused(SCALE_OUT)),
    v(&["--fingerprint-mode"], V, Ignored(FINGERPRINT)),
    v(&["--fingerprint-value"], V, Ignored(FINGERPRINT)),
    v(&["--host"], V, Implemented),
    v(&["--port"], V, Implemented),
    v(&["--grpc-port"], V, Refused(NO_GRPC)),
    v(&["--data-parallel-supervisor-port"], V, Ignored(DATA_PARALLEL)),
    v(&["--dp-supervisor-probe-interval-s"], V, Ignored(DATA_PARALLEL)),
    v(&["--dp-supervisor-probe-timeout-s"], V, Ignored(DATA_PARALLEL)),
    v(&["--dp-supervisor-probe-failure-threshold"], V, Ignored(DATA_PARALLEL)),
    v(&["--uds"], V, Refused(NO_UDS)),
    v(&["--uvicorn-log-level"], V, Implemented),
    v(&["--disable-uvicorn-access-log", "--enable-uvicorn-access-log"], S, Implemented),
    v(&["--disable-access-log-for-endpoints"], V, Implemented),
    v(&["--allow-credentials", "--no-allow-credentials"], S, Implemented),
    v(&["--allowed-origins"], V, Implemented),
    v(&["--allowed-methods"], V, Implemented),
    v(&["--allowed-headers"], V, Implemented),
    v(&["--api-key"], N, Implemented),
    v(&["--ssl-keyfile"], V, Implemented),
    v(&["--ssl-certfile"], V, Implemented),
    v(&["--ssl-ca-certs"], V, Implemented),
    v(&["--enable-ssl-refresh", "--disable-ssl-refresh"], S, Implemented),
    v(&["--ssl-cert-reqs"], V, Implemented),
    v(&["--ssl-ciphers"], V, Ignored(SSL_CIPHERS)),
    v(&["--root-path"], V, Implemented),
    v(&["--middleware"], N, Refused(NO_MIDDLEWARE)),
    v(&["--enable-request-id-headers", "--disable-request-id-headers"], S, Implemented),
    v(&["--disable-fastapi-docs", "--enable-fastapi-docs"], S, Ignored(NO_DOCS)),
    v(&["--h11-max-incomplete-event-size"], V, Implemented),
    v(&["--h11-max-header-count"], V, Implemented),
    v(&["--enable-offline-docs", "--disable-offline-docs"], S, Ignored(NO_DOCS)),
    v(&["--enable-flash-late-interaction", "--disable-flash-late-interaction"], S, Ignored(LATE_INTERACTION)),
    // ModelConfig
    v(&["--model"], V, Implemented),
    v(&["--runner"], V, Implemented),
    v(&["--convert"], V, Implemented),
    v(&["--tokenizer"], V, Implemented),
    v(&["--tokenizer-mode"], V, Only(&["auto", "hf"], TOKENIZER_MODE)),
    v(&["--trust-remote-code", "--no-trust-remote-code"], S, Implemented),
    v(&["--dtype"], V, Implemented),
    v(&["--seed"], V, Implemented),
    v(&["--hf-config-path"], V, Refused(HF_CONFIG)),
    v(&["--allowed-local-media-path"], V, Ignored(MULTIMODAL)),
    v(&["--allowed-media-domains"], N, Ignored(MULTIMODAL)),
    v(&["--revision"], V, Implemented),
    v(&["--code-revision"], V, Ignored(NO_REMOTE_CODE)),
    v(&["--tokenizer-revision"], V, Implemented),
    v(&["--max-model-len"], V, Implemented),
    v(&["--quantization", "-q"], V, Implemented),
    v(&["--quantization-config"], V, Refused(QUANTIZATION)),
    v(&["--allow-deprecated-quantization", "--no-allow-deprecated-quantization"], S, Ignored(QUANTIZATION)),
    v(&["--enforce-eager", "--no-enforce-eager"], S, Implemented),
    v(&["--enable-return-routed-experts", "--disable-return-routed-experts"], S, Ignored(NO_ROUTED_OUT)),
    v(&["--return-sampling-mask", "--no-return-sampling-mask"], S, Ignored(SAMPLER)),
    v(&["--max-logprobs"], V, Implemented),
    v(&["--logprobs-mode"], V, Only(&["raw_logprobs"], LOGPROBS_MODE)),
    v(&["--use-fp64-gumbel", "--no-use-fp64-gumbel"], S, Ignored(SAMPLER)),
    v(&["--enable-trace-replay", "--disable-trace-replay"], S, Ignored(TUNING)),
    v(&["--disable-sliding-window", "--enable-sliding-window"], S, Ignored(NO_SLIDING_WINDOW)),
    v(&["--disable-cascade-attn", "--enable-cascade-attn"], S, Ignored(KERNELS)),
    v(&["--skip-tokenizer-init", "--no-skip-tokenizer-init"], S, Refused(NEEDS_TOKENIZER)),
    v(&["--enable-prompt-embeds", "--disable-prompt-embeds"], S, Refused(PROMPT_EMBEDS)),
    v(&["--served-model-name"], N, Implemented),
    v(&["--config-format"], V, Only(&["auto", "hf"], CONFIG_FORMAT)),
    v(&["--hf-token"], O, Implemented),
    v(&["--hf-overrides"], V, Refused(HF_CONFIG)),
    v(&["--model-class-overrides"], V, Refused(NO_PLUGINS)),
    v(&["--pooler-config"], V, Implemented),
    v(&["--generation-config"], V, Implemented),
    v(&["--override-generation-config"], V, Implemented),
    v(&["--enable-sleep-mode", "--disable-sleep-mode"], S, Ignored(NO_SLEEP)),
    v(&["--sleep-mode-backend"], V, Ignored(NO_SLEEP)),
    v(&["--sleep-mode-offload-cudagraph", "--no-sleep-mode-offload-cudagraph"], S, Ignored(NO_SLEEP)),
    v(&["--sleep-preserve-parameter-names"], N, Ignored(NO_SLEEP)),
    v(&["--enable-cumem-allocator", "--disable-cumem-allocator"], S, Ignored(MEMORY_POOL)),
    v(&["--enable-nccl-comm-suspend", "--disable-nccl-comm-suspend"], S, Ignored(MPI_NOT_NCCL)),
    v(&["--checkpoint-prepare-on-startup", "--no-checkpoint-prepare-on-startup"], S, Ignored(TUNING)),
    v(&["--model-impl"], V, Ignored(MODEL_IMPL)),
    v(&["--logits-processors"], N, Refused(NO_PLUGINS)),
    v(&["--io-processor-plugin"], V, Refused(NO_PLUGINS)),
    v(&["--renderer-num-workers"], V, Ignored(TUNING)),
    // LoadConfig
    v(&["--load-format"], V, Implemented),
    v(&["--download-dir"], V, Implemented),
    v(&["--safetensors-load-strategy"], V, Ignored(MMAP)),
    v(&["--safetensors-prefetch-num-threads"], V, Ignored(MMAP)),
    v(&["--safetensors-prefetch-block-size"], V, Ignored(MMAP)),
    v(&["--model-loader-extra-config"], V, Ignored(LOADER)),
    v(&["--ignore-patterns"], N, Ignored(DOWNLOAD_FILES)),
    v(&["--use-tqdm-on-load", "--no-use-tqdm-on-load"], S, Ignored(LOADER)),
    v(&["--pt-load-map-location"], V, Ignored(LOADER)),
    v(&["--shuffle-safetensors-files", "--no-shuffle-safetensors-files"], S, Ignored(LOADER)),
    // AttentionConfig
    v(&["--attention-backend"], V, Ignored(KERNELS)),
    // MambaConfig
    v(&["--mamba-backend"], V, Ignored(NO_MAMBA)),
    v(&["--mamba-ssu-algorithm"], V, Ignored(NO_MAMBA)),
    v(&["--enable-mamba-cache-stochastic-rounding", "--disable-mamba-cache-stochastic-rounding"], S, Ignored(NO_MAMBA)),
    v(&["--mamba-cache-philox-rounds"], V, Ignored(NO_MAMBA)),
    // StructuredOutputsConfig
    v(&["--reasoning-parser"], V, Implemented),
    v(&["--reasoning-parser-plugin"], V, Refused(NO_REASONING_PARSER)),
    // ParallelConfig
    v(&["--distributed-executor-backend"], V, Implemented),
    v(&["--pipeline-parallel-size", "-pp"], V, Implemented),
    v(&["--master-addr"], V, Ignored(MPI_LAUNCH)),
    v(&["--master-port"], V, Ignored(MPI_LAUNCH)),
    v(&["--nnodes", "-n"], V, Only(&["1"], MPI_LAUNCH)),
    v(&["--node-rank", "-r"], V, Only(&["0"], MPI_LAUNCH)),
    v(&["--distributed-timeout-seconds"], V, Ignored(MPI_NOT_NCCL)),
    v(&["--cpu-distributed-timeout-seconds"], V, Ignored(MPI_NOT_NCCL)),
    v(&["--numa-bind", "--no-numa-bind"], S, Ignored(NUMA)),
    v(&["--numa-bind-nodes"], N, Ignored(NUMA)),
    v(&["--numa-bind-cpus"], N, Ignored(NUMA)),
    v(&["--device-ids"], V, Ignored(DEVICE_IDS)),
    v(&["--tensor-parallel-size", "-tp"], V, Implemented),
    v(&["--decode-context-parallel-size", "-dcp"], V, Only(&["1"], CONTEXT_PARALLEL)),
    v(&["--dcp-comm-backend"], V, Ignored(CONTEXT_PARALLEL)),
    v(&["--dcp-q-replicate", "--no-dcp-q-replicate"], S, Ignored(CONTEXT_PARALLEL)),
    v(&["--dcp-kv-cache-interleave-size"], V, Ignored(CONTEXT_PARALLEL)),
    v(&["--cp-kv-cache-interleave-size"], V, Ignored(CONTEXT_PARALLEL)),
    v(&["--prefill-context-parallel-size", "-pcp"], V, Only(&["1"], CONTEXT_PARALLEL)),
    v(&["--data-parallel-size", "-dp"], V, Implemented),
    v(&["--data-parallel-rank", "-dpn"], V, Ignored(DATA_PARALLEL)),
    v(&["--data-parallel-start-rank", "-dpr"], V, Ignored(DATA_PARALLEL)),
    v(&["--data-parallel-size-local", "-dpl"], V, Ignored(DATA_PARALLEL)),
    v(&["--data-parallel-address", "-dpa"], V, Ignored(DATA_PARALLEL)),
    v(&["--data-parallel-rpc-port", "-dpp"], V, Ignored(DATA_PARALLEL)),
    v(&["--data-parallel-backend", "-dpb"], V, Ignored(DATA_PARALLEL)),
    v(&["--data-parallel-hybrid-lb", "--no-data-parallel-hybrid-lb", "-dph"], S, Ignored(DATA_PARALLEL)),
    v(&["--data-parallel-external-lb", "--no-data-parallel-external-lb", "-dpe"], S, Ignored(DATA_PARALLEL)),
    v(&["--data-parallel-multi-port-external-lb", "-dpm"], S, Ignored(DATA_PARALLEL)),
    v(&["--enable-hc-sp", "--disable-hc-sp"], S, Ignored(TUNING)),
    v(&["--enable-expert-parallel", "-ep", "--disable-expert-parallel"], S, Implemented),
    v(&["--enable-batch-sharded-sampling", "--disable-batch-sharded-sampling"], S, Ignored(TUNING)),
    v(&["--enable-ep-weight-filter", "--disable-ep-weight-filter"], S, Ignored(NO_EP)),
    v(&["--all2all-backend"], V, Ignored(NO_EP)),
    v(&["--enable-dbo", "--disable-dbo"], S, Ignored(TUNING)),
    v(&["--enable-shm-tensor-arena", "--disable-shm-tensor-arena"], S, Ignored(TUNING)),
    v(&["--ubatch-size"], V, Ignored(TUNING)),
    v(&["--enable-elastic-ep", "--disable-elastic-ep"], S, Ignored(NO_EP)),
    v(&["--elastic-ep-max-dp-size"], V, Ignored(NO_EP)),
    v(&["--dbo-decode-token-threshold"], V, Ignored(TUNING)),
    v(&["--dp-sync-interval"], V, Ignored(DATA_PARALLEL)),
    v(&["--dbo-prefill-token-threshold"], V, Ignored(TUNING)),
    v(&["--disable-nccl-for-dp-synchronization", "--enable-nccl-for-dp-synchronization"], S, Ignored(DATA_PARALLEL)),
    v(&["--enable-eplb", "--disable-eplb"], S, Ignored(NO_EP)),
    v(&["--eplb-config"], V, Ignored(NO_EP)),
    v(&["--expert-placement-strategy"], V, Only(&["linear"], NO_EP)),
    v(&["--max-parallel-loading-workers"], V, Ignored(LOADER)),
    v(&["--ray-workers-use-nsight", "--no-ray-workers-use-nsight"], S, Ignored(MPI_LAUNCH)),
    v(&["--disable-custom-all-reduce", "--enable-custom-all-reduce"], S, Ignored(MPI_NOT_NCCL)),
    v(&["--worker-cls"], V, Ignored(NO_PLUGINS)),
    v(&["--worker-extension-cls"], V, Ignored(NO_PLUGINS)),
    v(&["--enable-fault-tolerance", "--disable-fault-tolerance"], S, Ignored(TUNING)),
    v(&["--fault-tolerance-config"], V, Ignored(TUNING)),
    // CacheConfig
    v(&["--block-size"], V, Implemented),
    v(&["--gpu-memory-utilization", "--device-memory-utilization"], V, Implemented),
    v(&["--kv-cache-memory-bytes"], V, Implemented),
    v(&["--enable-extensible-kv-cache", "--disable-extensible-kv-cache"], S, Ignored(KV_CACHE)),
    v(&["--kv-cache-dtype"], V, Implemented),
    v(&["--num-gpu-blocks-override"], V, Ignored(KV_BLOCKS)),
    v(&["--enable-prefix-caching", "--disable-prefix-caching"], S, Implemented),
    v(&["--prefix-caching-hash-algo"], V, Ignored(PREFIX_HASH)),
    v(&["--prefix-cache-retention-interval"], V, Ignored(KV_CACHE)),
    v(&["--kv-cache-dtype-skip-layers"], N, Ignored(KV_CACHE)),
    v(&["--kv-sharing-fast-prefill", "--no-kv-sharing-fast-prefill"], S, Ignored(KV_CACHE)),
    v(&["--swa-bounded-replay", "--no-swa-bounded-replay"], S, Ignored(NO_SLIDING_WINDOW)),
    v(&["--mamba-cache-dtype"], V, Ignored(NO_MAMBA)),
    v(&["--mamba-ssm-cache-dtype"], V, Ignored(NO_MAMBA)),
    v(&["--mamba-block-size"], V, Ignored(NO_MAMBA)),
    v(&["--prefix-match-unit"], V, Ignored(KV_CACHE)),
    v(&["--mamba-cache-mode"], V, Ignored(NO_MAMBA)),
    v(&["--enable-mamba-shared-prefix-checkpoint", "--disable-mamba-shared-prefix-checkpoint"], S, Ignored(NO_MAMBA)),
    v(&["--replayssm-buffer-len"], V, Ignored(NO_MAMBA)),
    v(&["--use-replayssm", "--no-use-replayssm"], S, Ignored(NO_MAMBA)),
    v(&["--kv-offloading-size"], V, Ignored(NO_OFFLOAD)),
    v(&["--kv-offloading-backend"], V, Ignored(NO_OFFLOAD)),
    // OffloadConfig
    v(&["--offload-backend"], V, Ignored(NO_OFFLOAD)),
    v(&["--cpu-offload-gb"], V, Ignored(NO_OFFLOAD)),
    v(&["--cpu-offload-params"], N, Ignored(NO_OFFLOAD)),
    v(&["--offload-group-size"], V, Ignored(NO_OFFLOAD)),
    v(&["--offload-num-in-group"], V, Ignored(NO_OFFLOAD)),
    v(&["--offload-prefetch-step"], V, Ignored(NO_OFFLOAD)),
    v(&["--offload-params"], N, Ignored(NO_OFFLOAD)),
    // MultiModalConfig
    v(&["--language-model-only", "--no-language-model-only"], S, Ignored(MULTIMODAL)),
    v(&["--limit-mm-per-prompt"], V, Ignored(MULTIMODAL)),
    v(&["--enable-mm-embeds", "--disable-mm-embeds"], S, Ignored(MULTIMODAL)),
    v(&["--media-io-kwargs"], V, Ignored(MULTIMODAL)),
    v(&["--mm-processor-kwargs"], V, Ignored(MULTIMODAL)),
    v(&["--mm-processor-cache-gb"], V, Ignored(MULTIMODAL)),
    v(&["--mm-processor-cache-type"], V, Ignored(MULTIMODAL)),
    v(&["--mm-hasher-algorithm"], V, Ignored(MULTIMODAL)),
    v(&["--mm-shm-cache-max-object-size-mb"], V, Ignored(MULTIMODAL)),
    v(&["--mm-encoder-only", "--no-mm-encoder-only"], S, Ignored(MULTIMODAL)),
    v(&["--mm-encoder-tp-mode"], V, Ignored(MULTIMODAL)),
    v(&["--mm-encoder-attn-backend"], V, Ignored(MULTIMODAL)),
    v(&["--mm-encoder-attn-dtype"], V, Ignored(MULTIMODAL)),
    v(&["--mm-encoder-fp8-scale-path"], V, Ignored(MULTIMODAL)),
    v(&["--mm-encoder-fp8-scale-save-path"], V, Ignored(MULTIMODAL)),
    v(&["--mm-encoder-fp8-scale-save-margin"], V, Ignored(MULTIMODAL)),
    v(&["--interleave-mm-strings", "--no-interleave-mm-strings"], S, Ignored(MULTIMODAL)),
    v(&["--skip-mm-profiling", "--no-skip-mm-profiling"], S, Ignored(MULTIMODAL)),
    v(&["--video-pruning-rate"], V, Ignored(MULTIMODAL)),
    v(&["--video-pruning-method"], V, Ignored(MULTIMODAL)),
    v(&["--mm-tensor-ipc"], V, Ignored(MULTIMODAL)),
    v(&["--mm-processor-device"], V, Ignored(MULTIMODAL)),
    v(&["--mm-ipc-gpu-memory-gb"], V, Ignored(MULTIMODAL)),
    v(&["--mm-device-do-normalize", "--no-mm-device-do-normalize"], S, Ignored(MULTIMODAL)),
    // LoRAConfig
    v(&["--enable-lora", "--disable-lora"], S, Refused(LORA)),
    v(&["--max-loras"], V, Ignored(LORA)),
    v(&["--max-lora-rank"], V, Ignored(LORA)),
    v(&["--lora-dtype"], V, Ignored(LORA)),
    v(&["--enable-tower-connector-lora", "--disable-tower-connector-lora"], S, Ignored(LORA)),
    v(&["--max-cpu-loras"], V, Ignored(LORA)),
    v(&["--fully-sharded-loras", "--no-fully-sharded-loras"], S, Ignored(LORA)),
    v(&["--lora-target-modules"], N, Ignored(LORA)),
    v(&["--default-mm-loras"], V, Ignored(LORA)),
    v(&["--specialize-active-lora", "--no-specialize-active-lora"], S, Ignored(LORA)),
    v(&["--enable-mixed-moe-lora-format", "--disable-mixed-moe-lora-format"], S, Ignored(LORA)),
    v(&["--enable-moe-shared-loras", "--disable-moe-shared-loras"], S, Ignored(LORA)),
    v(&["--max-lora-cls-labels"], V, Ignored(LORA)),
    // LoggingConfig
    v(&["--logging-config"], V, Ignored(LOGGING_CONFIG)),
    v(&["--log-level"], V, Implemented),
    v(&["--log-config-file"], V, Ignored(LOGGING_CONFIG)),
    // ObservabilityConfig
    v(&["--show-hidden-metrics-for-version"], V, Ignored(METRICS_KNOB)),
    v(&["--otlp-traces-endpoint"], V, Ignored(NO_OTLP)),
    v(&["--collect-detailed-traces"], N, Ignored(NO_OTLP)),
    v(&["--per-request-spec-decode-metrics"], V, Ignored(METRICS_KNOB)),
    v(&["--kv-cache-metrics", "--no-kv-cache-metrics"], S, Ignored(METRICS_KNOB)),
    v(&["--kv-cache-metrics-sample"], V, Ignored(METRICS_KNOB)),
    v(&["--custom-histogram-buckets"], V, Ignored(METRICS_KNOB)),
    v(&["--cudagraph-metrics", "--no-cudagraph-metrics"], S, Ignored(METRICS_KNOB)),
    v(&["--enable-layerwise-nvtx-tracing", "--disable-layerwise-nvtx-tracing"], S, Ignored(METRICS_KNOB)),
    v(&["--enable-mfu-metrics", "--disable-mfu-metrics"], S, Ignored(METRICS_KNOB)),
    v(&["--enable-logging-iteration-details", "--disable-logging-iteration-details"], S, Ignored(METRICS_KNOB)),
    v(&["--jit-monitor-mode"], V, Ignored(METRICS_KNOB)),
    v(&["--jit-monitor-verbose", "--no-jit-monitor-verbose"], S, Ignored(METRICS_KNOB)),
    // SchedulerConfig
    v(&["--max-num-batched-tokens"], V, Implemented),
    v(&["--max-num-scheduled-tokens"], V, Ignored(STEP_BUDGET)),
    v(&["--max-num-seqs"], V, Implemented),
    v(&["--max-num-active-seqs"], V, Ignored(STEP_BUDGET)),
    v(&["--max-num-inflight-kv-loads"], V, Ignored(NO_OFFLOAD)),
    v(&["--max-num-queued-reqs"], V, Implemented),
    v(&["--max-num-queued-tokens"], V, Ignored(QUEUE)),
    v(&["--long-prefill-token-threshold"], V, Implemented),
    v(
        &["--long-prefill-token-threshold-adaptive", "--no-long-prefill-token-threshold-adaptive"],
        S,
        Ignored(SCHEDULER),
    ),
    v(&["--scheduling-policy"], V, Only(&["fcfs"], FCFS)),
    v(&["--enable-chunked-prefill", "--disable-chunked-prefill"], S, Ignored(CHUNKED_PREFILL)),
    v(&["--disable-chunked-mm-input", "--enable-chunked-mm-input"], S, Ignored(MULTIMODAL)),
    v(&["--scheduler-cls"], V, Ignored(NO_PLUGINS)),
    v(&["--scheduler-reserve-full-isl", "--no-scheduler-reserve-full-isl"], S, Ignored(SCHEDULER)),
    v(&["--watermark"], V, Ignored(SCHEDULER)),
    v(&["--prefill-schedule-interval"], V, Ignored(SCHEDULER)),
    v(&["--cache-aware-admission-window"], V, Ignored(SCHEDULER)),
    v(&["--cache-aware-admission-threshold"], V, Ignored(SCHEDULER)),
    v(&["--disable-hybrid-kv-cache-manager", "--enable-hybrid-kv-cache-manager"], S, Ignored(KV_CACHE)),
    v(&["--async-scheduling", "--no-async-scheduling"], S, Implemented),
    v(&["--stream-interval"], V, Ignored(STREAM_INTERVAL)),
    // CompilationConfig
    v(&["--cudagraph-capture-sizes"], N, Ignored(CUDA_GRAPHS)),
    v(&["--max-cudagraph-capture-size"], V, Ignored(CUDA_GRAPHS)),
    // KernelConfig
    v(&["--ir-op-priority"], V, Ignored(KERNELS)),
    v(&["--enable-flashinfer-autotune", "--disable-flashinfer-autotune"], S, Ignored(KERNELS)),
    v(&["--monokernel", "--no-monokernel"], S, Ignored(KERNELS)),
    v(&["--moe-backend"], V, Ignored(KERNELS)),
    v(&["--linear-backend"], V, Ignored(KERNELS)),
    v(&["--sparse-indexer-topk-backend"], V, Ignored(KERNELS)),
    // VllmConfig
    v(&["--speculative-config", "-sc"], V, Ignored(NO_SPECULATIVE)),
    v(&["--spec-method"], V, Ignored(NO_SPECULATIVE)),
    v(&["--spec-model"], V, Ignored(NO_SPECULATIVE)),
    v(&["--spec-tokens"], V, Ignored(NO_SPECULATIVE)),
    v(&["--watermark-config"], V, Refused(NO_WATERMARK)),
    v(&["--diffusion-config", "-dc"], V, Refused(NO_DIFFUSION)),
    v(&["--kv-transfer-config"], V, Refused(NO_KV_TRANSFER)),
    v(&["--kv-events-config"], V, Ignored(NO_KV_EVENTS)),
    v(&["--ec-transfer-config"], V, Refused(NO_KV_TRANSFER)),
    v(&["--ec-manager-config"], V, Ignored(MULTIMODAL)),
    v(&["--compilation-config", "-cc"], V, Ignored(NO_TORCH_COMPILE)),
    v(&["--attention-config", "-ac"], V, Ignored(KERNELS)),
    v(&["--engram-config"], V, Ignored(TUNING)),
    v(&["--reasoning-config"], V, Refused(NO_REASONING_PARSER)),
    v(&["--kernel-config"], V, Ignored(KERNELS)),
    v(&["--additional-config"], V, Ignored(NO_PLUGINS)),
    v(&["--structured-outputs-config"], V, Ignored(STRUCTURED_OUTPUTS)),
    v(&["--aux-output-config"], V, Ignored(TUNING)),
    v(&["--profiler-config"], V, Ignored(PROFILER)),
    v(&["--watchdog-config"], V, Ignored(TUNING)),
    v(&["--optimization-level"], V, Ignored(NO_TORCH_COMPILE)),
    v(&["--performance-mode"], V, Ignored(TUNING)),
    v(&["--weight-transfer-config"], V, Ignored(NO_KV_TRANSFER)),
    // options
    v(&["--disable-log-stats"], S, Implemented),
    v(&["--aggregate-engine-logging"], S, Ignored(ONE_SERVER)),
    v(&["--fail-on-environ-validation", "--no-fail-on-environ-validation"], S, Ignored(ENVIRON)),
    v(&["--shutdown-timeout"], V, Implemented),
    v(&["--gdn-prefill-backend"], V, Ignored(KERNELS)),
    v(&["--kda-prefill-backend"], V, Ignored(KERNELS)),
    v(&["--kda-decode-backend"], V, Ignored(KERNELS)),
    v(&["--enable-log-requests", "--disable-log-requests"], S, Implemented),
    // Older vLLM versions
    legacy(&["--swap-space"], V, Ignored(NO_SWAP)),
    legacy(&["--max-num-partial-prefills"], V, Implemented),
    legacy(&["--max-long-partial-prefills"], V, Implemented),
    legacy(&["--num-scheduler-steps"], V, Ignored(MULTI_STEP)),
    legacy(&["--use-v2-block-manager"], S, Ignored(KV_CACHE)),
    legacy(&["--preemption-mode"], V, Ignored(NO_SWAP)),
    legacy(&["--max-seq-len-to-capture"], V, Ignored(CUDA_GRAPHS)),
    legacy(&["--disable-frontend-multiprocessing"], S, Ignored(ONE_SERVER)),
    legacy(&["--guided-decoding-backend"], V, Ignored(STRUCTURED_OUTPUTS)),
    legacy(&["--enable-reasoning"], S, Refused(NO_REASONING_PARSER)),
    legacy(&["--task"], V, Implemented),
    legacy(&["--tokenizer-pool-size"], V, Ignored(TUNING)),
    // rserve's own (`--no-enable-prefix-caching` is also older vLLM's spelling)
    VllmFlag { names: &["--no-enable-prefix-caching"], arity: S, support: Implemented, origin: Origin::VllmLegacy },
    rserve(&["--device"], V),
    rserve(&["--opencl-platform"], V),
    rserve(&["--opencl-device"], V),
    rserve(&["--cpu-packed-weights"], S),
    rserve(&["--cpu-dequantize-weights"], S),
    rserve(&["--cpu-threads"], V),
    rserve(&["--profile"], V),
    rserve(&["--max-num-waiting"], V),
    rserve(&["--testing-fail-engine-after-requests"], V),
    rserve(&["--testing-panic-in-step-after"], V),
    rserve(&["--testing-error-in-step-after"], V),
    rserve(&["--max-request-time"], V),
    rserve(&["--http-header-timeout"], V),
    rserve(&["--http-body-timeout"], V),
    rserve(&["--max-connections"], V),
    rserve(&["--api-key-file"], V),
];

#[cfg(test)]
#[path = "vllm_flags_tests.rs"]
mod tests;
