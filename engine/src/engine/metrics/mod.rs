//! The engine's Prometheus metrics under vLLM v1's names, types, help strings, labels and buckets
//! (`vllm/v1/metrics/loggers.py`, `PrometheusStatLogger`), held in `prometheus` registries that carry vLLM's
//! per-engine labels (`model_name`, `engine`: "0", or the replica's index under `-dp`). The engine thread updates
//! them; the server encodes `gather()` for `/metrics` and reads a few values for its periodic log line. Counters,
//! gauges and histograms are atomics.

mod buckets;
mod info;
mod request;

use std::collections::HashMap;

use prometheus::core::Collector;
use prometheus::proto::MetricFamily;
use prometheus::{Gauge, GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts};
use prometheus::{Registry, Result as PromResult};

pub use buckets::request_tokens as request_token_buckets;
pub use info::CacheInfo;
pub use request::{FinishedTimes, RequestStats, TokenTiming};

/// vLLM's `finished_reason` values (`FINISH_REASON_STRINGS`), every one exported from the start.
pub const FINISHED_REASONS: [&str; 5] = ["stop", "length", "abort", "error", "repetition"];
const PROMPT_SOURCES: [&str; 3] = ["local_compute", "local_cache_hit", "external_kv_transfer"];
const CACHE_HIT_SOURCES: [&str; 5] = ["device", "host", "p2p", "disk", "external_unspecified"];

/// vLLM metrics that `/metrics` leaves out, and why. Each is one vLLM creates only under a configuration rserve does
/// not have, or counts something rserve does not do.
pub const NOT_EXPORTED: &[(&str, &str)] = &[
    (
        "vllm:admission_rejections",
        "counts refusals by vLLM's --max-num-queued-reqs/--max-num-queued-tokens; rserve's one admission limit, \
         --max-num-waiting, answers 503 before a request reaches the engine",
    ),
    ("vllm:num_requests_kv_fetch_by_stage", "vLLM creates it only for a KV-transfer consumer (disaggregated prefill)"),
    ("vllm:corrupted_requests", "vLLM creates it only with VLLM_COMPUTE_NANS_IN_LOGITS"),
    ("vllm:watermark_requests", "vLLM creates it only with a watermark config"),
    ("vllm:kv_block_lifetime_seconds", "vLLM creates it only with --kv-cache-metrics (sampled block residency)"),
    ("vllm:kv_block_idle_before_evict_seconds", "vLLM creates it only with --kv-cache-metrics"),
    ("vllm:kv_block_reuse_gap_seconds", "vLLM creates it only with --kv-cache-metrics"),
    ("vllm:lora_requests_info", "vLLM creates it only with LoRA adapters, which rserve does not serve"),
];

/// What the metrics need to know at start-up.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricsSetup {
    /// vLLM's `model_name` label: the first served model name.
    pub model_name: String,
    /// Caps the token-count buckets (vLLM's 1-2-5 series up to `max_model_len`).
    pub max_model_len: usize,
    pub cache: CacheInfo,
    /// vLLM's `engine` label: the engine's index among the server's data-parallel replicas (0 without `-dp`).
    pub engine: usize,
}

impl Default for MetricsSetup {
    fn default() -> Self {
        Self { model_name: String::new(), max_model_len: 8192, cache: CacheInfo::default(), engine: 0 }
    }
}

/// One finished request, as the metrics count it.
#[derive(Debug, Clone, Copy)]
pub struct Finished<'a> {
    /// A `FINISHED_REASONS` value.
    pub reason: &'static str,
    pub stats: &'a RequestStats,
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
}

/// The histograms vLLM observes once per API request (after its `n` choices), which the server records: fan-out
/// into choices is the server's.
#[derive(Debug, Clone)]
pub struct ParentObserver {
    params_n: Histogram,
    max_num_generation_tokens: Histogram,
}

impl ParentObserver {
    /// One API request whose `n` choices generated at most `max_generation_tokens` tokens each.
    pub fn observe(&self, n: usize, max_generation_tokens: usize) {
        self.params_n.observe(n as f64);
        self.max_num_generation_tokens.observe(max_generation_tokens as f64);
    }
}

