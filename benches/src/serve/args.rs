//! The flags of `rserve bench serve` (named like `vllm bench serve`'s).

use std::path::PathBuf;

use clap::{Args, ValueEnum};

use super::arrival::RequestRate;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DatasetName {
    /// Random token ids of `--random-input-len` tokens (see `--random-range-ratio`).
    Random,
    /// A ShareGPT-format JSON file (`--dataset-path`).
    Sharegpt,
}

/// `rserve bench serve`: a load generator for any OpenAI-compatible server.
#[derive(Debug, Clone, Args)]
pub struct ServeBenchArgs {
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
    /// Model name sent in requests (default: the first model of /v1/models).
    #[arg(long)]
    pub model: Option<String>,
    #[arg(long, value_enum, default_value_t = DatasetName::Random)]
    pub dataset_name: DatasetName,
    /// ShareGPT JSON file for --dataset-name sharegpt.
    #[arg(long)]
    pub dataset_path: Option<PathBuf>,
    /// Local tokenizer (.gguf, tokenizer.json or a folder with one) used to build prompts and count tokens;
    /// without it the server's /tokenize and /detokenize are used.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    #[arg(long, default_value_t = 1024)]
    pub random_input_len: usize,
    #[arg(long, default_value_t = 128)]
    pub random_output_len: usize,
    /// Lengths are drawn uniformly from [len * (1 - r), len * (1 + r)].
    #[arg(long, default_value_t = 0.0)]
    pub random_range_ratio: f64,
    /// Draw random prompt ids below this id (default: the local tokenizer's vocabulary without special tokens, or
    /// ids 1000..32000 with server-side tokenization).
    #[arg(long)]
    pub random_vocab_size: Option<usize>,
    /// Output length for ShareGPT prompts (default: the length of the recorded reply).
    #[arg(long)]
    pub sharegpt_output_len: Option<usize>,
    #[arg(long, default_value_t = 1000)]
    pub num_prompts: usize,
    /// Requests per second (Poisson arrivals), or inf to send all at once.
    #[arg(long, default_value = "inf", value_parser = RequestRate::parse)]
    pub request_rate: RequestRate,
    /// At most this many requests in flight.
    #[arg(long)]
    pub max_concurrency: Option<usize>,
    /// Ask the server to ignore end-of-sequence tokens (so every request generates its full output length).
    #[arg(long)]
    pub ignore_eos: bool,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
    /// SLOs for goodput in milliseconds, e.g. --goodput ttft:200 tpot:50 (metrics: ttft, tpot, e2el).
    #[arg(long, num_args = 1..)]
    pub goodput: Vec<String>,
    /// Comma-separated percentiles to report.
    #[arg(long, default_value = "99")]
    pub metric_percentiles: String,
    /// Write the result as JSON (to --result-file, or bench-serve-<model>-<date>.json).
    #[arg(long)]
    pub save_result: bool,
    /// Where to write the JSON result (implies --save-result).
    #[arg(long)]
    pub result_file: Option<PathBuf>,
    /// Also save per-request lengths, TTFTs, ITLs, texts and errors.
    #[arg(long)]
    pub save_detailed: bool,
    /// Seconds each request may take.
    #[arg(long, default_value_t = 600.0)]
    pub request_timeout: f64,
    /// Skip the single test request sent before the run.
    #[arg(long)]
    pub skip_initial_test: bool,
    /// Hide the progress bar.
    #[arg(long, alias = "disable-tqdm")]
    pub no_progress: bool,
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
