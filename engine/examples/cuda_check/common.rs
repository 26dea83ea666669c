//! What the jobs of `cuda_check` share: the result type and random inputs.

use rand::rngs::StdRng;
use rand::Rng;

/// Every job's result: any error ends the run.
pub type R<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// `n` values drawn uniformly from `(-a, a)`.
pub fn rand_vec(rng: &mut StdRng, n: usize, a: f32) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-a..a)).collect()
}