/// Every metric. Gauges are set after every step; counters only grow.
#[derive(Debug, Clone)]
pub struct EngineMetrics {
    labelled: Registry,
    info: Registry,
    /// The label names of `vllm:cache_config_info`, in `CacheConfig`'s order.
    cache_fields: Vec<&'static str>,
    pub num_requests_running: IntGauge,
    pub num_requests_waiting: IntGauge,
    waiting_by_reason: IntGaugeVec,
    pub kv_cache_usage_perc: Gauge,
    pub prefix_cache_queries: IntCounter,
    pub prefix_cache_hits: IntCounter,
    prompt_tokens_cached_by_source: IntCounterVec,
    pub num_preemptions: IntCounter,
    pub prompt_tokens: IntCounter,
    prompt_tokens_by_source: IntCounterVec,
    prompt_tokens_cached: IntCounter,
    pub generation_tokens: IntCounter,
    request_success: IntCounterVec,
    request_prompt_tokens: Histogram,
    request_generation_tokens: Histogram,
    iteration_tokens: Histogram,
    parent: ParentObserver,
    request_params_max_tokens: Histogram,
    pub time_to_first_token: Histogram,
    pub inter_token_latency: Histogram,
    request_time_per_output_token: Histogram,
    pub e2e_request_latency: Histogram,
    request_queue_time: Histogram,
    request_inference_time: Histogram,
    request_prefill_time: Histogram,
    request_decode_time: Histogram,
    request_num_preemptions: Histogram,
    request_prefill_kv_computed_tokens: Histogram,
    /// rserve's own: KV blocks held by requests (cached-but-free blocks not counted), and the pool's size.
    pub kv_blocks_used: IntGauge,
    pub kv_blocks_total: IntGauge,
    /// rserve's own: tokens run through the model (prefill and decode), for the "computed tokens" checks.
    pub computed_tokens: IntCounter,
}

/// Registers `m` and hands it back.
fn reg<T: Collector + Clone + 'static>(r: &Registry, m: T) -> PromResult<T> {
    r.register(Box::new(m.clone()))?;
    Ok(m)
}

fn counter(r: &Registry, name: &str, help: &str) -> PromResult<IntCounter> {
    reg(r, IntCounter::with_opts(Opts::new(name, help))?)
}

fn gauge(r: &Registry, name: &str, help: &str) -> PromResult<IntGauge> {
    reg(r, IntGauge::with_opts(Opts::new(name, help))?)
}

fn histogram(r: &Registry, name: &str, help: &str, buckets: &[f64]) -> PromResult<Histogram> {
    reg(r, Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))?)
}

/// A counter vector with every value of its one label present from the start (as vLLM creates them).
fn counter_vec(r: &Registry, name: &str, help: &str, label: &str, values: &[&str]) -> PromResult<IntCounterVec> {
    let v = reg(r, IntCounterVec::new(Opts::new(name, help), &[label])?)?;
    for value in values {
        v.with_label_values(&[*value]);
    }
    Ok(v)
}

/// Puts the labels named in `first` first, in that order; the others keep theirs after them.
fn order_labels(families: &mut [MetricFamily], first: &[&str]) {
    let rank = |name: &str| first.iter().position(|f| *f == name).unwrap_or(first.len());
    for family in families {
        for metric in family.mut_metric() {
            let mut labels = metric.take_label();
            labels.sort_by_key(|l| rank(l.name()));
            metric.set_label(labels);
        }
    }
}

