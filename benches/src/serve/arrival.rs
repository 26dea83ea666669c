//! Request arrival times: a Poisson process of the given rate (exponential gaps, seeded) or, for an infinite rate,
//! everything at once. Times are offsets from the start of the run in seconds.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The requested arrival rate in requests per second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RequestRate {
    /// All requests are sent at time 0 (bounded only by `--max-concurrency`).
    Infinite,
    /// A Poisson process with this many requests per second on average.
    PerSecond(f64),
}

impl RequestRate {
    /// Parses `inf` or a positive number.
    pub fn parse(s: &str) -> Result<Self, String> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("inf") || t.eq_ignore_ascii_case("infinity") {
            return Ok(RequestRate::Infinite);
        }
        match t.parse::<f64>() {
            Ok(r) if r.is_infinite() && r > 0.0 => Ok(RequestRate::Infinite),
            Ok(r) if r.is_finite() && r > 0.0 => Ok(RequestRate::PerSecond(r)),
            _ => Err(format!("'{s}' is not 'inf' or a positive number of requests per second")),
        }
    }

    /// As a number (`f64::INFINITY` for `inf`), the way the JSON result records it.
    pub fn as_f64(self) -> f64 {
        match self {
            RequestRate::Infinite => f64::INFINITY,
            RequestRate::PerSecond(r) => r,
        }
    }
}

/// Arrival offsets (seconds, non-decreasing) of `n` requests: the first at 0 for an infinite rate, otherwise
/// after an exponential gap like every other one.
pub fn arrival_times(n: usize, rate: RequestRate, seed: u64) -> Vec<f64> {
    match rate {
        RequestRate::Infinite => vec![0.0; n],
        RequestRate::PerSecond(r) => {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut t = 0.0;
            (0..n)
                .map(|_| {
                    t += exponential_gap(&mut rng, r);
                    t
                })
                .collect()
        }
    }
}

/// One exponentially distributed gap of mean `1 / rate` (inverse-CDF sampling).
fn exponential_gap(rng: &mut impl Rng, rate: f64) -> f64 {
    // gen::<f64>() is in [0, 1); 1 - u is in (0, 1], so the logarithm is finite.
    let u: f64 = rng.gen();
    -(1.0 - u).ln() / rate
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rates() {
        assert_eq!(RequestRate::parse("inf"), Ok(RequestRate::Infinite));
        assert_eq!(RequestRate::parse("INF"), Ok(RequestRate::Infinite));
        assert_eq!(RequestRate::parse("2.5"), Ok(RequestRate::PerSecond(2.5)));
        assert!(RequestRate::parse("0").is_err());
        assert!(RequestRate::parse("-1").is_err());
        assert!(RequestRate::parse("nan").is_err());
        assert!(RequestRate::parse("fast").is_err());
    }

    #[test]
    fn infinite_rate_sends_everything_at_once() {
        assert_eq!(arrival_times(5, RequestRate::Infinite, 1), vec![0.0; 5]);
    }

    #[test]
    fn same_seed_same_schedule_and_times_increase() {
        let a = arrival_times(1000, RequestRate::PerSecond(4.0), 7);
        assert_eq!(a, arrival_times(1000, RequestRate::PerSecond(4.0), 7));
        assert_ne!(a, arrival_times(1000, RequestRate::PerSecond(4.0), 8));
        assert!(a[0] > 0.0);
        assert!(a.windows(2).all(|w| w[1] >= w[0]));
    }

    /// The gaps of a Poisson process are exponential with mean 1/rate: check the mean (within 4 standard errors),
    /// the coefficient of variation (1 for an exponential) and the whole distribution with a Kolmogorov-Smirnov
    /// test (the 1% critical value is 1.63 / sqrt(n)).
    #[test]
    fn gaps_are_exponential_with_the_requested_mean() {
        let n = 20_000;
        for (rate, seed) in [(0.5, 1), (10.0, 2), (250.0, 3)] {
            let t = arrival_times(n, RequestRate::PerSecond(rate), seed);
            let mut gaps: Vec<f64> = std::iter::once(t[0]).chain(t.windows(2).map(|w| w[1] - w[0])).collect();
            let m = gaps.iter().sum::<f64>() / n as f64;
            let expect = 1.0 / rate;
            assert!((m - expect).abs() < 4.0 * expect / (n as f64).sqrt(), "rate {rate}: mean gap {m}, want {expect}");
            let sd = (gaps.iter().map(|g| (g - m) * (g - m)).sum::<f64>() / n as f64).sqrt();
            assert!((sd / m - 1.0).abs() < 0.05, "rate {rate}: coefficient of variation {}", sd / m);
            gaps.sort_by(f64::total_cmp);
            let d = gaps
                .iter()
                .enumerate()
                .map(|(i, &g)| {
                    let cdf = 1.0 - (-rate * g).exp();
                    (cdf - i as f64 / n as f64).abs().max(((i + 1) as f64 / n as f64 - cdf).abs())
                })
                .fold(0.0, f64::max);
            assert!(d < 1.63 / (n as f64).sqrt(), "rate {rate}: KS distance {d}");
        }
    }

    #[test]
    fn the_count_in_a_window_has_poisson_mean_and_variance() {
        // Counts in disjoint unit windows of a rate-r Poisson process have mean r and variance r.
        let rate = 20.0;
        let t = arrival_times(200_000, RequestRate::PerSecond(rate), 11);
        let windows = t[t.len() - 1].floor() as usize;
        let mut counts = vec![0f64; windows];
        for &x in &t {
            let w = x.floor() as usize;
            if w < windows {
                counts[w] += 1.0;
            }
        }
        let m = counts.iter().sum::<f64>() / windows as f64;
        let var = counts.iter().map(|c| (c - m) * (c - m)).sum::<f64>() / windows as f64;
        assert!((m - rate).abs() < 0.3, "mean count {m}");
        assert!((var / rate - 1.0).abs() < 0.1, "variance {var}");
    }
}
