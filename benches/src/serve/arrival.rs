//! Request arrival times as `vllm bench serve` makes them: gamma-distributed gaps of mean `1 / rate` (shape
//! `--burstiness`; 1 is a Poisson process), seeded, optionally under a linear or exponential ramp-up of the rate; an
//! infinite rate sends everything at once. Times are offsets from the start of the run in seconds.

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

/// How request arrivals are spread (vLLM's `get_request`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ArrivalShape {
    pub rate: RequestRate,
    /// Gamma shape of the gaps (> 0; 1 = Poisson, `inf` = evenly spaced).
    pub burstiness: f64,
    /// `(strategy, start rps, end rps)`: the rate moves from start to end over the requests.
    pub ramp_up: Option<(Ramp, f64, f64)>,
}

/// How a ramp-up moves the rate from its start to its end value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ramp {
    Linear,
    Exponential,
}

impl ArrivalShape {
    /// A constant rate with Poisson arrivals.
    pub fn poisson(rate: RequestRate) -> Self {
        ArrivalShape { rate, burstiness: 1.0, ramp_up: None }
    }

    /// The rate in force for request `i` of `n`.
    pub fn rate_at(&self, i: usize, n: usize) -> f64 {
        match self.ramp_up {
            None => self.rate.as_f64(),
            Some((ramp, start, end)) => {
                let progress = i as f64 / (n.max(2) - 1) as f64;
                match ramp {
                    Ramp::Linear => start + (end - start) * progress,
                    Ramp::Exponential => start * (end / start).powf(progress),
                }
            }
        }
    }
}

/// Arrival offsets (seconds, non-decreasing) of `n` requests, as vLLM computes them: each gap drawn from a gamma
/// distribution of shape `burstiness` and mean `1 / rate` (0 for an infinite rate, `1 / rate` exactly for an
/// infinite burstiness), summed; at a constant rate the sums are then scaled so that the last request arrives at
/// exactly `n / rate` (vLLM's normalisation, which keeps throughput comparable across seeds). Errors name a
/// non-positive burstiness or rate.
pub fn arrival_times(n: usize, shape: &ArrivalShape, seed: u64) -> Result<Vec<f64>, String> {
    if shape.burstiness.is_nan() || shape.burstiness <= 0.0 {
        return Err(format!("burstiness must be positive, not {}", shape.burstiness));
    }
    let mut rng = StdRng::seed_from_u64(seed);
    let mut t = 0.0;
    let mut times = Vec::with_capacity(n);
    for i in 0..n {
        let rate = shape.rate_at(i, n);
        if rate.is_nan() || rate <= 0.0 {
            return Err(format!("request {i} would be sent at a rate of {rate} requests per second"));
        }
        t += if rate.is_infinite() {
            0.0
        } else if shape.burstiness.is_infinite() {
            1.0 / rate
        } else {
            gamma(&mut rng, shape.burstiness) / (rate * shape.burstiness)
        };
        times.push(t);
    }
    if let (None, RequestRate::PerSecond(r), Some(&last)) = (shape.ramp_up, shape.rate, times.last()) {
        if last > 0.0 {
            let factor = n as f64 / r / last;
            times.iter_mut().for_each(|x| *x *= factor);
        }
    }
    Ok(times)
}

/// One draw from a gamma distribution of shape `k` and scale 1 (Marsaglia and Tsang's method; shapes below 1 by
/// drawing shape `k + 1` and multiplying by `u^(1/k)`).
pub fn gamma(rng: &mut impl Rng, k: f64) -> f64 {
    if k < 1.0 {
        let u: f64 = 1.0 - rng.gen::<f64>();
        return gamma(rng, k + 1.0) * u.powf(1.0 / k);
    }
    let d = k - 1.0 / 3.0;
    let c = 1.0 / (9.0 * d).sqrt();
    loop {
        let x = standard_normal(rng);
        let v = (1.0 + c * x).powi(3);
        if v <= 0.0 {
            continue;
        }
        let u: f64 = 1.0 - rng.gen::<f64>();
        if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
            return d * v;
        }
    }
}

