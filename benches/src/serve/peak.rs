//! vLLM's peak numbers of a run: the output tokens streamed in the busiest one-second bucket ("Peak output token
//! throughput") and the most requests active in one bucket ("Peak concurrent requests"). Buckets are whole seconds
//! from the first successful request's start; a request is active in every bucket from its start's to its end's,
//! and its tokens are its streamed chunks, timed by TTFT and the inter-token latencies (as vLLM counts them).

use super::metrics::RequestOutcome;

/// `(max_output_tokens_per_s, max_concurrent_requests)` over the successful outcomes; `(0, 0)` without any.
pub fn peaks(outcomes: &[RequestOutcome]) -> (f64, usize) {
    let ok: Vec<&RequestOutcome> = outcomes.iter().filter(|o| o.success).collect();
    let Some(min_start) = ok.iter().map(|o| o.start_offset).min_by(f64::total_cmp) else {
        return (0.0, 0);
    };
    let max_end = ok.iter().map(|o| o.start_offset + o.latency).fold(min_start, f64::max);
    let buckets = (max_end - min_start).ceil() as usize + 1;
    let mut tokens = vec![0usize; buckets];
    let mut active = vec![0usize; buckets];
    let bucket = |t: f64| (t - min_start).max(0.0) as usize;
    for o in ok {
        let mut t = o.start_offset + o.ttft;
        for gap in std::iter::once(0.0).chain(o.itl.iter().copied()) {
            t += gap;
            if let Some(b) = tokens.get_mut(bucket(t)) {
                *b += 1;
            }
        }
        let last = bucket(o.start_offset + o.latency).min(buckets - 1);
        for a in &mut active[bucket(o.start_offset)..=last] {
            *a += 1;
        }
    }
    let max_tokens = tokens.iter().copied().max().unwrap_or(0);
    (max_tokens as f64, active.iter().copied().max().unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(start: f64, ttft: f64, itl: Vec<f64>, latency: f64) -> RequestOutcome {
        RequestOutcome { success: true, start_offset: start, ttft, itl, latency, ..Default::default() }
    }

    #[test]
    fn peaks_count_chunks_and_overlaps_per_second() {
        // A: tokens at 0.5, 0.7, 1.2 (s); active in seconds 0-1. B: tokens at 0.9, 1.1, 1.3, 1.5; active 0-1.
        // C: starts at 2.5, one token at 2.6; active in second 2 only.
        let outcomes = vec![
            ok(0.0, 0.5, vec![0.2, 0.5], 1.2),
            ok(0.4, 0.5, vec![0.2, 0.2, 0.2], 1.1),
            ok(2.5, 0.1, vec![], 0.1),
            RequestOutcome { start_offset: 0.0, latency: 9.0, ..Default::default() },
        ];
        assert_eq!(peaks(&outcomes), (4.0, 2));
        assert_eq!(peaks(&outcomes[2..]), (1.0, 1));
        assert_eq!(peaks(&[]), (0.0, 0));
    }
}
