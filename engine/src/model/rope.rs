//! Rotary embedding frequencies, including Llama 3.x's `llama3` frequency scaling, computed once at load.

use crate::config::Llama3RopeScaling;

/// `inv_freq[i] = theta^(-2i/head_dim)`, rescaled per Llama 3's piecewise rule when `scaling` is set.
pub fn inv_freq(head_dim: usize, theta: f64, scaling: Option<&Llama3RopeScaling>) -> Vec<f32> {
    let base: Vec<f64> = (0..head_dim / 2).map(|i| 1.0 / theta.powf((2 * i) as f64 / head_dim as f64)).collect();
    let Some(s) = scaling else {
        return base.into_iter().map(|f| f as f32).collect();
    };
    let old = s.original_max_position_embeddings as f64;
    let low_wavelen = old / s.low_freq_factor;
    let high_wavelen = old / s.high_freq_factor;
    base.into_iter()
        .map(|f| {
            let wavelen = 2.0 * std::f64::consts::PI / f;
            let scaled = if wavelen < high_wavelen {
                f
            } else if wavelen > low_wavelen {
                f / s.factor
            } else {
                let smooth = (old / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
                (1.0 - smooth) * f / s.factor + smooth * f
            };
            scaled as f32
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unscaled_matches_the_closed_form() {
        let f = inv_freq(64, 10000.0, None);
        assert_eq!(f.len(), 32);
        assert_eq!(f[0], 1.0);
        assert!((f[16] - (10000f64.powf(-0.5)) as f32).abs() < 1e-9);
    }

    #[test]
    fn llama3_scaling_divides_low_frequencies_and_keeps_high_ones() {
        let s = Llama3RopeScaling {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        };
        let plain = inv_freq(128, 500000.0, None);
        let scaled = inv_freq(128, 500000.0, Some(&s));
        assert_eq!(plain[0], scaled[0]);
        let last = plain.len() - 1;
        assert!((scaled[last] - plain[last] / 8.0).abs() < 1e-12);
    }
}
