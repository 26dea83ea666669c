//! One row's sampling settings as the samplers read them: the draw itself (temperature, top-k, top-p, min-p) and
//! where it sits in the request's random stream (seed, output position), packed into `SAMPLE_PARAM_WORDS` u32 words
//! for `Op::SampleRows`. The engine fills it from a request's sampling parameters.

use rserve_kernels::launch::SAMPLE_PARAM_WORDS;

/// Below this temperature a row is greedy (OpenAI's 0, and what rounding leaves of it).
pub const GREEDY_BELOW: f32 = 1e-5;

/// The draw of one row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowParams {
    /// Below `GREEDY_BELOW`: the most likely token.
    pub temperature: f32,
    /// 0: no top-k.
    pub top_k: u32,
    /// 1: no top-p.
    pub top_p: f32,
    /// 0: no min-p.
    pub min_p: f32,
    /// The request's seed (its own, or one the engine derived from its id).
    pub seed: u64,
    /// How many tokens the request has produced: the draw's place in its random stream.
    pub position: u64,
}

impl RowParams {
    /// The most likely token: what rows that do not sample this step (prefill chunks) are given.
    pub const GREEDY: RowParams =
        RowParams { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 0, position: 0 };

    /// Greedy: temperature 0, or top-k 1 at any temperature.
    pub fn is_greedy(&self) -> bool {
        self.temperature < GREEDY_BELOW || self.top_k == 1
    }

    /// The `SAMPLE_PARAM_WORDS` words `sample_rows` reads.
    pub fn pack(&self) -> [u32; SAMPLE_PARAM_WORDS] {
        [
            self.temperature.to_bits(),
            self.top_k,
            self.top_p.to_bits(),
            self.min_p.to_bits(),
            self.seed as u32,
            (self.seed >> 32) as u32,
            self.position as u32,
            (self.position >> 32) as u32,
        ]
    }

    /// The inverse of `pack` (`w` holds at least `SAMPLE_PARAM_WORDS` words).
    pub fn unpack(w: &[u32]) -> Self {
        Self {
            temperature: f32::from_bits(w[0]),
            top_k: w[1],
            top_p: f32::from_bits(w[2]),
            min_p: f32::from_bits(w[3]),
            seed: u64::from(w[4]) | (u64::from(w[5]) << 32),
            position: u64::from(w[6]) | (u64::from(w[7]) << 32),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_round_trips() {
        let p =
            RowParams { temperature: 0.7, top_k: 40, top_p: 0.9, min_p: 0.05, seed: u64::MAX - 5, position: 1 << 40 };
        assert_eq!(RowParams::unpack(&p.pack()), p);
        assert!(RowParams::GREEDY.is_greedy() && RowParams { top_k: 1, temperature: 2.0, ..p }.is_greedy());
        assert!(!p.is_greedy());
    }
}
