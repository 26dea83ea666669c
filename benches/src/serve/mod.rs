//! `rserve bench serve`: a load generator for any OpenAI-compatible server, in the manner of `vllm bench serve`.
//!
//! Flags, defaults, printed summary and result JSON follow `vllm bench serve` (checked against
//! `tests/fixtures/vllm/bench_serve.json`). Flow: check the flags (`args*`), resolve the model (`/v1/models`) and the
//! tokenizer (local `--tokenizer` or the server's `/tokenize`), build the prompts (`prompts`: `dataset`, `sonnet`,
//! `custom`), optionally check readiness and warm up, offer the load (`driver`: gamma/Poisson or immediate arrivals
//! from `arrival`, bounded concurrency, streaming requests timed chunk by chunk in `client`), aggregate (`metrics`,
//! `peak`, `stats`) and report (`report`: vLLM's table on stdout; `result`: the JSON file).

pub mod args;
pub mod args_dataset;
pub mod args_unused;
pub mod arrival;
pub mod client;
pub mod custom;
pub mod dataset;
pub mod driver;
pub mod error;
pub mod metrics;
pub mod peak;
pub mod prompts;
pub mod report;
pub mod result;
pub mod sonnet;
pub mod sse;
pub mod stats;
pub mod tokenize;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rand::Rng;

pub use args::ServeBenchArgs;
pub use args_dataset::DatasetName;
pub use error::BenchError;

use args::{json_object, key_values, LoraAssignment, RampUpStrategy};
use arrival::{ArrivalShape, Ramp};
use client::{ApiKind, Client, RequestSettings, RequestSpec};
use driver::LoadShape;
use metrics::Slo;
use result::RunInfo;
use tokenize::BenchTokenizer;

/// Runs the benchmark the flags describe and prints its result.
pub fn run(args: ServeBenchArgs) -> Result<(), BenchError> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(BenchError::Runtime)?;
    runtime.block_on(run_async(args))
}

/// The API a `--backend` speaks (with `openai`/`vllm`, a chat `--endpoint` picks the chat API).
fn api_for(backend: &str, endpoint: &str) -> Result<ApiKind, BenchError> {
    match backend {
        "openai" | "vllm" => Ok(ApiKind::for_endpoint(endpoint)),
        "openai-chat" => Ok(ApiKind::Chat),
        other => Err(BenchError::arg(
            "--backend",
            format!("'{other}' is not supported (rserve bench serve speaks openai, vllm and openai-chat)"),
        )),
    }
}

/// The headers of every request: `Authorization: Bearer $OPENAI_API_KEY` when set, then `--header` (which wins).
fn headers(args: &ServeBenchArgs) -> Result<Vec<(String, String)>, BenchError> {
    let mut h: Vec<(String, String)> = Vec::new();
    if let Some(key) = std::env::var("OPENAI_API_KEY").ok().filter(|k| !k.is_empty()) {
        h.push(("Authorization".into(), format!("Bearer {key}")));
    }
    for (k, v) in key_values(&args.header).map_err(|m| BenchError::arg("--header", m))? {
        h.retain(|(old, _)| !old.eq_ignore_ascii_case(&k));
        h.push((k, v));
    }
    Ok(h)
}

fn arrival_shape(args: &ServeBenchArgs) -> Result<ArrivalShape, BenchError> {
    let ramp_up = match args.ramp_up_strategy {
        None => None,
        Some(strategy) => {
            if args.request_rate.as_f64().is_finite() {
                return Err(BenchError::arg("--request-rate", "cannot be given with --ramp-up-strategy"));
            }
            let (Some(start), Some(end)) = (args.ramp_up_start_rps, args.ramp_up_end_rps) else {
                return Err(BenchError::arg("--ramp-up-strategy", "needs --ramp-up-start-rps and --ramp-up-end-rps"));
            };
            if start > end {
                return Err(BenchError::arg("--ramp-up-start-rps", "must not exceed --ramp-up-end-rps"));
            }
            if strategy == RampUpStrategy::Exponential && start == 0 {
                return Err(BenchError::arg("--ramp-up-start-rps", "cannot be 0 for an exponential ramp-up"));
            }
            let ramp = match strategy {
                RampUpStrategy::Linear => Ramp::Linear,
                RampUpStrategy::Exponential => Ramp::Exponential,
            };
            Some((ramp, start as f64, end as f64))
        }
    };
    if args.burstiness.is_nan() || args.burstiness <= 0.0 {
        return Err(BenchError::arg("--burstiness", "must be positive"));
    }
    Ok(ArrivalShape { rate: args.request_rate, burstiness: args.burstiness, ramp_up })
}

