//! A row's mask as bits (one per token): how grammar masks and bans reach `Op::MaskLogits`.

/// Sets each logit of `row` whose bit is clear in `words` (bit `t % 32` of word `t / 32` for token `t`) to -inf;
/// ids past the words are ruled out too.
pub fn apply_bits(row: &mut [f32], words: &[u32]) {
    for (w, chunk) in row.chunks_mut(32).enumerate() {
        let bits = words.get(w).copied().unwrap_or(0);
        // Most of a constrained vocabulary is ruled out: a word of zero bits is one fill.
        if bits == 0 {
            chunk.fill(f32::NEG_INFINITY);
        } else if bits != u32::MAX {
            for (b, x) in chunk.iter_mut().enumerate() {
                if bits & (1 << b) == 0 {
                    *x = f32::NEG_INFINITY;
                }
            }
        }
    }
}
