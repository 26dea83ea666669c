//! Rotary embedding frequencies, computed once at load for each RoPE a model has (Gemma 3's sliding layers have
//! their own), with the checkpoint's frequency scaling: `llama3`, `linear`, `dynamic` (as vLLM applies it), `yarn`
//! and `longrope` (a second table of long factors), following transformers' `modeling_rope_utils`, and GGUF's
//! per-frequency factors (`rope_freqs.weight`).

use crate::config::{Llama3RopeScaling, LongRopeScaling, Rope, RopeScaling, YarnRopeScaling};

/// What `Op::RopeWriteKv` reads for one RoPE: `inv_freq` (one table of `head_dim / 2`, or two with LongRoPE: short
/// then long factors) and the cos/sin multiplier.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeTable {
    pub inv_freq: Vec<f32>,
    pub mscale: f32,
    /// LongRoPE: a sequence whose context is longer than this reads the long table (`FlatBatch` sets bit 31 of its
    /// positions), as transformers switches factors when the sequence outgrows the original length.
    pub long_after: Option<usize>,
}

/// `theta^(-2i/head_dim)` for `i < head_dim / 2`.
fn base(head_dim: usize, theta: f64) -> Vec<f64> {
    (0..head_dim / 2).map(|i| 1.0 / theta.powf((2 * i) as f64 / head_dim as f64)).collect()
}

fn to_f32(v: impl IntoIterator<Item = f64>) -> Vec<f32> {
    v.into_iter().map(|f| f as f32).collect()
}

/// The table of `rope` for heads of `head_dim` in a model of `max_position_embeddings` positions.
pub fn table(head_dim: usize, rope: &Rope, max_position_embeddings: usize) -> RopeTable {
    let plain = |inv: Vec<f64>| RopeTable { inv_freq: to_f32(inv), mscale: 1.0, long_after: None };
    let b = base(head_dim, rope.theta);
    match &rope.scaling {
        None => plain(b),
        Some(RopeScaling::Llama3(s)) => plain(llama3(b, s)),
        Some(RopeScaling::Linear { factor }) => plain(b.into_iter().map(|f| f / factor).collect()),
        Some(RopeScaling::Dynamic { factor }) => {
            // vLLM's DynamicNTKScalingRotaryEmbedding: the base scaled for max_position_embeddings x factor.
            let d = head_dim as f64;
            let max_len = max_position_embeddings as f64 * factor;
            let theta =
                rope.theta * ((factor * max_len / max_position_embeddings as f64) - (factor - 1.0)).powf(d / (d - 2.0));
            plain(base(head_dim, theta))
        }
        Some(RopeScaling::Yarn(s)) => RopeTable {
            inv_freq: to_f32(yarn(head_dim, rope.theta, s)),
            mscale: s.attention_factor as f32,
            long_after: None,
        },
        Some(RopeScaling::LongRope(s)) => longrope(b, s),
        Some(RopeScaling::Factors(f)) => plain(b.iter().zip(f).map(|(b, f)| b / f).collect()),
    }
}

