//! One request's timestamps and counts while it lives in the engine, and the intervals vLLM derives from them when
//! it finishes (`vllm/v1/metrics/stats.py`): queue = arrival -> first scheduled, prefill = first scheduled -> first
//! token, decode = first token -> last token, inference = first scheduled -> last token, e2e = arrival -> finish,
//! time per output token = decode / (generated - 1).

use std::time::Instant;

/// What the engine thread records for one request (in its `Live` state).
#[derive(Debug, Clone)]
pub struct RequestStats {
    pub arrival: Instant,
    /// The step that first scheduled it (a preempted request keeps its first one, as vLLM).
    pub scheduled: Option<Instant>,
    pub first_token: Option<Instant>,
    pub last_token: Option<Instant>,
    pub generated: usize,
    pub preemptions: u64,
    /// The request's `max_tokens`.
    pub max_tokens: usize,
}

/// How a new token relates to the ones before it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TokenTiming {
    /// The first token: time to first token (seconds).
    First(f64),
    /// A later token: time since the previous one (seconds).
    Next(f64),
}

/// The intervals of a finished request, in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct FinishedTimes {
    pub e2e: f64,
    pub queue: f64,
    pub prefill: f64,
    pub decode: f64,
    pub inference: f64,
    pub time_per_output_token: f64,
}

fn secs(later: Instant, earlier: Instant) -> f64 {
    later.saturating_duration_since(earlier).as_secs_f64()
}

impl RequestStats {
    pub fn new(arrival: Instant, max_tokens: usize) -> Self {
        Self { arrival, scheduled: None, first_token: None, last_token: None, generated: 0, preemptions: 0, max_tokens }
    }

    /// The request is in a step that started at `at`.
    pub fn scheduled(&mut self, at: Instant) {
        self.scheduled.get_or_insert(at);
    }

    /// A pooling request's result at `now`: its time to first output (the prefill ends there), with no token
    /// generated. Returns the seconds since arrival.
    pub fn pooled(&mut self, now: Instant) -> f64 {
        self.first_token = Some(now);
        self.last_token = Some(now);
        secs(now, self.arrival)
    }

    /// Counts one generated token produced at `now`.
    pub fn token(&mut self, now: Instant) -> TokenTiming {
        self.generated += 1;
        let timing = match self.last_token {
            None => {
                self.first_token = Some(now);
                TokenTiming::First(secs(now, self.arrival))
            }
            Some(prev) => TokenTiming::Next(secs(now, prev)),
        };
        self.last_token = Some(now);
        timing
    }

    /// The intervals at `now`. A phase that never began (no token, never scheduled) counts as zero, so that a
    /// request aborted while waiting reports its whole life as queue time and nothing else.
    pub fn finished(&self, now: Instant) -> FinishedTimes {
        let scheduled = self.scheduled.unwrap_or(now);
        let first = self.first_token.unwrap_or(scheduled);
        let last = self.last_token.unwrap_or(first);
        let decode = secs(last, first);
        FinishedTimes {
            e2e: secs(now, self.arrival),
            queue: secs(scheduled, self.arrival),
            prefill: secs(first, scheduled),
            decode,
            inference: secs(last, scheduled),
            time_per_output_token: if self.generated > 1 { decode / (self.generated - 1) as f64 } else { 0.0 },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn intervals_follow_vllm() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut s = RequestStats::new(t0, 16);
        s.scheduled(at(100));
        s.scheduled(at(150)); // after a preemption: the first schedule stays
        assert_eq!(s.token(at(300)), TokenTiming::First(0.3));
        assert_eq!(s.token(at(400)), TokenTiming::Next(0.1));
        s.token(at(700));
        let f = s.finished(at(750));
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(close(f.e2e, 0.75) && close(f.queue, 0.1) && close(f.prefill, 0.2), "{f:?}");
        assert!(close(f.decode, 0.4) && close(f.inference, 0.6) && close(f.time_per_output_token, 0.2), "{f:?}");
    }

    #[test]
    fn a_pooled_result_ends_the_prefill_and_generates_nothing() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut s = RequestStats::new(t0, 1);
        s.scheduled(at(100));
        assert!((s.pooled(at(250)) - 0.25).abs() < 1e-9);
        assert_eq!(s.generated, 0);
        let f = s.finished(at(250));
        assert!((f.prefill - 0.15).abs() < 1e-9 && f.decode == 0.0, "{f:?}");
    }

    #[test]
    fn a_request_that_never_ran_spent_its_life_waiting() {
        let t0 = Instant::now();
        let f = RequestStats::new(t0, 16).finished(t0 + Duration::from_secs(2));
        assert_eq!((f.e2e, f.queue, f.prefill, f.decode, f.inference), (2.0, 2.0, 0.0, 0.0, 0.0));
    }
}
