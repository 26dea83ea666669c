//! `start`: resolve and load the model, size the KV cache, build the scheduler and runner, and spawn the engine
//! thread. Logs the start-up numbers vLLM users look for.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Instant;

use rserve_scheduler::PrefillLimits;
use rserve_scheduler::{Scheduler, SchedulerConfig, TokenId};

use super::budget::{self, GIB};
use super::config::EngineConfig;
use super::device::Device;
use super::distributed::{self, Role};
use super::handle::EngineHandle;
use super::metrics::{CacheInfo, EngineMetrics, MetricsSetup};
use super::thread::EngineLoop;
use crate::api::{EngineInfo, SamplingParams};
use crate::chat_template::{ChatTemplate, TemplateSources};
use crate::config::gguf_meta::read_gguf_header;
use crate::error::{EngineError, ModelError, Result};
use crate::model::KvLayout;
use crate::source::{resolve_model, ResolveOptions, ResolvedModel};
use crate::tokenizer::Tokenizer;

fn load_tokenizer(cfg: &EngineConfig, resolved: &ResolvedModel, opts: &ResolveOptions) -> Result<Tokenizer> {
    if let Some(spec) = &cfg.tokenizer {
        // A folder, or a Hub repo id looked up in (and downloaded to) the same cache as models.
        let dir = crate::source::resolve_tokenizer(spec, &opts.clone().revision(cfg.tokenizer_revision.clone()))?;
        let cfg_file = dir.join("tokenizer_config.json");
        return Ok(Tokenizer::from_file(&dir.join("tokenizer.json"), cfg_file.exists().then_some(cfg_file.as_path()))?);
    }
    let files = resolved.files();
    match (&files.tokenizer, resolved) {
        (Some(t), _) => Ok(Tokenizer::from_file(t, files.tokenizer_config.as_deref())?),
        (None, ResolvedModel::Gguf(g)) => Ok(Tokenizer::from_gguf(&read_gguf_header(&g.file)?)?),
        (None, ResolvedModel::Safetensors(m)) => {
            Err(EngineError::Model(ModelError::Tokenizer(format!("no tokenizer.json in {}", m.dir.display()))))
        }
    }
}

fn load_chat_template(cfg: &EngineConfig, resolved: &ResolvedModel, tok: &Tokenizer) -> Result<Option<ChatTemplate>> {
    let gguf = match resolved {
        ResolvedModel::Gguf(g) => Some(read_gguf_header(&g.file)?),
        ResolvedModel::Safetensors(_) => None,
    };
    let dir = match resolved {
        ResolvedModel::Safetensors(m) => Some(m.dir.as_path()),
        ResolvedModel::Gguf(g) => g.tokenizer_dir.as_deref(),
    };
    let sources =
        TemplateSources { override_template: cfg.chat_template.as_deref(), model_dir: dir, gguf: gguf.as_ref() };
    Ok(ChatTemplate::from_sources(&sources, tok)?)
}

/// What the generation config gives requests, as vLLM's `get_diff_sampling_param` reads it.
struct GenerationDefaults {
    sampling: SamplingParams,
    /// `max_new_tokens`: the `max_tokens` of a request that sends none.
    max_new_tokens: Option<usize>,
    /// vLLM's `override_max_tokens`: the `max_tokens` no request goes past.
    max_tokens_cap: Option<usize>,
}

/// Sampling defaults from `generation_config.json` (`--generation-config auto` or a folder; none with `vllm`), with
/// `--override-generation-config`'s keys over them. `max_new_tokens` becomes the default `max_tokens`; as in vLLM,
/// it is also a cap on every request when it comes from the override (or from a `--generation-config` folder).
/// `model_file`: the model's own generation_config.json, if it has one.
fn generation_defaults(cfg: &EngineConfig, model_file: Option<&std::path::Path>) -> Result<GenerationDefaults> {
    let path = match cfg.generation_config.as_str() {
        "vllm" => None,
        "auto" => model_file.map(std::path::Path::to_path_buf),
        dir => Some(std::path::Path::new(dir).join("generation_config.json")),
    };
    let mut v = serde_json::Map::new();
    if let Some(path) = path {
        let text = std::fs::read_to_string(&path)
            .map_err(|e| EngineError::Model(ModelError::Io { path: path.clone(), source: e }))?;
        v = serde_json::from_str(&text)
            .map_err(|e| EngineError::Model(ModelError::Config(format!("{}: {e}", path.display()))))?;
    }
    v.extend(cfg.override_generation_config.clone());
    let max_new_tokens = |m: &serde_json::Map<String, serde_json::Value>| -> Result<Option<usize>> {
        match m.get("max_new_tokens") {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(x) => match x.as_u64() {
                Some(n) if n > 0 => Ok(Some(n as usize)),
                _ => Err(EngineError::Model(ModelError::Config(format!(
                    "max_new_tokens must be a positive integer, got {x}"
                )))),
            },
        }
    };
    let folder = !matches!(cfg.generation_config.as_str(), "auto" | "vllm");
    let max_tokens_cap = if folder { max_new_tokens(&v)? } else { max_new_tokens(&cfg.override_generation_config)? };
    Ok(GenerationDefaults { sampling: sampling_params(&v), max_new_tokens: max_new_tokens(&v)?, max_tokens_cap })
}