/// Llama 3's piecewise rule: low frequencies divided by `factor`, high ones kept, a smooth blend between.
fn llama3(base: Vec<f64>, s: &Llama3RopeScaling) -> Vec<f64> {
    let old = s.original_max_position_embeddings as f64;
    let low_wavelen = old / s.low_freq_factor;
    let high_wavelen = old / s.high_freq_factor;
    base.into_iter()
        .map(|f| {
            let wavelen = 2.0 * std::f64::consts::PI / f;
            if wavelen < high_wavelen {
                f
            } else if wavelen > low_wavelen {
                f / s.factor
            } else {
                let smooth = (old / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
                (1.0 - smooth) * f / s.factor + smooth * f
            }
        })
        .collect()
}

/// YaRN: interpolated frequencies below the `beta_slow` rotation count, extrapolated ones above `beta_fast`, a
/// linear ramp between (transformers' `_compute_yarn_parameters`).
fn yarn(head_dim: usize, theta: f64, s: &YarnRopeScaling) -> Vec<f64> {
    let d = head_dim as f64;
    let original = s.original_max_position_embeddings as f64;
    let correction_dim =
        |rotations: f64| d * (original / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * theta.ln());
    let (mut low, mut high) = (correction_dim(s.beta_fast), correction_dim(s.beta_slow));
    if s.truncate {
        low = low.floor();
        high = high.ceil();
    }
    let (low, mut high) = (low.max(0.0), high.min(d - 1.0));
    if low == high {
        high += 0.001;
    }
    (0..head_dim / 2)
        .map(|i| {
            let pos_freq = theta.powf((2 * i) as f64 / d);
            let (extrapolation, interpolation) = (1.0 / pos_freq, 1.0 / (s.factor * pos_freq));
            let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
            let extrapolation_factor = 1.0 - ramp;
            interpolation * (1.0 - extrapolation_factor) + extrapolation * extrapolation_factor
        })
        .collect()
}

/// LongRoPE: the base frequencies divided by the short factors, then by the long ones (two tables).
fn longrope(base: Vec<f64>, s: &LongRopeScaling) -> RopeTable {
    let short = base.iter().zip(&s.short_factor).map(|(f, e)| f / e);
    let long = base.iter().zip(&s.long_factor).map(|(f, e)| f / e);
    RopeTable {
        inv_freq: to_f32(short.chain(long)),
        mscale: s.attention_factor as f32,
        long_after: Some(s.original_max_position_embeddings),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rope(theta: f64, scaling: Option<RopeScaling>) -> Rope {
        Rope { theta, scaling }
    }

    /// Llama 3.1's `rope_scaling`.
    fn llama31() -> Llama3RopeScaling {
        Llama3RopeScaling {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        }
    }

    #[test]
    fn unscaled_matches_the_closed_form() {
        let t = table(64, &rope(10000.0, None), 2048);
        assert_eq!(t.inv_freq.len(), 32);
        assert_eq!(t.inv_freq[0], 1.0);
        assert!((t.inv_freq[16] - (10000f64.powf(-0.5)) as f32).abs() < 1e-9);
        assert_eq!((t.mscale, t.long_after), (1.0, None));
    }

    #[test]
    fn llama3_scaling_divides_low_frequencies_and_keeps_high_ones() {
        let s = llama31();
        let plain = table(128, &rope(500000.0, None), 8192).inv_freq;
        let scaled = table(128, &rope(500000.0, Some(RopeScaling::Llama3(s))), 8192).inv_freq;
        assert_eq!(plain[0], scaled[0]);
        let last = plain.len() - 1;
        assert!((scaled[last] - plain[last] / 8.0).abs() < 1e-12);
    }

    #[test]
    fn gguf_rope_freqs_equal_the_llama3_rule_they_encode() {
        // llama.cpp writes llama3 scaling as 1 / (scaled / base) per frequency: dividing by them gives the same table.
        let s = llama31();
        let plain = table(128, &rope(500000.0, None), 8192).inv_freq;
        let llama3 = table(128, &rope(500000.0, Some(RopeScaling::Llama3(s))), 8192).inv_freq;
        let factors = plain.iter().zip(&llama3).map(|(p, l)| f64::from(*p) / f64::from(*l)).collect();
        let from_factors = table(128, &rope(500000.0, Some(RopeScaling::Factors(factors))), 8192).inv_freq;
        for (a, b) in from_factors.iter().zip(&llama3) {
            assert!((a - b).abs() <= b * 1e-6);
        }
    }

    #[test]
    fn linear_divides_every_frequency() {
        let plain = table(64, &rope(1e6, None), 4096).inv_freq;
        let scaled = table(64, &rope(1e6, Some(RopeScaling::Linear { factor: 8.0 })), 4096).inv_freq;
        for (p, s) in plain.iter().zip(&scaled) {
            assert!((s - p / 8.0).abs() <= p * 1e-6);
        }
    }

    #[test]
    fn yarn_keeps_high_frequencies_and_interpolates_low_ones() {
        let s = YarnRopeScaling {
            factor: 4.0,
            original_max_position_embeddings: 32768,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attention_factor: 0.1 * 4f64.ln() + 1.0,
            truncate: true,
        };
        let plain = table(128, &rope(1e6, None), 32768).inv_freq;
        let t = table(128, &rope(1e6, Some(RopeScaling::Yarn(s))), 131072);
        assert_eq!(t.inv_freq[0], plain[0]);
        let last = plain.len() - 1;
        assert!((t.inv_freq[last] - plain[last] / 4.0).abs() <= plain[last] * 1e-6);
        assert!((t.mscale - 1.138_629_4).abs() < 1e-6);
    }

    #[test]
    fn longrope_holds_short_then_long_tables() {
        let s = LongRopeScaling {
            short_factor: vec![1.0, 2.0],
            long_factor: vec![4.0, 8.0],
            original_max_position_embeddings: 64,
            attention_factor: 1.2,
        };
        let t = table(4, &rope(100.0, Some(RopeScaling::LongRope(s))), 256);
        assert_eq!(t.inv_freq, vec![1.0, 0.1 / 2.0, 0.25, 0.1 / 8.0]);
        assert_eq!((t.mscale, t.long_after), (1.2, Some(64)));
    }
}
