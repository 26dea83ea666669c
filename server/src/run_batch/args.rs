//! `rserve run-batch`'s command line, as `vllm run-batch` takes it: `-i/--input-file`, `-o/--output-file`,
//! `--output-tmp-dir`, the Prometheus flags (`--enable-metrics`, `--url`, `--port`), and every engine flag of
//! `serve` (the same `EngineArgs`, flattened). vLLM's run-batch flags rserve has no use for (`--response-role`,
//! `--max-log-len`, the usage flags) are classified in `cli::vllm_flags` like `serve`'s and dropped there with a
//! warning.

use std::path::PathBuf;

use clap::Args;

use crate::cli::{CliError, EngineArgs, Notice};

#[derive(Debug, Clone, Args)]
#[command(args_override_self = true)]
pub struct RunBatchArgs {
    /// The model: a Hugging Face repo id, a local model folder, or a .gguf file (or --model MODEL).
    #[arg(value_name = "MODEL_TAG")]
    pub model_tag: Option<String>,
    /// The batch input: a JSONL file of OpenAI batch requests, `-` for stdin, or an http(s):// URL read with GET.
    #[arg(short = 'i', long, value_name = "FILE|-|URL")]
    pub input_file: String,
    /// The batch output (JSONL). An existing file is resumed: the custom_ids already in it are skipped and new
    /// lines appended; delete it to start over.
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output_file: String,
    /// vLLM's folder for an output uploaded to a URL; rserve writes local files only, so it is not used.
    #[arg(long, value_name = "DIR")]
    pub output_tmp_dir: Option<PathBuf>,
    /// Read flags from a YAML file (keys are flag names without `--`); flags on the command line win over it.
    #[arg(long, value_name = "FILE.yaml")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Serve the engine's Prometheus metrics at http://URL:PORT/metrics while the batch runs.
    #[arg(long, help_heading = "Metrics")]
    pub enable_metrics: bool,
    /// The address of the metrics server (with --enable-metrics).
    #[arg(long, default_value = "0.0.0.0", help_heading = "Metrics")]
    pub url: String,
    /// The port of the metrics server (with --enable-metrics).
    #[arg(long, default_value_t = 8000, help_heading = "Metrics")]
    pub port: u16,
    /// Do not log the periodic throughput line (logged when stderr is not a terminal; a terminal shows the bar).
    #[arg(long)]
    pub disable_log_stats: bool,
    /// Log one line per request sent to the engine.
    #[arg(long)]
    pub enable_log_requests: bool,
    /// Log level (default: VLLM_LOGGING_LEVEL, else INFO; RUST_LOG overrides both).
    #[arg(long, ignore_case = true, value_parser = ["CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG", "NOTSET"])]
    pub log_level: Option<String>,
    /// The vLLM flags accepted without effect (logged at start-up).
    #[arg(skip)]
    pub notices: Vec<Notice>,
}

/// A run-batch flag value rserve cannot honour.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RunBatchArgError {
    #[error(transparent)]
    Cli(#[from] CliError),
    #[error(
        "--output-file {0}: rserve run-batch writes a local file only (vLLM's upload by HTTP PUT is not \
         implemented); write to a file and upload it yourself"
    )]
    OutputUrl(String),
    #[error("--output-file must name a file; `-` (stdout) cannot be resumed")]
    OutputStdout,
}

impl RunBatchArgs {
    /// The model from the positional argument or `--model`.
    pub fn model(&self) -> Result<String, CliError> {
        self.engine.resolve_model(self.model_tag.as_deref())
    }

    /// Served names: `--served-model-name`, else the model argument (as `serve`).
    pub fn served_model_names(&self, model: &str) -> Result<Vec<String>, CliError> {
        let names = &self.engine.model.served_model_name;
        if names.iter().any(|n| n.is_empty()) {
            return Err(CliError::EmptyServedName);
        }
        Ok(if names.is_empty() { vec![model.to_owned()] } else { names.clone() })
    }

    /// `--output-file`, checked: a local path.
    pub fn output_path(&self) -> Result<PathBuf, RunBatchArgError> {
        let o = self.output_file.as_str();
        if o.starts_with("http://") || o.starts_with("https://") {
            return Err(RunBatchArgError::OutputUrl(o.to_owned()));
        }
        if o == "-" {
            return Err(RunBatchArgError::OutputStdout);
        }
        Ok(PathBuf::from(o))
    }
}

#[cfg(test)]
mod tests {
    use crate::cli::{parse_from, Command};

    fn parse(line: &str) -> super::RunBatchArgs {
        let args = line.split_whitespace().map(Into::into).collect();
        match parse_from(args).expect("parses").command {
            Command::RunBatch(a) => a,
            other => panic!("not run-batch: {other:?}"),
        }
    }

    #[test]
    fn takes_vllm_run_batch_flags_and_serve_engine_flags() {
        let a = parse("rserve run-batch -i in.jsonl -o out.jsonl m.gguf --max_num_seqs 8 -tp 1 --dtype float32");
        assert_eq!(a.input_file, "in.jsonl");
        assert_eq!(a.output_file, "out.jsonl");
        assert_eq!(a.model().unwrap(), "m.gguf");
        assert_eq!(a.engine.scheduler.max_num_seqs, 8);
        let a = parse("rserve run-batch --input-file - --output-file o --model m --enable-metrics --port 9000 --enable-log-requests");
        assert_eq!(a.model().unwrap(), "m");
        assert!(a.enable_log_requests);
        assert!(a.enable_metrics);
        assert_eq!(a.port, 9000);
    }

    #[test]
    fn vllm_flags_without_effect_are_noted() {
        let a = parse("rserve run-batch -i a -o b m --response-role assistant --max-log-len 10");
        let flags: Vec<_> = a.notices.iter().map(|n| n.flag.as_str()).collect();
        assert_eq!(flags, ["--response-role", "--max-log-len"]);
    }

    #[test]
    fn output_must_be_a_local_file() {
        assert!(parse("rserve run-batch -i a -o https://x/y m").output_path().is_err());
        assert!(parse("rserve run-batch -i a -o - m").output_path().is_err());
        assert!(parse("rserve run-batch -i a -o out.jsonl m").output_path().is_ok());
    }
}