/// The sampling keys of a generation config over vLLM's defaults.
fn sampling_params(v: &serde_json::Map<String, serde_json::Value>) -> SamplingParams {
    let mut p = SamplingParams::default();
    let f = |k: &str| v.get(k).and_then(|x| x.as_f64()).map(|x| x as f32);
    if let Some(t) = f("temperature") {
        p.temperature = t;
    }
    if let Some(t) = f("top_p") {
        p.top_p = t;
    }
    if let Some(t) = v.get("top_k").and_then(|x| x.as_u64()) {
        p.top_k = t as usize;
    }
    if let Some(t) = f("min_p") {
        p.min_p = t;
    }
    if let Some(t) = f("repetition_penalty") {
        p.repetition_penalty = t;
    }
    p
}

/// How a replica's model was sized: handed from replica 0 to the replicas rank 0 drives on other MPI ranks (`-dp`
/// over MPI). Their ranks hold the same shards on the same kind of device, so they take rank 0's sizing, as the
/// ranks of one replica take rank 0's KV block count.
#[derive(Debug, Clone)]
pub(crate) struct Sizing {
    budget: budget::KvBudget,
    weights_bytes: u64,
    dtype: candle_core::DType,
    kv_dtype: crate::backend::WeightDType,
}

/// Loads the model and starts the engine thread. Blocking; returns once requests can be submitted.
pub fn start(cfg: EngineConfig) -> Result<EngineHandle> {
    // Under `mpiexec` the other replicas' ranks wait for rank 0 to drive them: one engine alone would leave them
    // waiting forever, so a command that runs one engine refuses `-dp` there (serve and run-batch run them all).
    if distributed::replicas_over_mpi(&cfg)? {
        return Err(EngineError::InvalidArgument(format!(
            "--data-parallel-size {} under mpiexec: this command runs one engine; `rserve serve` and `rserve \
             run-batch` run the replicas",
            cfg.data_parallel_size
        )));
    }
    start_sized(cfg, None).map(|(handle, _)| handle)
}

/// `start`, returning how the model was sized; with `remote`, the engine of a `-dp` replica whose ranks are other
/// MPI processes (rank 0 loads no weights for it and opens no device: it schedules and samples).
/// The sizing is None for an encoder (no KV cache to size).
pub(crate) fn start_sized(cfg: EngineConfig, remote: Option<&Sizing>) -> Result<(EngineHandle, Option<Sizing>)> {
    // The engine's CPU work (weights upload, every step) runs on `--cpu-threads` threads, one per physical core by
    // default (a core's second hardware thread shares its FMA units and cache: it only adds contention), or on a
    // replica's share of the cores (`-dp` on the CPU). The engine loop itself runs inside the pool (`install`), so
    // each op's parallel loop starts on the calling worker and only wakes the others for the pieces they steal; from
    // a thread outside the pool every op would be a job handed to the pool and a blocking wait for it (a futex sleep
    // and wake per op, a few hundred a decode step).
    let threads = cfg.cpu_threads.unwrap_or_else(super::config::default_cpu_threads);
    let pool = Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(move |i| format!("rserve-cpu-{i}"))
            .build()
            .map_err(|e| EngineError::Backend(format!("cannot start {threads} CPU compute threads: {e}")))?,
    );
    pool.install(|| start_in(cfg, pool.clone(), remote))
}