impl EngineMetrics {
    pub fn new(setup: MetricsSetup) -> PromResult<Self> {
        let labels = HashMap::from([
            ("model_name".to_owned(), setup.model_name.clone()),
            ("engine".to_owned(), setup.engine.to_string()),
        ]);
        let r = Registry::new_custom(None, Some(labels))?;
        // vLLM's info gauges carry `engine` and the config's fields, no `model_name`.
        let info = Registry::new_custom(None, Some(HashMap::from([("engine".to_owned(), setup.engine.to_string())])))?;
        let tokens = buckets::request_tokens(setup.max_model_len);
        let latency = buckets::REQUEST_LATENCY;

        let waiting_by_reason = reg(
            &r,
            IntGaugeVec::new(
                Opts::new(
                    "vllm:num_requests_waiting_by_reason",
                    "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling \
                     capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked \
                     status). Sum of all reasons equals vllm:num_requests_waiting.",
                ),
                &["reason"],
            )?,
        )?;
        waiting_by_reason.with_label_values(&["capacity"]);
        // rserve defers no waiting request (no LoRA budget, no KV transfer).
        waiting_by_reason.with_label_values(&["deferred"]);
        let sleep = reg(
            &r,
            IntGaugeVec::new(
                Opts::new(
                    "vllm:engine_sleep_state",
                    "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; \
                     weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
                ),
                &["sleep_state"],
            )?,
        )?;
        // rserve never sleeps: awake, nothing offloaded or discarded.
        sleep.with_label_values(&["awake"]).set(1);
        sleep.with_label_values(&["weights_offloaded"]).set(0);
        sleep.with_label_values(&["discard_all"]).set(0);
        let cache_info = reg(
            &info,
            GaugeVec::new(Opts::new("vllm:cache_config_info", "Information of the LLMEngine CacheConfig"), &{
                setup.cache.labels().iter().map(|(k, _)| *k).collect::<Vec<_>>()
            })?,
        )?;
        let values = setup.cache.labels();
        cache_info.with_label_values(&values.iter().map(|(_, v)| v.as_str()).collect::<Vec<_>>()).set(1.0);
        // Connectors and multi-modal inputs do not exist here: vLLM's counters for them stay at zero.
        counter(
            &r,
            "vllm:external_prefix_cache_queries_total",
            "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of \
             queried tokens.",
        )?;
        counter(
            &r,
            "vllm:external_prefix_cache_hits_total",
            "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of cached \
             tokens.",
        )?;
        counter(&r, "vllm:mm_cache_queries_total", "Multi-modal cache queries, in terms of number of queried items.")?;
        counter(&r, "vllm:mm_cache_hits_total", "Multi-modal cache hits, in terms of number of cached items.")?;

        Ok(Self {
            num_requests_running: gauge(
                &r,
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
            )?,
            num_requests_waiting: gauge(
                &r,
                "vllm:num_requests_waiting",
                "Number of requests waiting to be processed.",
            )?,
            waiting_by_reason,
            kv_cache_usage_perc: reg(
                &r,
                Gauge::with_opts(Opts::new("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."))?,
            )?,
            prefix_cache_queries: counter(
                &r,
                "vllm:prefix_cache_queries_total",
                "Prefix cache queries, in terms of number of queried tokens.",
            )?,
            prefix_cache_hits: counter(
                &r,
                "vllm:prefix_cache_hits_total",
                "Prefix cache hits, in terms of number of cached tokens.",
            )?,
            prompt_tokens_cached_by_source: counter_vec(
                &r,
                "vllm:prompt_tokens_cached_by_source_total",
                "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host (offloaded \
                 to DRAM), disk, p2p (transferred from another vLLM instance) or external_unspecified. Counted at \
                 admission; sums to vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.",
                "source",
                &CACHE_HIT_SOURCES,
            )?,
            num_preemptions: counter(
                &r,
                "vllm:num_preemptions_total",
                "Cumulative number of preemption from the engine.",
            )?,
            prompt_tokens: counter(&r, "vllm:prompt_tokens_total", "Number of prefill tokens processed.")?,
            prompt_tokens_by_source: counter_vec(
                &r,
                "vllm:prompt_tokens_by_source_total",
                "Number of prompt tokens by source.",
                "source",
                &PROMPT_SOURCES,
            )?,
            prompt_tokens_cached: counter(
                &r,
                "vllm:prompt_tokens_cached_total",
                "Number of cached prompt tokens (local + external).",
            )?,
            generation_tokens: counter(&r, "vllm:generation_tokens_total", "Number of generation tokens processed.")?,
            request_success: counter_vec(
                &r,
                "vllm:request_success_total",
                "Count of successfully processed requests.",
                "finished_reason",
                &FINISHED_REASONS,
            )?,
            request_prompt_tokens: histogram(
                &r,
                "vllm:request_prompt_tokens",
                "Number of prefill tokens processed.",
                &tokens,
            )?,
            request_generation_tokens: histogram(
                &r,
                "vllm:request_generation_tokens",
                "Number of generation tokens processed.",
                &tokens,
            )?,
            iteration_tokens: histogram(
                &r,
                "vllm:iteration_tokens_total",
                "Histogram of number of tokens per engine_step.",
                buckets::ITERATION_TOKENS,
            )?,
            parent: ParentObserver {
                params_n: histogram(
                    &r,
                    "vllm:request_params_n",
                    "Histogram of the n request parameter.",
                    buckets::REQUEST_PARAMS_N,
                )?,
                max_num_generation_tokens: histogram(
                    &r,
                    "vllm:request_max_num_generation_tokens",
                    "Histogram of maximum number of requested generation tokens.",
                    &tokens,
                )?,
            },
            request_params_max_tokens: histogram(
                &r,
                "vllm:request_params_max_tokens",
                "Histogram of the max_tokens request parameter.",
                &tokens,
            )?,
            time_to_first_token: histogram(
                &r,
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                buckets::TIME_TO_FIRST_TOKEN,
            )?,
            inter_token_latency: histogram(
                &r,
                "vllm:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                buckets::INTER_TOKEN_LATENCY,
            )?,
            request_time_per_output_token: histogram(
                &r,
                "vllm:request_time_per_output_token_seconds",
                "Histogram of time_per_output_token_seconds per request.",
                buckets::INTER_TOKEN_LATENCY,
            )?,
            e2e_request_latency: histogram(
                &r,
                "vllm:e2e_request_latency_seconds",
                "Histogram of e2e request latency in seconds.",
                latency,
            )?,
            request_queue_time: histogram(
                &r,
                "vllm:request_queue_time_seconds",
                "Histogram of time spent in WAITING phase for request.",
                latency,
            )?,
            request_inference_time: histogram(
                &r,
                "vllm:request_inference_time_seconds",
                "Histogram of time spent in RUNNING phase for request.",
                latency,
            )?,
            request_prefill_time: histogram(
                &r,
                "vllm:request_prefill_time_seconds",
                "Histogram of time spent in PREFILL phase for request.",
                latency,
            )?,
            request_decode_time: histogram(
                &r,
                "vllm:request_decode_time_seconds",
                "Histogram of time spent in DECODE phase for request.",
                latency,
            )?,
            request_num_preemptions: histogram(
                &r,
                "vllm:request_num_preemptions",
                "Histogram of the number of times a request was preempted.",
                buckets::REQUEST_NUM_PREEMPTIONS,
            )?,
            request_prefill_kv_computed_tokens: histogram(
                &r,
                "vllm:request_prefill_kv_computed_tokens",
                "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
                &tokens,
            )?,
            kv_blocks_used: gauge(&r, "rserve:kv_blocks_used", "KV cache blocks held by requests.")?,
            kv_blocks_total: gauge(&r, "rserve:kv_blocks_total", "KV cache blocks in the pool.")?,
            computed_tokens: counter(
                &r,
                "rserve:computed_tokens_total",
                "Tokens run through the model (prefill and decode).",
            )?,
            labelled: r,
            info,
            cache_fields: values.iter().map(|(k, _)| *k).collect(),
        })
    }

