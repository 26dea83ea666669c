//! From per-request outcomes to the benchmark's numbers, with `vllm bench serve`'s definitions:
//! - TTFT: request sent -> first streamed chunk with text; E2E latency: request sent -> stream end;
//! - TPOT (per request): `(e2e - ttft) / (output_tokens - 1)` for requests with more than one output token;
//! - ITL: every gap between consecutive text chunks, pooled over all requests;
//! - throughputs over the wall-clock duration of the run; goodput: completed requests per second that met every
//!   given SLO (`ttft`, `tpot`, `e2el` in milliseconds; a one-token request counts as TPOT 0);
//! - client queue time: arrival -> sent (waiting for a `--max-concurrency` slot); peaks as in [`super::peak`].

use super::peak::peaks;
use super::stats::Summary;

/// What one request produced, as measured by the client.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestOutcome {
    pub success: bool,
    /// Why it failed (empty on success).
    pub error: String,
    /// Prompt length in tokens as planned by the dataset.
    pub prompt_len: usize,
    /// `usage.prompt_tokens` / `usage.completion_tokens` when the server reported them.
    pub usage_prompt_tokens: Option<usize>,
    pub usage_completion_tokens: Option<usize>,
    /// Streamed chunks that carried text.
    pub num_chunks: usize,
    /// Seconds from sending the request to the first text chunk.
    pub ttft: f64,
    /// Seconds from sending the request to the end of the stream.
    pub latency: f64,
    /// Seconds between consecutive text chunks.
    pub itl: Vec<f64>,
    pub generated_text: String,
    /// Seconds from the start of the run to sending this request.
    pub start_offset: f64,
    /// Seconds the request waited for a `--max-concurrency` slot after its arrival time.
    pub queue_time: f64,
}

/// Counts the tokens of a text with a local tokenizer (None when it cannot).
pub type TokenCounter<'a> = dyn Fn(&str) -> Option<usize> + 'a;

impl RequestOutcome {
    /// Output tokens: the server's count when it gave one, else `count_text` of the generated text when a local
    /// tokenizer is at hand, else the number of text chunks (one token per chunk on the servers we know).
    pub fn output_tokens(&self, count_text: Option<&TokenCounter<'_>>) -> usize {
        if let Some(n) = self.usage_completion_tokens {
            return n;
        }
        count_text.and_then(|f| f(&self.generated_text)).unwrap_or(self.num_chunks)
    }
}

/// Service-level objectives for goodput, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Slo {
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub e2el_ms: Option<f64>,
}

impl Slo {
    /// Parses `--goodput` values like `ttft:200 tpot:50 e2el:5000` (milliseconds, non-negative).
    pub fn parse(items: &[String]) -> Result<Self, String> {
        let mut slo = Slo::default();
        for item in items {
            let (name, value) = item
                .split_once(':')
                .ok_or_else(|| format!("'{item}' is not NAME:MILLISECONDS (NAME is ttft, tpot or e2el)"))?;
            let ms: f64 = value
                .trim()
                .parse()
                .ok()
                .filter(|v: &f64| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| format!("'{value}' in '{item}' is not a non-negative number of milliseconds"))?;
            match name.trim() {
                "ttft" => slo.ttft_ms = Some(ms),
                "tpot" => slo.tpot_ms = Some(ms),
                "e2el" => slo.e2el_ms = Some(ms),
                other => return Err(format!("unknown SLO metric '{other}' (use ttft, tpot or e2el)")),
            }
        }
        Ok(slo)
    }

    pub fn is_empty(&self) -> bool {
        self.ttft_ms.is_none() && self.tpot_ms.is_none() && self.e2el_ms.is_none()
    }
}

/// The aggregate numbers of one run. Latency summaries are in milliseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchmarkMetrics {
    pub duration_s: f64,
    pub num_requests: usize,
    pub completed: usize,
    pub failed: usize,
    pub total_input: usize,
    pub total_output: usize,
    pub request_throughput: f64,
    /// `None` when no SLO was given.
    pub request_goodput: Option<f64>,
    pub output_throughput: f64,
    pub total_token_throughput: f64,
    pub ttft_ms: Summary,
    pub tpot_ms: Summary,
    pub itl_ms: Summary,
    pub e2el_ms: Summary,
    /// Client-side queueing (arrival -> sent) and E2E latency including it, of the successful requests.
    pub client_queue_time_ms: Summary,
    pub e2el_including_client_queue_ms: Summary,
    /// Output tokens (chunks) in the busiest second, and the most requests active in one second ([`peaks`]).
    pub max_output_tokens_per_s: f64,
    pub max_concurrent_requests: usize,
    /// Output tokens of each request (0 for failed ones), in request order.
    pub output_lens: Vec<usize>,
}

