//! `rserve bench serve`: a load generator for any OpenAI-compatible server, in the manner of `vllm bench serve`.
//!
//! Flow: resolve the model (`/v1/models`) and the tokenizer (local `--tokenizer` or the server's `/tokenize`),
//! build the prompts (`dataset`), send one test request, offer the load (`driver`: Poisson or immediate arrivals,
//! bounded concurrency, streaming requests timed chunk by chunk in `client`), aggregate (`metrics`, `stats`) and
//! report (`report`: a table on stdout, optionally a JSON file).

pub mod args;
pub mod arrival;
pub mod client;
pub mod dataset;
pub mod driver;
pub mod error;
pub mod metrics;
pub mod report;
pub mod sse;
pub mod stats;
pub mod tokenize;

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub use args::{DatasetName, ServeBenchArgs};
pub use error::BenchError;

use client::{ApiKind, Client, RequestSettings, RequestSpec};
use dataset::{RandomSpec, SampleRequest};
use driver::LoadShape;
use metrics::Slo;
use report::RunInfo;
use tokenize::BenchTokenizer;

/// Runs the benchmark the flags describe and prints its result.
pub fn run(args: ServeBenchArgs) -> Result<(), BenchError> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(BenchError::Runtime)?;
    runtime.block_on(run_async(args))
}

async fn run_async(args: ServeBenchArgs) -> Result<(), BenchError> {
    let slo = Slo::parse(&args.goodput).map_err(|m| BenchError::arg("--goodput", m))?;
    let percentiles = args.percentiles().map_err(|m| BenchError::arg("--metric-percentiles", m))?;
    if args.num_prompts == 0 {
        return Err(BenchError::arg("--num-prompts", "must be at least 1"));
    }
    if args.max_concurrency == Some(0) {
        return Err(BenchError::arg("--max-concurrency", "must be at least 1"));
    }
    if !(args.request_timeout > 0.0 && args.request_timeout.is_finite()) {
        return Err(BenchError::arg("--request-timeout", "must be a positive number of seconds"));
    }
    let base = args.base();
    let client = Client::new(&base, Duration::from_secs_f64(args.request_timeout))?;
    let model = match &args.model {
        Some(m) => m.clone(),
        None => client.first_model().await?,
    };
    let tok = match &args.tokenizer {
        Some(p) => BenchTokenizer::load_local(p)?,
        None => BenchTokenizer::Server(client.clone()),
    };
    eprintln!("Building {} prompts ({:?} dataset) for model {model} at {base}", args.num_prompts, args.dataset_name);
    let requests = match args.dataset_name {
        DatasetName::Random => {
            let spec = RandomSpec {
                input_len: args.random_input_len,
                output_len: args.random_output_len,
                range_ratio: args.random_range_ratio,
                num_prompts: args.num_prompts,
                seed: args.seed,
                vocab_size: args.random_vocab_size,
            };
            dataset::random_requests(&spec, &tok).await?
        }
        DatasetName::Sharegpt => {
            let path = args
                .dataset_path
                .as_ref()
                .ok_or_else(|| BenchError::arg("--dataset-path", "required for --dataset-name sharegpt"))?;
            dataset::sharegpt_requests(path, args.num_prompts, args.sharegpt_output_len, args.seed, &tok).await?
        }
    };
    let settings = RequestSettings {
        api: ApiKind::for_endpoint(&args.endpoint),
        api_url: client.url(&args.endpoint),
        model: model.clone(),
        ignore_eos: args.ignore_eos,
        temperature: args.temperature,
    };
    if !args.skip_initial_test {
        initial_test(&client, &settings, &requests[0]).await?;
    }
    let shape = LoadShape {
        request_rate: args.request_rate,
        max_concurrency: args.max_concurrency,
        seed: args.seed,
        show_progress: !args.no_progress,
    };
    eprintln!(
        "Traffic: request rate {}, max concurrency {}",
        if args.request_rate.as_f64().is_finite() { args.request_rate.as_f64().to_string() } else { "inf".into() },
        args.max_concurrency.map_or("unbounded".into(), |c| c.to_string())
    );
    let (outcomes, duration) = driver::run_load(&client, &settings, &requests, &shape).await;
    let count = |t: &str| tok.count_local(t);
    let m = metrics::compute(&outcomes, duration.as_secs_f64(), &slo, &percentiles, Some(&count));
    print!("{}", report::render_table(&m, args.max_concurrency, args.request_rate.as_f64()));
    if let Some(first) = outcomes.iter().find(|o| !o.success) {
        eprintln!("first error: {}", first.error);
    }
    if args.save_result || args.result_file.is_some() {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let date = report::utc_stamp(now);
        let info = RunInfo {
            date: date.clone(),
            base_url: base,
            endpoint: args.endpoint.clone(),
            model: model.clone(),
            dataset: format!("{:?}", args.dataset_name).to_lowercase(),
            num_prompts: args.num_prompts,
            request_rate: args.request_rate.as_f64(),
            max_concurrency: args.max_concurrency,
            ignore_eos: args.ignore_eos,
            seed: args.seed,
            random_input_len: (args.dataset_name == DatasetName::Random).then_some(args.random_input_len),
            random_output_len: (args.dataset_name == DatasetName::Random).then_some(args.random_output_len),
            random_range_ratio: (args.dataset_name == DatasetName::Random).then_some(args.random_range_ratio),
        };
        let path = args.result_file.clone().unwrap_or_else(|| {
            let safe: String =
                model.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
            PathBuf::from(format!("bench-serve-{safe}-{date}.json"))
        });
        let json = report::result_json(&info, &m, &outcomes, args.save_detailed);
        let text = serde_json::to_string_pretty(&json).unwrap_or_default();
        std::fs::write(&path, text).map_err(|source| BenchError::Io { path: path.clone(), source })?;
        eprintln!("Result written to {}", path.display());
    }
    Ok(())
}

/// Sends the first prompt once (vLLM's "initial single prompt test run") so that a wrong URL, model or flag fails
/// before the run; its timing is not counted.
async fn initial_test(client: &Client, s: &RequestSettings, first: &SampleRequest) -> Result<(), BenchError> {
    eprintln!("Starting initial single prompt test run...");
    let spec = RequestSpec {
        prompt: first.prompt.clone(),
        prompt_len: first.prompt_len,
        max_tokens: first.expected_output_len,
    };
    let out = client.stream_request(s, &spec, Instant::now()).await;
    if !out.success {
        return Err(BenchError::BadResponse {
            url: s.api_url.clone(),
            message: format!("initial test request failed: {}", out.error),
        });
    }
    eprintln!("Initial test run completed. Starting main benchmark run...");
    Ok(())
}