    /// Every metric family, sorted by name within each registry (the per-engine ones, then the info gauges), each
    /// sample's labels in vLLM's order: `model_name`, `engine`, then the metric's own; an info gauge's fields, then
    /// `engine`. (The registry appends its labels in hash order, and Prometheus ignores the order: this is for the
    /// people and scripts that read the text.)
    pub fn gather(&self) -> Vec<MetricFamily> {
        let mut out = self.labelled.gather();
        order_labels(&mut out, &["model_name", "engine"]);
        let mut info = self.info.gather();
        let mut fields: Vec<&str> = self.cache_fields.to_vec();
        fields.push("engine");
        order_labels(&mut info, &fields);
        out.extend(info);
        out
    }

    /// Sets the scheduler gauges (vLLM's `SchedulerStats`): everything waiting is waiting for capacity.
    pub fn set_scheduler_state(&self, running: usize, waiting: usize, blocks_used: usize, blocks_total: usize) {
        self.num_requests_running.set(running as i64);
        self.num_requests_waiting.set(waiting as i64);
        self.waiting_by_reason.with_label_values(&["capacity"]).set(waiting as i64);
        self.kv_blocks_used.set(blocks_used as i64);
        self.kv_blocks_total.set(blocks_total as i64);
        let usage = if blocks_total == 0 { 0.0 } else { blocks_used as f64 / blocks_total as f64 };
        self.kv_cache_usage_perc.set(usage);
    }