fn start_in(
    cfg: EngineConfig,
    pool: Arc<rayon::ThreadPool>,
    remote: Option<&Sizing>,
) -> Result<(EngineHandle, Option<Sizing>)> {
    let role = distributed::role(&cfg)?;
    if role == Role::Worker {
        return Err(EngineError::InvalidArgument("start() runs on MPI rank 0; other ranks call run_if_worker".into()));
    }
    let device = match remote {
        None => {
            let phase = super::phase::Phase::start("Device ready");
            let device = Device::select_for(&cfg)?;
            phase.done(&cfg.device);
            Some(device)
        }
        Some(_) => None,
    };
    let kv_choice = cfg.kv_cache_dtype_choice()?;
    let opts = cfg.resolve_options();
    let resolved = match cfg.load_format.as_str() {
        "dummy" => crate::weights::dummy::resolve(&cfg.model).or_else(|_| resolve_model(&cfg.model, &opts))?,
        _ => resolve_model(&cfg.model, &opts)?,
    };
    if let Some(encoder) = super::start_encoder::encoder_params(&resolved)? {
        let Some(device) = device else {
            return Err(EngineError::InvalidArgument("an encoder runs in one process".into()));
        };
        let tokenizer = Arc::new(load_tokenizer(&cfg, &resolved, &opts)?);
        let handle = super::start_encoder::start_encoder(&cfg, pool, device, &resolved, encoder, tokenizer)?;
        return Ok((handle, None));
    }
    let params = resolved.load_params()?;
    distributed::check_split(&params, &cfg)?;
    let pooler = super::pooling_setup::pooler_for(&cfg, &resolved, &params)?.map(Arc::new);
    let gguf = matches!(resolved, ResolvedModel::Gguf(_));
    let dtype = match (&device, remote) {
        (Some(device), _) => cfg.dtype.resolve(device.is_host(), gguf, params.torch_dtype.as_deref()),
        (None, Some(sizing)) => sizing.dtype,
        (None, None) => return Err(EngineError::Backend("an engine needs a device or a remote replica".into())),
    };
    if let Some(device) = &device {
        let compute = crate::backend::WeightDType::from_candle(dtype).unwrap_or(crate::backend::WeightDType::F32);
        if let Some(kv) = kv_choice.filter(|&kv| kv != device.kv_cache_dtype(compute)) {
            return Err(EngineError::InvalidArgument(format!(
                "--kv-cache-dtype {} is not supported on {} with --dtype {}: its KV cache is the compute dtype (auto)",
                kv.as_str(),
                device.name(),
                compute.as_str()
            )));
        }
    }
    tracing::info!(
        "Resolved model {} -> {} ({:?}, {} layers, hidden {}, {} heads / {} KV heads), dtype={}",
        cfg.model,
        resolved.path().display(),
        params.architecture,
        params.num_layers,
        params.hidden_size,
        params.num_heads,
        params.num_kv_heads,
        dtype.as_str()
    );
    let tokenizer = Arc::new(load_tokenizer(&cfg, &resolved, &opts)?);
    let chat_template = load_chat_template(&cfg, &resolved, &tokenizer)?;
    if chat_template.is_none() {
        tracing::warn!("the model has no chat template: /v1/chat/completions will be refused (pass --chat-template)");
    }
    let generation = generation_defaults(&cfg, resolved.files().generation_config.as_deref())?;
    let sampling_defaults = generation.sampling.clone();
    let (mut runner, sizing) = match (device, remote) {
        (Some(device), _) => load_model(&cfg, role, device, &resolved, &params, dtype)?,
        (_, Some(sizing)) => {
            let runner = distributed::remote_runner(&cfg, params.vocab_size, sizing.budget.num_blocks)?;
            (runner, sizing.clone())
        }
        (None, None) => return Err(EngineError::Backend("an engine needs a device or a remote replica".into())),
    };
    let (plan, kv_dtype, weights_bytes) = (&sizing.budget, sizing.kv_dtype, sizing.weights_bytes);
    let device_name = runner.device_name();
    tracing::info!("Device: {device_name}");
    tracing::info!(
        "Available KV cache memory: {:.2} GiB ({} keys and values)",
        plan.kv_bytes as f64 / GIB,
        kv_dtype.as_str()
    );
    // vLLM's wording and number format: job scripts grep these two lines.
    tracing::info!("GPU KV cache size: {} tokens", with_thousands(plan.num_tokens(cfg.block_size)));
    tracing::info!(
        "Maximum concurrency for {} tokens per request: {:.2}x",
        with_thousands(plan.max_model_len),
        plan.max_concurrency(cfg.block_size)
    );

    let mut sched_cfg = SchedulerConfig::new(plan.num_blocks, plan.max_model_len);
    sched_cfg.block_size = cfg.block_size;
    sched_cfg.max_num_seqs = cfg.max_num_seqs;
    sched_cfg.max_num_batched_tokens =
        cfg.max_num_batched_tokens.unwrap_or(rserve_scheduler::DEFAULT_MAX_NUM_BATCHED_TOKENS);
    sched_cfg.enable_prefix_caching = cfg.enable_prefix_caching;
    sched_cfg.kv_groups = KvLayout::of(&params).groups;
    sched_cfg.prefill_limits = PrefillLimits::resolve(
        cfg.max_num_partial_prefills,
        cfg.max_long_partial_prefills,
        cfg.long_prefill_token_threshold,
        plan.max_model_len,
    )
    .map_err(|e| EngineError::InvalidArgument(e.to_string()))?;
    if sched_cfg.prefill_limits != PrefillLimits::NONE {
        let l = sched_cfg.prefill_limits;
        tracing::info!(
            "Partial prefills: at most {} per step, {} of them long (prompt above {} tokens); prefill chunks of at most {} tokens",
            l.max_num_partial_prefills.map_or("any".to_string(), |n| n.to_string()),
            l.max_long_partial_prefills.map_or("any".to_string(), |n| n.to_string()),
            l.long_prefill_token_threshold,
            l.long_prefill_token_threshold,
        );
    }
    let max_num_batched_tokens = sched_cfg.max_num_batched_tokens;
    let scheduler = Scheduler::new(sched_cfg).map_err(|e| EngineError::InvalidArgument(e.to_string()))?;
    // One-time costs (packing, first touches, graph capture) are paid here, before the server says it is ready.
    let phase = super::phase::Phase::start("Warm-up");
    let limits = super::warmup::WarmupLimits {
        block_size: cfg.block_size,
        max_model_len: plan.max_model_len,
        max_num_batched_tokens: scheduler.config().max_num_batched_tokens,
        vocab_size: params.vocab_size,
    };
    let warmed = super::warmup::warm_up(runner.as_mut(), scheduler.kv_cache(), limits)?;
    phase.done(&format!("{warmed} tokens through the model"));

    let mut eos: Vec<TokenId> = params.eos_token_ids.iter().copied().map(TokenId).collect();
    for id in tokenizer.eos_token_ids() {
        if !eos.contains(&id) {
            eos.push(id);
        }
    }
    let info = EngineInfo {
        model_path: resolved.path().display().to_string(),
        max_model_len: plan.max_model_len,
        vocab_size: params.vocab_size,
        block_size: cfg.block_size,
        num_kv_blocks: plan.num_blocks,
        kv_cache_bytes: plan.kv_bytes,
        weights_bytes,
        dtype: dtype.as_str().to_string(),
        device: device_name,
        max_num_seqs: cfg.max_num_seqs,
        eos_token_ids: eos.clone(),
        max_logprobs: cfg.max_logprobs.unwrap_or(params.vocab_size),
        default_max_tokens: generation.max_new_tokens,
        max_tokens_cap: generation.max_tokens_cap,
        pooling: pooler.as_ref().map(|p| p.info().clone()),
        max_num_batched_tokens,
    };
    let parts = EngineParts {
        scheduler,
        runner,
        tokenizer,
        chat_template,
        info,
        eos,
        sampling_defaults,
        pooler,
        num_blocks: plan.num_blocks,
    };
    let handle = spawn(&cfg, pool, parts)?;
    Ok((handle, Some(sizing)))
}