/// Aggregates `outcomes` of a run that lasted `duration_s` seconds.
pub fn compute(
    outcomes: &[RequestOutcome],
    duration_s: f64,
    slo: &Slo,
    percentiles: &[f64],
    count_text: Option<&TokenCounter<'_>>,
) -> BenchmarkMetrics {
    let (mut ttfts, mut tpots, mut all_tpots, mut itls, mut e2els) = (vec![], vec![], vec![], vec![], vec![]);
    let (mut queues, mut e2els_with_queue) = (vec![], vec![]);
    let mut output_lens = Vec::with_capacity(outcomes.len());
    let (mut completed, mut total_input, mut good) = (0, 0, 0);
    for o in outcomes {
        if !o.success {
            output_lens.push(0);
            continue;
        }
        let out_len = o.output_tokens(count_text);
        output_lens.push(out_len);
        total_input += o.prompt_len;
        let tpot = if out_len > 1 { (o.latency - o.ttft) / (out_len - 1) as f64 } else { 0.0 };
        if out_len > 1 {
            tpots.push(tpot);
        }
        all_tpots.push(tpot);
        itls.extend_from_slice(&o.itl);
        ttfts.push(o.ttft);
        e2els.push(o.latency);
        queues.push(o.queue_time);
        e2els_with_queue.push(o.latency + o.queue_time);
        completed += 1;
        let meets = |limit_ms: Option<f64>, value_s: f64| limit_ms.is_none_or(|l| value_s * 1000.0 <= l);
        if meets(slo.ttft_ms, o.ttft) && meets(slo.tpot_ms, tpot) && meets(slo.e2el_ms, o.latency) {
            good += 1;
        }
    }
    let total_output: usize = output_lens.iter().sum();
    let per_s = |x: f64| if duration_s > 0.0 { x / duration_s } else { 0.0 };
    let ms = |xs: &[f64]| Summary::of(&xs.iter().map(|x| x * 1000.0).collect::<Vec<_>>(), percentiles);
    let (max_output_tokens_per_s, max_concurrent_requests) = peaks(outcomes);
    BenchmarkMetrics {
        duration_s,
        num_requests: outcomes.len(),
        completed,
        failed: outcomes.len() - completed,
        total_input,
        total_output,
        request_throughput: per_s(completed as f64),
        request_goodput: (!slo.is_empty()).then(|| per_s(good as f64)),
        output_throughput: per_s(total_output as f64),
        total_token_throughput: per_s((total_input + total_output) as f64),
        ttft_ms: ms(&ttfts),
        tpot_ms: ms(&tpots),
        itl_ms: ms(&itls),
        e2el_ms: ms(&e2els),
        client_queue_time_ms: ms(&queues),
        e2el_including_client_queue_ms: ms(&e2els_with_queue),
        max_output_tokens_per_s,
        max_concurrent_requests,
        output_lens,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_goodput_slos() {
        let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            Slo::parse(&v(&["ttft:200", "tpot:50.5"])),
            Ok(Slo { ttft_ms: Some(200.0), tpot_ms: Some(50.5), e2el_ms: None })
        );
        assert!(Slo::parse(&v(&["ttft"])).is_err());
        assert!(Slo::parse(&v(&["ttft:-1"])).is_err());
        assert!(Slo::parse(&v(&["itl:5"])).is_err());
        assert!(Slo::parse(&[]).unwrap().is_empty());
    }

    #[test]
    fn output_tokens_prefer_usage_then_tokenizer_then_chunks() {
        let mut o = RequestOutcome { num_chunks: 3, generated_text: "a b".into(), ..Default::default() };
        assert_eq!(o.output_tokens(None), 3);
        let count = |t: &str| Some(t.split(' ').count());
        assert_eq!(o.output_tokens(Some(&count)), 2);
        o.usage_completion_tokens = Some(9);
        assert_eq!(o.output_tokens(Some(&count)), 9);
    }
}