/// A standard normal draw (Box-Muller).
fn standard_normal(rng: &mut impl Rng) -> f64 {
    let u1: f64 = 1.0 - rng.gen::<f64>();
    let u2: f64 = rng.gen();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn times(n: usize, rate: RequestRate, seed: u64) -> Vec<f64> {
        arrival_times(n, &ArrivalShape::poisson(rate), seed).expect("arrivals")
    }

    /// Mean and variance of `k` gamma draws of shape `shape`: a gamma(k, 1) has mean k and variance k.
    #[test]
    fn gamma_draws_have_the_shapes_mean_and_variance() {
        let n = 40_000;
        for (shape, seed) in [(0.25, 1), (0.5, 2), (1.0, 3), (2.0, 4), (7.5, 5)] {
            let mut rng = StdRng::seed_from_u64(seed);
            let xs: Vec<f64> = (0..n).map(|_| gamma(&mut rng, shape)).collect();
            assert!(xs.iter().all(|x| x.is_finite() && *x >= 0.0));
            let m = xs.iter().sum::<f64>() / n as f64;
            let var = xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / n as f64;
            assert!((m - shape).abs() < 5.0 * (shape / n as f64).sqrt(), "shape {shape}: mean {m}");
            assert!((var / shape - 1.0).abs() < 0.1, "shape {shape}: variance {var}");
        }
    }

    /// At any burstiness the mean rate is the requested one (the last request arrives at n / rate, vLLM's
    /// normalisation) while the gaps' coefficient of variation is 1 / sqrt(burstiness): bursty below 1, even above.
    #[test]
    fn bursty_arrivals_keep_the_mean_rate() {
        let n = 20_000;
        for (burstiness, seed) in [(0.2, 1), (0.5, 2), (1.0, 3), (4.0, 4)] {
            let shape = ArrivalShape { rate: RequestRate::PerSecond(8.0), burstiness, ramp_up: None };
            let t = arrival_times(n, &shape, seed).expect("arrivals");
            assert!((t[n - 1] - n as f64 / 8.0).abs() < 1e-6, "last arrival {}", t[n - 1]);
            assert!(t.windows(2).all(|w| w[1] >= w[0]));
            let gaps: Vec<f64> = std::iter::once(t[0]).chain(t.windows(2).map(|w| w[1] - w[0])).collect();
            let m = gaps.iter().sum::<f64>() / n as f64;
            let sd = (gaps.iter().map(|g| (g - m) * (g - m)).sum::<f64>() / n as f64).sqrt();
            let want = 1.0 / burstiness.sqrt();
            assert!((sd / m / want - 1.0).abs() < 0.08, "burstiness {burstiness}: cv {} want {want}", sd / m);
        }
        let even = ArrivalShape { rate: RequestRate::PerSecond(4.0), burstiness: f64::INFINITY, ramp_up: None };
        assert_eq!(arrival_times(4, &even, 0).expect("arrivals"), vec![0.25, 0.5, 0.75, 1.0]);
        let zero = ArrivalShape { burstiness: 0.0, ..even };
        assert!(arrival_times(4, &zero, 0).is_err());
    }

    #[test]
    fn ramp_up_moves_the_rate_from_start_to_end() {
        let lin =
            ArrivalShape { rate: RequestRate::Infinite, burstiness: 1.0, ramp_up: Some((Ramp::Linear, 1.0, 5.0)) };
        assert_eq!(lin.rate_at(0, 5), 1.0);
        assert_eq!(lin.rate_at(2, 5), 3.0);
        assert_eq!(lin.rate_at(4, 5), 5.0);
        let exp = ArrivalShape { ramp_up: Some((Ramp::Exponential, 1.0, 16.0)), ..lin };
        assert!((exp.rate_at(2, 5) - 4.0).abs() < 1e-12);
        let from_zero = ArrivalShape { ramp_up: Some((Ramp::Linear, 0.0, 5.0)), ..lin };
        assert!(arrival_times(5, &from_zero, 0).is_err(), "vLLM refuses a zero rate too");
    }

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
        assert_eq!(times(5, RequestRate::Infinite, 1), vec![0.0; 5]);
    }

    #[test]
    fn same_seed_same_schedule_and_times_increase() {
        let a = times(1000, RequestRate::PerSecond(4.0), 7);
        assert_eq!(a, times(1000, RequestRate::PerSecond(4.0), 7));
        assert_ne!(a, times(1000, RequestRate::PerSecond(4.0), 8));
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
            let t = times(n, RequestRate::PerSecond(rate), seed);
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
        let t = times(200_000, RequestRate::PerSecond(rate), 11);
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