/// What a loaded engine is made of, handed to `spawn`.
pub(super) struct EngineParts {
    pub scheduler: Scheduler,
    pub runner: Box<dyn crate::runner::StepRunner>,
    pub tokenizer: Arc<Tokenizer>,
    pub chat_template: Option<ChatTemplate>,
    pub info: EngineInfo,
    pub eos: Vec<TokenId>,
    pub sampling_defaults: SamplingParams,
    pub pooler: Option<Arc<crate::pooling::Pooler>>,
    pub num_blocks: usize,
}

/// Starts the engine thread (and its metrics) over a loaded model, in `pool`.
pub(super) fn spawn(cfg: &EngineConfig, pool: Arc<rayon::ThreadPool>, parts: EngineParts) -> Result<EngineHandle> {
    let EngineParts { scheduler, runner, tokenizer, chat_template, info, eos, sampling_defaults, pooler, num_blocks } =
        parts;
    let setup = MetricsSetup {
        model_name: cfg.served_model_name.clone().unwrap_or_else(|| cfg.model.clone()),
        max_model_len: info.max_model_len,
        cache: CacheInfo {
            block_size: cfg.block_size,
            gpu_memory_utilization: cfg.gpu_memory_utilization,
            cache_dtype: cfg.kv_cache_dtype.clone(),
            enable_prefix_caching: cfg.enable_prefix_caching,
            num_gpu_blocks: num_blocks,
            kv_cache_memory_bytes: cfg.kv_cache_memory_bytes,
        },
        engine: cfg.data_parallel_rank,
    };
    let metrics = EngineMetrics::new(setup).map_err(|e| EngineError::Backend(format!("metrics: {e}")))?;
    let metrics = Arc::new(metrics);
    let (tx, rx) = std::sync::mpsc::channel();
    let mut engine = EngineLoop::new(scheduler, runner, tokenizer.clone(), metrics.clone(), eos, cfg.seed);
    engine.fail_after_requests = cfg.testing_fail_after_requests;
    engine.hooks = super::faults::StepHooks::new(cfg.testing_panic_in_step_after, cfg.testing_error_in_step_after);
    engine.max_request_time = cfg.max_request_time;
    engine.pooling = pooler.map(super::pool_step::PoolingState::new);
    if let Some(p) = &engine.pooling {
        tracing::info!(
            "Pooling model: {} pooling, {} values an embedding, no text generated",
            p.pooler.pooling_type().as_str(),
            p.pooler.info().embed_dim
        );
    }
    let dead = engine.dead.clone();
    let thread = std::thread::Builder::new()
        .name("rserve-engine".into())
        .spawn(move || pool.install(|| engine.run(rx)))
        .map_err(|e| EngineError::Backend(format!("cannot start the engine thread: {e}")))?;
    let handle = EngineHandle {
        tx,
        info: Arc::new(info),
        metrics,
        tokenizer,
        chat_template: chat_template.map(Arc::new),
        next_id: Arc::new(AtomicU64::new(1)),
        default_sampling: sampling_defaults,
        thread: Arc::new(std::sync::Mutex::new(Some(thread))),
        dead,
        grammars: Arc::default(),
    };
    handle.prepare_grammars();
    Ok(handle)
}

