//! The flags of `rserve bench serve`: `vllm bench serve`'s names, defaults and meanings (vLLM 0.34.0, checked
//! against `tests/fixtures/vllm/bench_serve.json`), so that a vLLM benchmark command line runs with only the binary
//! name changed. Flags that only make sense for vLLM's own engine or datasets are in [`super::args_unused`]; the
//! dataset flags are in [`super::args_dataset`]. The few rserve-only flags say so in their help.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

use super::args_dataset::DatasetArgs;
use super::args_unused::UnusedArgs;
use super::arrival::RequestRate;

/// `--lora-assignment`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LoraAssignment {
    Random,
    RoundRobin,
}

/// `--ramp-up-strategy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RampUpStrategy {
    Linear,
    Exponential,
}

impl RampUpStrategy {
    pub fn name(self) -> &'static str {
        match self {
            RampUpStrategy::Linear => "linear",
            RampUpStrategy::Exponential => "exponential",
        }
    }
}

/// `rserve bench serve`: a load generator for any OpenAI-compatible server.
#[derive(Debug, Clone, Args)]
pub struct ServeBenchArgs {
    /// Prefix of the result file name and the result's "label" (default: --backend).
    #[arg(long)]
    pub label: Option<String>,
    /// openai / vllm (completions API) or openai-chat (chat completions API). With openai, an --endpoint ending in
    /// chat/completions also speaks the chat API (rserve extension).
    #[arg(long, default_value = "openai")]
    pub backend: String,
    /// Server URL, e.g. http://127.0.0.1:8000 (overrides --host/--port).
    #[arg(long)]
    pub base_url: Option<String>,
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// API path: /v1/completions or /v1/chat/completions.
    #[arg(long, default_value = "/v1/completions")]
    pub endpoint: String,
    /// KEY=VALUE headers sent with every request (after the OPENAI_API_KEY bearer token, so they override it).
    #[arg(long, num_args = 0.., value_name = "KEY=VALUE")]
    pub header: Vec<String>,
    /// At most this many requests in flight.
    #[arg(long)]
    pub max_concurrency: Option<usize>,
    /// Model id (default: the first model of /v1/models).
    #[arg(long)]
    pub model: Option<String>,
    /// Sets --random-input-len.
    #[arg(long)]
    pub input_len: Option<usize>,
    /// Sets --random-output-len, --sharegpt-output-len and --custom-output-len.
    #[arg(long)]
    pub output_len: Option<usize>,
    /// Local tokenizer (.gguf, tokenizer.json or a folder with one) used to build prompts and count tokens;
    /// without it the server's /tokenize and /detokenize are used (vLLM takes a Hugging Face name here too).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Log-probs per token to request (sent only when given).
    #[arg(long)]
    pub logprobs: Option<u32>,
    /// Requests per second (Poisson or gamma arrivals), or inf to send all at once.
    #[arg(long, default_value = "inf", value_parser = RequestRate::parse)]
    pub request_rate: RequestRate,
    /// Gamma shape of the arrival gaps: 1 is a Poisson process, below 1 burstier, above 1 more uniform.
    #[arg(long, default_value_t = 1.0)]
    pub burstiness: f64,
    /// Hide the progress bar.
    #[arg(long, alias = "no-progress")]
    pub disable_tqdm: bool,
    /// Requests (copies of the first prompt) sent before the timed run.
    #[arg(long, default_value_t = 0)]
    pub num_warmups: usize,
    /// POST /start_profile before and /stop_profile after the run.
    #[arg(long)]
    pub profile: bool,
    /// Write the result JSON (see --result-dir, --result-filename).
    #[arg(long)]
    pub save_result: bool,
    /// Also save per-request lengths, TTFTs, ITLs, start times, texts and errors.
    #[arg(long)]
    pub save_detailed: bool,
    /// Append the result as one more JSON line to the result file.
    #[arg(long)]
    pub append_result: bool,
    /// KEY=VALUE pairs stored in the result JSON.
    #[arg(long, num_args = 0.., value_name = "KEY=VALUE")]
    pub metadata: Vec<String>,
    /// Folder for the result file (created if missing).
    #[arg(long)]
    pub result_dir: Option<PathBuf>,
    /// Result file name (default: {label}-{rate}qps[-concurrency{n}]-{model}-{date}.json).
    #[arg(long)]
    pub result_filename: Option<String>,
    /// rserve's older spelling: the result path; implies --save-result.
    #[arg(long, hide = true)]
    pub result_file: Option<PathBuf>,
    /// Ask the server to ignore end-of-sequence tokens (always on for --dataset-name random, as in vLLM).
    #[arg(long)]
    pub ignore_eos: bool,
    /// Comma-separated metrics to report percentiles of: ttft, tpot, itl, e2el, client_queue_time,
    /// e2el_including_client_queue (default ttft,tpot,itl).
    #[arg(long)]
    pub percentile_metrics: Option<String>,
    /// Comma-separated percentiles to report.
    #[arg(long, default_value = "99")]
    pub metric_percentiles: String,
    /// SLOs for goodput in milliseconds, e.g. --goodput ttft:200 tpot:50 (metrics: ttft, tpot, e2el).
    #[arg(long, num_args = 1..)]
    pub goodput: Vec<String>,
    /// Prefix of each request's x-request-id header (default bench-<8 hex digits>-).
    #[arg(long)]
    pub request_id_prefix: Option<String>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Model name sent in requests when --model is given (default: --model).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Model names (LoRA adapters) to spread the requests over.
    #[arg(long, num_args = 1..)]
    pub lora_modules: Vec<String>,
    #[arg(long, value_enum, default_value_t = LoraAssignment::Random)]
    pub lora_assignment: LoraAssignment,
    /// Raise the request rate from --ramp-up-start-rps to --ramp-up-end-rps over the run.
    #[arg(long, value_enum)]
    pub ramp_up_strategy: Option<RampUpStrategy>,
    #[arg(long)]
    pub ramp_up_start_rps: Option<u64>,
    #[arg(long)]
    pub ramp_up_end_rps: Option<u64>,
    /// Wait up to this many seconds for a first test request to succeed before the run (0: no test request).
    #[arg(long, default_value_t = 0)]
    pub ready_check_timeout_sec: u64,
    /// JSON object of variables for the chat template when prompts are rendered here (custom, sonnet).
    #[arg(long)]
    pub chat_template_kwargs: Option<String>,
    /// JSON object merged into every request body (after the sampling flags).
    #[arg(long)]
    pub extra_body: Option<String>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[arg(long, default_value_t = 1000)]
    pub num_prompts: usize,
    #[command(flatten)]
    pub dataset: DatasetArgs,
    #[command(flatten)]
    pub unused: UnusedArgs,
    /// rserve only: seconds each request may take.
    #[arg(long, default_value_t = 600.0)]
    pub request_timeout: f64,
    /// rserve's older flag: no test request is sent unless --ready-check-timeout-sec is given (as in vLLM).
    #[arg(long, hide = true)]
    pub skip_initial_test: bool,
}

