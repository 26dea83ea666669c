//! `vllm bench serve` flags that do not apply to `rserve bench serve` against an OpenAI-compatible HTTP server:
//! accepted so that a vLLM command line parses, and named in one warning each when given ([`UnusedArgs::warnings`]).
//! Each is kept as the text given (or a switch), never interpreted.

use clap::Args;

/// Flags accepted and ignored (help hidden; see `vllm bench serve --help`).
#[derive(Debug, Clone, Default, Args)]
pub struct UnusedArgs {
    #[arg(long, hide = true)]
    pub tokenizer_mode: Option<String>,
    #[arg(long, hide = true)]
    pub use_beam_search: bool,
    #[arg(long, hide = true)]
    pub probe_request_rate: Option<String>,
    #[arg(long, hide = true)]
    pub skip_tokenizer_init: bool,
    #[arg(long, hide = true)]
    pub insecure: bool,
    #[arg(long, hide = true)]
    pub plot_timeline: bool,
    #[arg(long, hide = true)]
    pub timeline_itl_thresholds: Option<String>,
    #[arg(long, hide = true)]
    pub plot_dataset_stats: bool,
    #[arg(long, hide = true)]
    pub trust_remote_code: bool,
    #[arg(long, hide = true)]
    pub self_timed: bool,
    #[arg(long, hide = true)]
    pub no_self_timed: bool,
    #[arg(long, hide = true)]
    pub no_stream: bool,
    #[arg(long, hide = true)]
    pub enable_multimodal_chat: bool,
    #[arg(long, hide = true)]
    pub custom_ensure_client_side_data: bool,
    #[arg(long, hide = true)]
    pub spec_bench_output_len: Option<String>,
    #[arg(long, hide = true)]
    pub spec_bench_category: Option<String>,
    #[arg(long, hide = true)]
    pub timed_trace_chunk_hash_size: Option<String>,
    #[arg(long, hide = true)]
    pub timed_trace_sec_multiplier: Option<String>,
    #[arg(long, hide = true)]
    pub timed_trace_label_timestamp: Option<String>,
    #[arg(long, hide = true)]
    pub timed_trace_label_input_length: Option<String>,
    #[arg(long, hide = true)]
    pub timed_trace_label_output_length: Option<String>,
    #[arg(long, hide = true)]
    pub timed_trace_label_hash_ids: Option<String>,
    #[arg(long, hide = true)]
    pub blazedit_min_distance: Option<String>,
    #[arg(long, hide = true)]
    pub blazedit_max_distance: Option<String>,
    #[arg(long, hide = true)]
    pub asr_max_audio_len_sec: Option<String>,
    #[arg(long, hide = true)]
    pub asr_min_audio_len_sec: Option<String>,
    #[arg(long, hide = true)]
    pub hf_subset: Option<String>,
    #[arg(long, hide = true)]
    pub hf_split: Option<String>,
    #[arg(long, hide = true)]
    pub hf_name: Option<String>,
    #[arg(long, hide = true)]
    pub hf_output_len: Option<String>,
    #[arg(long, hide = true)]
    pub bfcl_categories: Option<String>,
    #[arg(long, hide = true)]
    pub prefix_repetition_prefix_len: Option<String>,
    #[arg(long, hide = true)]
    pub prefix_repetition_suffix_len: Option<String>,
    #[arg(long, hide = true)]
    pub prefix_repetition_num_prefixes: Option<String>,
    #[arg(long, hide = true)]
    pub prefix_repetition_output_len: Option<String>,
    #[arg(long, hide = true)]
    pub speed_bench_dataset_subset: Option<String>,
    #[arg(long, hide = true)]
    pub speed_bench_output_len: Option<String>,
    #[arg(long, hide = true)]
    pub speed_bench_category: Option<String>,
    #[arg(long, hide = true)]
    pub random_batch_size: Option<String>,
    #[arg(long, hide = true)]
    pub no_reranker: bool,
    #[arg(long, hide = true)]
    pub random_mm_base_items_per_request: Option<String>,
    #[arg(long, hide = true)]
    pub random_mm_num_mm_items_range_ratio: Option<String>,
    #[arg(long, hide = true)]
    pub random_mm_limit_mm_per_prompt: Option<String>,
    #[arg(long, hide = true)]
    pub random_mm_bucket_config: Option<String>,
}

const ONLY_UNSUPPORTED_DATASETS: &str = "it belongs to a dataset rserve bench serve does not build";