/// Loads this process's weights (rank 0's shard under MPI), sizes the KV cache and builds the runner on `device`.
fn load_model(
    cfg: &EngineConfig,
    role: Role,
    device: Device,
    resolved: &ResolvedModel,
    params: &crate::config::ModelParams,
    dtype: candle_core::DType,
) -> Result<(Box<dyn crate::runner::StepRunner>, Sizing)> {
    // On the CPU the KV budget is the host memory available before the weights take their share of it (as
    // `rserve plan` counts it); measured after loading, the weights would be subtracted twice.
    let host_available = match device.memory_bytes() {
        None if cfg.kv_cache_memory_bytes.is_none() => budget::host_available_bytes(),
        _ => None,
    };
    let t0 = Instant::now();
    let weights = match cfg.load_format.as_str() {
        "dummy" => crate::weights::dummy::dummy(params, dtype, cfg.seed)?,
        _ if role == Role::Leader => {
            // Rank 0 is TP rank 0 of stage 0; it reads only that shard.
            let shard = cfg.layout(0).shard(params)?;
            crate::weights::load_shard(resolved, params, dtype, &shard)?
        }
        // The CPU backend keeping GGUF blocks (its default) never reads an f32 copy of those tensors: none is made.
        _ if cfg.cpu_packed_weights && matches!(device, Device::Cpu(_)) => {
            crate::weights::load_packed(resolved, params, dtype)?
        }
        _ => crate::weights::load(resolved, params, dtype)?,
    };
    let weights_bytes = weights.total_bytes() as u64;
    tracing::info!(
        "Model weights: {:.4} GiB ({} tensors{}), loaded in {:.1} s",
        weights_bytes as f64 / GIB,
        weights.len(),
        if weights.is_cut() { ", rank 0's shard only" } else { "" },
        t0.elapsed().as_secs_f64()
    );

    // On a device, each MPI rank holds about 1 / (tp x pp) of the weights next to its KV blocks (host memory, on the
    // CPU, holds every rank's share at once).
    let ranks = (cfg.tensor_parallel_size * cfg.pipeline_parallel_size).max(1) as u64;
    let weights_here = match device.memory_bytes() {
        Some(_) if role == Role::Leader && !weights.is_cut() => weights_bytes.div_ceil(ranks),
        None if weights.is_cut() => weights_bytes * ranks,
        _ => weights_bytes,
    };
    let kv_dtype = device.kv_cache_dtype(weights.compute_dtype());
    let plan = budget::plan_with_host(
        host_available,
        params,
        kv_dtype.size_in_bytes(),
        cfg.block_size,
        cfg.max_model_len,
        cfg.kv_cache_memory_bytes,
        cfg.gpu_memory_utilization,
        weights_here,
        device.memory_bytes(),
        cfg.max_num_batched_tokens.unwrap_or(rserve_scheduler::DEFAULT_MAX_NUM_BATCHED_TOKENS),
    )?;
    let runner = match role {
        Role::Leader => distributed::leader_runner(device, params, &weights, cfg, plan.num_blocks)?,
        _ => {
            let opts = crate::runner::RunnerOptions {
                max_model_len: plan.max_model_len,
                max_num_seqs: cfg.max_num_seqs,
                enforce_eager: cfg.enforce_eager,
                profile: cfg.profile,
                async_scheduling: cfg.async_scheduling,
            };
            device.build_runner_with(params, &weights, plan.num_blocks, cfg.block_size, opts)?
        }
    };
    drop(weights);
    Ok((runner, Sizing { budget: plan, weights_bytes, dtype, kv_dtype }))
}