/// Sampling flags: each is sent only when given, so the server's defaults apply otherwise (vLLM's behaviour).
#[derive(Debug, Clone, Default, Args)]
pub struct SamplingArgs {
    #[arg(long)]
    pub top_p: Option<f64>,
    #[arg(long)]
    pub top_k: Option<i64>,
    #[arg(long)]
    pub min_p: Option<f64>,
    #[arg(long)]
    pub temperature: Option<f64>,
    #[arg(long)]
    pub frequency_penalty: Option<f64>,
    #[arg(long)]
    pub presence_penalty: Option<f64>,
    #[arg(long)]
    pub repetition_penalty: Option<f64>,
}

impl SamplingArgs {
    /// The given sampling parameters as request-body fields.
    pub fn body_fields(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut m = serde_json::Map::new();
        let floats = [
            ("top_p", self.top_p),
            ("min_p", self.min_p),
            ("temperature", self.temperature),
            ("frequency_penalty", self.frequency_penalty),
            ("presence_penalty", self.presence_penalty),
            ("repetition_penalty", self.repetition_penalty),
        ];
        for (k, v) in floats {
            if let Some(v) = v {
                m.insert(k.into(), serde_json::json!(v));
            }
        }
        if let Some(k) = self.top_k {
            m.insert("top_k".into(), serde_json::json!(k));
        }
        m
    }
}

impl ServeBenchArgs {
    /// The server's base URL.
    pub fn base(&self) -> String {
        match &self.base_url {
            Some(u) => u.trim_end_matches('/').to_owned(),
            None => format!("http://{}:{}", self.host, self.port),
        }
    }

    /// Parses `--metric-percentiles`.
    pub fn percentiles(&self) -> Result<Vec<f64>, String> {
        self.metric_percentiles
            .split(',')
            .map(|p| {
                p.trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|v| (0.0..=100.0).contains(v))
                    .ok_or_else(|| format!("'{p}' is not a percentile between 0 and 100"))
            })
            .collect()
    }
}

/// Parses `KEY=VALUE` items (`--header`, `--metadata`); key and value are trimmed.
pub fn key_values(items: &[String]) -> Result<Vec<(String, String)>, String> {
    items
        .iter()
        .map(|item| {
            item.split_once('=')
                .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                .ok_or_else(|| format!("'{item}' is not KEY=VALUE"))
        })
        .collect()
}

/// Parses a flag's JSON object (`--extra-body`, `--chat-template-kwargs`).
pub fn json_object(text: &str) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Object(m)) => Ok(m),
        Ok(other) => Err(format!("must be a JSON object, not {other}")),
        Err(e) => Err(format!("not JSON: {e}")),
    }
}