impl UnusedArgs {
    /// One line per flag given: `warning: --FLAG is ignored: WHY`.
    pub fn warnings(&self) -> Vec<String> {
        let switches = [
            ("--use-beam-search", self.use_beam_search, "beam search is not part of the OpenAI API rserve serves"),
            (
                "--skip-tokenizer-init",
                self.skip_tokenizer_init,
                "prompt lengths need a tokenizer (the local --tokenizer or the server's /tokenize)",
            ),
            ("--insecure", self.insecure, "this build has no TLS (http:// servers only)"),
            ("--plot-timeline", self.plot_timeline, "rserve bench serve draws no plots"),
            ("--plot-dataset-stats", self.plot_dataset_stats, "rserve bench serve draws no plots"),
            ("--trust-remote-code", self.trust_remote_code, "tokenizers are never loaded from Python code here"),
            ("--no-stream", self.no_stream, "it applies to Hugging Face datasets only"),
            ("--enable-multimodal-chat", self.enable_multimodal_chat, "multimodal datasets are not supported"),
            ("--custom-ensure-client-side-data", self.custom_ensure_client_side_data, "it applies to custom_image"),
            ("--no-reranker", self.no_reranker, "reranking is not supported"),
        ];
        let valued: [(&str, &Option<String>, &str); 31] = [
            ("--tokenizer-mode", &self.tokenizer_mode, "--tokenizer is a local tokenizer file, read one way"),
            ("--probe-request-rate", &self.probe_request_rate, "probe requests are not implemented"),
            ("--timeline-itl-thresholds", &self.timeline_itl_thresholds, "rserve bench serve draws no plots"),
            ("--spec-bench-output-len", &self.spec_bench_output_len, ONLY_UNSUPPORTED_DATASETS),
            ("--spec-bench-category", &self.spec_bench_category, ONLY_UNSUPPORTED_DATASETS),
            ("--timed-trace-chunk-hash-size", &self.timed_trace_chunk_hash_size, ONLY_UNSUPPORTED_DATASETS),
            ("--timed-trace-sec-multiplier", &self.timed_trace_sec_multiplier, ONLY_UNSUPPORTED_DATASETS),
            ("--timed-trace-label-timestamp", &self.timed_trace_label_timestamp, ONLY_UNSUPPORTED_DATASETS),
            ("--timed-trace-label-input-length", &self.timed_trace_label_input_length, ONLY_UNSUPPORTED_DATASETS),
            ("--timed-trace-label-output-length", &self.timed_trace_label_output_length, ONLY_UNSUPPORTED_DATASETS),
            ("--timed-trace-label-hash-ids", &self.timed_trace_label_hash_ids, ONLY_UNSUPPORTED_DATASETS),
            ("--blazedit-min-distance", &self.blazedit_min_distance, ONLY_UNSUPPORTED_DATASETS),
            ("--blazedit-max-distance", &self.blazedit_max_distance, ONLY_UNSUPPORTED_DATASETS),
            ("--asr-max-audio-len-sec", &self.asr_max_audio_len_sec, ONLY_UNSUPPORTED_DATASETS),
            ("--asr-min-audio-len-sec", &self.asr_min_audio_len_sec, ONLY_UNSUPPORTED_DATASETS),
            ("--hf-subset", &self.hf_subset, ONLY_UNSUPPORTED_DATASETS),
            ("--hf-split", &self.hf_split, ONLY_UNSUPPORTED_DATASETS),
            ("--hf-name", &self.hf_name, ONLY_UNSUPPORTED_DATASETS),
            ("--hf-output-len", &self.hf_output_len, ONLY_UNSUPPORTED_DATASETS),
            ("--bfcl-categories", &self.bfcl_categories, ONLY_UNSUPPORTED_DATASETS),
            ("--prefix-repetition-prefix-len", &self.prefix_repetition_prefix_len, ONLY_UNSUPPORTED_DATASETS),
            ("--prefix-repetition-suffix-len", &self.prefix_repetition_suffix_len, ONLY_UNSUPPORTED_DATASETS),
            ("--prefix-repetition-num-prefixes", &self.prefix_repetition_num_prefixes, ONLY_UNSUPPORTED_DATASETS),
            ("--prefix-repetition-output-len", &self.prefix_repetition_output_len, ONLY_UNSUPPORTED_DATASETS),
            ("--speed-bench-dataset-subset", &self.speed_bench_dataset_subset, ONLY_UNSUPPORTED_DATASETS),
            ("--speed-bench-output-len", &self.speed_bench_output_len, ONLY_UNSUPPORTED_DATASETS),
            ("--speed-bench-category", &self.speed_bench_category, ONLY_UNSUPPORTED_DATASETS),
            ("--random-batch-size", &self.random_batch_size, "it applies to embedding benchmarks only"),
            ("--random-mm-base-items-per-request", &self.random_mm_base_items_per_request, ONLY_UNSUPPORTED_DATASETS),
            (
                "--random-mm-num-mm-items-range-ratio",
                &self.random_mm_num_mm_items_range_ratio,
                ONLY_UNSUPPORTED_DATASETS,
            ),
            ("--random-mm-limit-mm-per-prompt", &self.random_mm_limit_mm_per_prompt, ONLY_UNSUPPORTED_DATASETS),
        ];
        let mut out: Vec<String> = switches
            .iter()
            .filter(|(_, on, _)| *on)
            .map(|(flag, _, why)| format!("warning: {flag} is ignored: {why}"))
            .collect();
        out.extend(
            valued
                .iter()
                .filter(|(_, v, _)| v.is_some())
                .map(|(flag, _, why)| format!("warning: {flag} is ignored: {why}")),
        );
        if self.random_mm_bucket_config.is_some() {
            out.push(format!("warning: --random-mm-bucket-config is ignored: {ONLY_UNSUPPORTED_DATASETS}"));
        }
        out
    }
}