/// `93200` as `93,200`, the way vLLM writes token counts in its start-up lines.
fn with_thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{generation_defaults, EngineConfig};

    #[test]
    fn max_new_tokens_is_the_default_and_caps_only_from_an_override_or_a_folder() {
        let dir = std::env::temp_dir().join(format!("rserve-genconfig-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("generation_config.json");
        std::fs::write(&file, r#"{"temperature": 0.6, "max_new_tokens": 50}"#).expect("write");
        let mut cfg = EngineConfig::new("m");
        // The model's own file: a default, no cap.
        let g = generation_defaults(&cfg, Some(&file)).expect("reads");
        assert_eq!((g.max_new_tokens, g.max_tokens_cap, g.sampling.temperature), (Some(50), None, 0.6));
        // An override wins over the file and caps every request.
        cfg.override_generation_config = serde_json::from_str(r#"{"max_new_tokens": 8, "top_p": 0.5}"#).expect("json");
        let g = generation_defaults(&cfg, Some(&file)).expect("reads");
        assert_eq!((g.max_new_tokens, g.max_tokens_cap, g.sampling.top_p), (Some(8), Some(8), 0.5));
        // `--generation-config vllm`: no file, the override still applies.
        cfg.generation_config = "vllm".into();
        let g = generation_defaults(&cfg, Some(&file)).expect("reads");
        assert_eq!((g.max_new_tokens, g.max_tokens_cap, g.sampling.temperature), (Some(8), Some(8), 1.0));
        // A folder's max_new_tokens is a cap too (vLLM's rule), and a bad value is an error.
        cfg.generation_config = dir.display().to_string();
        cfg.override_generation_config = Default::default();
        let g = generation_defaults(&cfg, None).expect("reads");
        assert_eq!((g.max_new_tokens, g.max_tokens_cap), (Some(50), Some(50)));
        cfg.override_generation_config = serde_json::from_str(r#"{"max_new_tokens": 0}"#).expect("json");
        assert!(generation_defaults(&cfg, None).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn token_counts_are_written_with_thousands_separators() {
        let cases = [(0, "0"), (999, "999"), (1000, "1,000"), (93_200, "93,200"), (1_234_567, "1,234,567")];
        for (n, want) in cases {
            assert_eq!(super::with_thousands(n), want);
        }
    }
}