    /// Brings the counters the scheduler keeps as totals (preemptions, prefix cache queries and hits) up to them.
    pub fn sync_scheduler_totals(&self, preemptions: u64, prefix_queries: u64, prefix_hits: u64) {
        let raise = |c: &IntCounter, total: u64| {
            let delta = total.saturating_sub(c.get());
            c.inc_by(delta);
            delta
        };
        raise(&self.num_preemptions, preemptions);
        raise(&self.prefix_cache_queries, prefix_queries);
        let hits = raise(&self.prefix_cache_hits, prefix_hits);
        self.prompt_tokens_cached_by_source.with_label_values(&["device"]).inc_by(hits);
    }

    /// One engine step that ran `tokens` tokens (vLLM's `iteration_tokens_total`) and `computed` tokens through the
    /// model.
    pub fn observe_step(&self, tokens: usize, computed: usize) {
        self.iteration_tokens.observe(tokens as f64);
        self.computed_tokens.inc_by(computed as u64);
    }

    /// One generated token of a request with `prompt_tokens` prompt tokens, `cached_tokens` of them from the prefix
    /// cache. The prompt is counted with the first token, as vLLM does.
    pub fn observe_token(&self, timing: TokenTiming, prompt_tokens: usize, cached_tokens: usize) {
        self.generation_tokens.inc();
        match timing {
            TokenTiming::First(ttft) => {
                let cached = cached_tokens.min(prompt_tokens);
                self.time_to_first_token.observe(ttft);
                self.prompt_tokens.inc_by(prompt_tokens as u64);
                self.prompt_tokens_by_source
                    .with_label_values(&["local_compute"])
                    .inc_by((prompt_tokens - cached) as u64);
                self.prompt_tokens_by_source.with_label_values(&["local_cache_hit"]).inc_by(cached as u64);
                self.prompt_tokens_cached.inc_by(cached as u64);
            }
            TokenTiming::Next(itl) => self.inter_token_latency.observe(itl),
        }
    }

    /// A pooling request's result, `ttft` after it arrived: its prompt tokens are counted as a generation request's
    /// are at its first token (all computed: pooling requests skip the prefix cache); no token is generated.
    pub fn observe_pooled(&self, ttft: f64, prompt_tokens: usize) {
        self.time_to_first_token.observe(ttft);
        self.prompt_tokens.inc_by(prompt_tokens as u64);
        self.prompt_tokens_by_source.with_label_values(&["local_compute"]).inc_by(prompt_tokens as u64);
    }

    /// One request that ended at `now`, whatever the reason.
    pub fn observe_finished(&self, f: Finished<'_>, now: std::time::Instant) {
        let t = f.stats.finished(now);
        self.request_success.with_label_values(&[f.reason]).inc();
        self.e2e_request_latency.observe(t.e2e);
        self.request_queue_time.observe(t.queue);
        self.request_prefill_time.observe(t.prefill);
        self.request_inference_time.observe(t.inference);
        self.request_decode_time.observe(t.decode);
        self.request_num_preemptions.observe(f.stats.preemptions as f64);
        self.request_prefill_kv_computed_tokens.observe(f.prompt_tokens.saturating_sub(f.cached_tokens) as f64);
        self.request_prompt_tokens.observe(f.prompt_tokens as f64);
        self.request_generation_tokens.observe(f.stats.generated as f64);
        self.request_time_per_output_token.observe(t.time_per_output_token);
        if f.stats.max_tokens > 0 {
            self.request_params_max_tokens.observe(f.stats.max_tokens as f64);
        }
    }

    /// The histograms the server fills once per API request.
    pub fn parent_observer(&self) -> ParentObserver {
        self.parent.clone()
    }

    /// Requests that finished with `reason` (a `FINISHED_REASONS` value).
    pub fn finished(&self, reason: &str) -> u64 {
        self.request_success.with_label_values(&[reason]).get()
    }

    /// Fraction of KV blocks in use, 0..=1.
    pub fn kv_cache_usage(&self) -> f64 {
        self.kv_cache_usage_perc.get()
    }
}

impl Default for EngineMetrics {
    /// Metrics of an unnamed model (tests and fakes).
    fn default() -> Self {
        #[allow(clippy::expect_used)]
        Self::new(MetricsSetup::default()).expect("the metric definitions are constants, checked by the tests")
    }
}