async fn run_async(mut args: ServeBenchArgs) -> Result<(), BenchError> {
    for w in args.unused.warnings() {
        eprintln!("{w}");
    }
    let dataset_name = args.dataset.dataset_name;
    if let Some(why) = dataset_name.unsupported() {
        return Err(BenchError::arg("--dataset-name", format!("{}: {why}", dataset_name.name())));
    }
    if args.unused.self_timed || args.unused.no_self_timed {
        return Err(BenchError::arg("--self-timed", "applies to --dataset-name timed_trace only"));
    }
    let slo = Slo::parse(&args.goodput).map_err(|m| BenchError::arg("--goodput", m))?;
    let percentiles = args.percentiles().map_err(|m| BenchError::arg("--metric-percentiles", m))?;
    let selected = report::parse_percentile_metrics(
        args.percentile_metrics.as_deref().unwrap_or(report::DEFAULT_PERCENTILE_METRICS),
    )
    .map_err(|m| BenchError::arg("--percentile-metrics", m))?;
    let metadata = key_values(&args.metadata).map_err(|m| BenchError::arg("--metadata", m))?;
    if args.num_prompts == 0 {
        return Err(BenchError::arg("--num-prompts", "must be at least 1"));
    }
    if args.max_concurrency == Some(0) {
        return Err(BenchError::arg("--max-concurrency", "must be greater than 0"));
    }
    if !(args.request_timeout > 0.0 && args.request_timeout.is_finite()) {
        return Err(BenchError::arg("--request-timeout", "must be a positive number of seconds"));
    }
    let arrivals = arrival_shape(&args)?;
    let api = api_for(&args.backend, &args.endpoint)?;
    // vLLM: the random dataset always ignores EOS, so every request generates its full output length.
    if args.dataset.dataset_name == DatasetName::Random {
        args.ignore_eos = true;
    }
    let mut extra_body = args.sampling.body_fields();
    if let Some(t) = &args.extra_body {
        extra_body.extend(json_object(t).map_err(|m| BenchError::arg("--extra-body", m))?);
    }
    if args.sampling.temperature.is_none() {
        eprintln!(
            "WARNING: rserve bench serve (like vllm bench serve) does not set temperature==0 (greedy) in requests by \
             default. The default is the server's. For greedy decoding, include --temperature=0."
        );
    }
    let base = args.base();
    let client = Client::with_headers(&base, Duration::from_secs_f64(args.request_timeout), &headers(&args)?)?;
    let (model_id, model_name) = match &args.model {
        Some(m) => (m.clone(), args.served_model_name.clone().unwrap_or_else(|| m.clone())),
        None => {
            eprintln!("Model not specified, fetching first model from server...");
            let m = client.first_model().await?;
            eprintln!("First model name: {m}, first model id: {m}");
            (m.clone(), m)
        }
    };
    let tok = match &args.tokenizer {
        Some(p) => BenchTokenizer::load_local(p)?,
        None => BenchTokenizer::Server(client.clone()),
    };
    let tokenizer_id = args.tokenizer.as_ref().map_or(model_id.clone(), |p| p.display().to_string());
    let dataset_name = dataset_name.name();
    eprintln!("Building {} prompts ({dataset_name} dataset) for model {model_id} at {base}", args.num_prompts);
    let requests = prompts::build(&args, api, &tok).await?;
    let prefix =
        args.request_id_prefix.clone().unwrap_or_else(|| format!("bench-{:08x}-", rand::thread_rng().gen::<u32>()));
    let mut rng = rand::thread_rng();
    let specs: Vec<RequestSpec> = requests
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let model = match (args.lora_modules.is_empty(), args.lora_assignment) {
                (true, _) => model_name.clone(),
                (false, LoraAssignment::RoundRobin) => args.lora_modules[i % args.lora_modules.len()].clone(),
                (false, LoraAssignment::Random) => args.lora_modules[rng.gen_range(0..args.lora_modules.len())].clone(),
            };
            RequestSpec {
                prompt: r.prompt.clone(),
                prompt_len: r.prompt_len,
                max_tokens: r.expected_output_len,
                model,
                request_id: Some(format!("{prefix}{i}")),
            }
        })
        .collect();
    let Some(first) = specs.first().cloned() else {
        return Err(BenchError::arg("--dataset-path", "the dataset gave no prompts"));
    };
    let settings = RequestSettings {
        api,
        api_url: client.url(&args.endpoint),
        ignore_eos: args.ignore_eos,
        logprobs: args.logprobs,
        extra_body,
    };
    let test = RequestSpec { model: model_name.clone(), ..first };
    if args.ready_check_timeout_sec > 0 {
        ready_check(&client, &settings, &test, Duration::from_secs(args.ready_check_timeout_sec)).await?;
    } else {
        eprintln!("Skipping endpoint ready check.");
    }
    if args.num_warmups > 0 {
        eprintln!("Warming up with {} requests...", args.num_warmups);
        driver::warm_up(&client, &settings, &test, args.num_warmups, args.max_concurrency).await;
        eprintln!("Warmup run completed.");
    }
    eprintln!("Starting main benchmark run...");
    if args.profile {
        eprintln!("Starting profiler...");
        if client.post_empty("/start_profile").await {
            eprintln!("Profiler started");
        }
    }
    let rate = args.request_rate.as_f64();
    match args.ramp_up_strategy {
        Some(s) => eprintln!(
            "Traffic ramp-up strategy: {}.\nWill increase RPS from {} to {} RPS over the duration of the benchmark.",
            s.name(),
            args.ramp_up_start_rps.unwrap_or(0),
            args.ramp_up_end_rps.unwrap_or(0)
        ),
        None => eprintln!("Traffic request rate: {}", result::py_float(rate)),
    }
    let distribution = if args.burstiness == 1.0 { "Poisson process" } else { "Gamma distribution" };
    eprintln!("Burstiness factor: {} ({distribution})", result::py_float(args.burstiness));
    eprintln!("Maximum request concurrency: {}", args.max_concurrency.map_or("None".into(), |c| c.to_string()));
    let shape = LoadShape {
        arrivals,
        max_concurrency: args.max_concurrency,
        seed: args.seed,
        show_progress: !args.disable_tqdm,
    };
    let (outcomes, duration) = driver::run_load(&client, &settings, &specs, &shape).await?;
    let count = |t: &str| tok.count_local(t);
    let m = metrics::compute(&outcomes, duration.as_secs_f64(), &slo, &percentiles, Some(&count));
    let failed: Vec<_> = outcomes.iter().filter(|o| !o.success).collect();
    if !failed.is_empty() {
        println!("Failed requests during benchmark run detected (capping to 10):");
        for (i, o) in failed.iter().take(10).enumerate() {
            println!("Error {i}: {}", o.error);
        }
    }
    let rows = report::metric_rows(&m, &selected, args.max_concurrency, rate.is_finite());
    print!("{}", report::render_table(&m, &rows, args.max_concurrency, rate));
    if args.profile {
        eprintln!("Stopping profiler...");
        if client.post_empty("/stop_profile").await {
            eprintln!("Profiler stopped");
        }
    }
    if args.save_result || args.append_result || args.result_file.is_some() {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let info = RunInfo {
            date: result::utc_stamp(now),
            backend: args.backend.clone(),
            label: args.label.clone(),
            model_id,
            tokenizer_id,
            num_prompts: args.num_prompts,
            metadata,
            request_rate: rate,
            burstiness: args.burstiness,
            max_concurrency: args.max_concurrency,
            ramp_up: args
                .ramp_up_strategy
                .map(|s| (s.name(), args.ramp_up_start_rps.unwrap_or(0), args.ramp_up_end_rps.unwrap_or(0))),
        };
        let path = match &args.result_file {
            Some(p) => p.clone(),
            None => result::result_path(&info, args.result_dir.as_deref(), args.result_filename.as_deref()),
        };
        let json = result::result_json(&info, &m, &rows, &outcomes, args.save_detailed);
        result::write_result(&path, &json, args.append_result)?;
        eprintln!("Result written to {}", path.display());
    }
    Ok(())
}

/// vLLM's ready check: sends the first prompt until it succeeds or `timeout` passes, so that a wrong URL, model or
/// flag fails before the run; its timing is not counted.
async fn ready_check(
    client: &Client,
    s: &RequestSettings,
    test: &RequestSpec,
    timeout: Duration,
) -> Result<(), BenchError> {
    eprintln!("Starting initial single prompt test run...");
    let deadline = Instant::now() + timeout;
    loop {
        let out = client.stream_request(s, test, Instant::now()).await;
        if out.success {
            eprintln!("Initial test run completed.");
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(BenchError::BadResponse {
                url: s.api_url.clone(),
                message: format!(
                    "Initial test run failed - Please make sure benchmark arguments are correctly specified. Error: {}",
                    out.error
                ),
            });
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
