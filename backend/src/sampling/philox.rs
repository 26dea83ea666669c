//! Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"): the counter-based generator every
//! sampler uses. A draw is a pure function of the request's seed and the draw's place (output position, rejection
//! round), so a seeded request gets the same numbers alone, in any batch, after preemption and on every backend
//! (`kernels/src/cl/sampling.cl` computes the same words).

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

/// The four output words of Philox4x32-10 for `counter` under `key`.
pub fn philox4x32(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (counter, key);
    for _ in 0..10 {
        let p0 = u64::from(M0) * u64::from(c[0]);
        let p1 = u64::from(M1) * u64::from(c[2]);
        c = [(p1 >> 32) as u32 ^ c[1] ^ k[0], p1 as u32, (p0 >> 32) as u32 ^ c[3] ^ k[1], p0 as u32];
        k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
    }
    c
}

/// A uniform number in [0, 1) with 24 random bits: the draw of round `round` at output position `position` of the
/// request seeded `seed`.
pub fn uniform(seed: u64, position: u64, round: u32) -> f32 {
    let w = philox4x32([position as u32, (position >> 32) as u32, round, 0], [seed as u32, (seed >> 32) as u32]);
    (w[0] >> 8) as f32 * (1.0 / 16_777_216.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_answers_of_the_random123_suite() {
        // Random123's kat_vectors for philox4x32_10.
        assert_eq!(philox4x32([0; 4], [0; 2]), [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]);
        assert_eq!(philox4x32([u32::MAX; 4], [u32::MAX; 2]), [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]);
        assert_eq!(
            philox4x32([0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344], [0xa409_3822, 0x299f_31d0]),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
    }

    #[test]
    fn uniforms_are_in_range_and_differ_by_place() {
        let u: Vec<f32> = (0..1000).map(|i| uniform(42, i, 0)).collect();
        assert!(u.iter().all(|&x| (0.0..1.0).contains(&x)));
        let mean = u.iter().sum::<f32>() / u.len() as f32;
        assert!((mean - 0.5).abs() < 0.05, "{mean}");
        assert_ne!(uniform(42, 3, 0), uniform(42, 3, 1));
        assert_ne!(uniform(42, 3, 0), uniform(43, 3, 0));
        assert_eq!(uniform(42, 3, 0), uniform(42, 3, 0));
    }
}
