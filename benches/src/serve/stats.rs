//! Summary statistics over samples, with numpy's definitions (what `vllm bench serve` reports): the mean, the
//! population standard deviation (`np.std`), the median and percentiles by linear interpolation between the closest
//! ranks (`np.percentile`, method "linear"). Empty input gives 0 for everything, as vLLM reports missing metrics.

/// Arithmetic mean; 0 for no samples.
pub fn mean(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    xs.iter().sum::<f64>() / xs.len() as f64
}

/// Population standard deviation (numpy's default `ddof = 0`); 0 for no samples.
pub fn std_dev(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let m = mean(xs);
    (xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / xs.len() as f64).sqrt()
}

/// The `p`-th percentile (`0 <= p <= 100`, clamped) of already sorted samples, interpolating linearly between the
/// two closest ranks; 0 for no samples.
pub fn percentile_sorted(sorted: &[f64], p: f64) -> f64 {
    match sorted.len() {
        0 => 0.0,
        1 => sorted[0],
        n => {
            let rank = p.clamp(0.0, 100.0) / 100.0 * (n - 1) as f64;
            let lo = rank.floor() as usize;
            let hi = (lo + 1).min(n - 1);
            let frac = rank - lo as f64;
            sorted[lo] + (sorted[hi] - sorted[lo]) * frac
        }
    }
}

/// Mean, standard deviation, median and requested percentiles of one metric.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub mean: f64,
    pub std: f64,
    pub median: f64,
    /// `(p, value)` for each requested percentile, in the order asked.
    pub percentiles: Vec<(f64, f64)>,
}

impl Summary {
    /// Summarises `xs` (any order; NaNs are dropped).
    pub fn of(xs: &[f64], percentiles: &[f64]) -> Self {
        let mut sorted: Vec<f64> = xs.iter().copied().filter(|x| !x.is_nan()).collect();
        sorted.sort_by(f64::total_cmp);
        Summary {
            mean: mean(&sorted),
            std: std_dev(&sorted),
            median: percentile_sorted(&sorted, 50.0),
            percentiles: percentiles.iter().map(|&p| (p, percentile_sorted(&sorted, p))).collect(),
        }
    }

    /// The value of percentile `p` if it was requested.
    pub fn percentile(&self, p: f64) -> Option<f64> {
        self.percentiles.iter().find(|(q, _)| *q == p).map(|(_, v)| *v)
    }
}
