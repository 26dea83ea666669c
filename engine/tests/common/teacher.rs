//! Two paths compared teacher-forced (both fed the reference's greedy tokens, so every step has the same context):
//! what the packed-weight tests assert where activation quantization moves log-probs but must not move a choice the
//! reference is sure of.

use rserve_engine::sampling::argmax;
use rserve_engine::sampling::logprobs::log_softmax;

/// Checks each prompt's steps of logits `got` against the reference's `want`: the first step's top-20 (by the
/// reference) log-probs within `logprob_tol`, the same argmax wherever the reference's top-2 log-prob margin exceeds
/// `margin` nats, and at least a quarter of the steps having such a margin. Prints both numbers per prompt.
pub fn compare(got: &[Vec<Vec<f32>>], want: &[Vec<Vec<f32>>], margin: f32, logprob_tol: f32, what: &str) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let (a, b) = (log_softmax(&g[0]), log_softmax(&w[0]));
        let mut top: Vec<usize> = (0..b.len()).collect();
        top.sort_by(|&x, &y| b[y].total_cmp(&b[x]));
        let d = top[..20].iter().map(|&t| (a[t] - b[t]).abs()).fold(0f32, f32::max);
        let (mut checked, mut same) = (0, 0);
        for (step, (gl, wl)) in g.iter().zip(w).enumerate() {
            let lp = log_softmax(wl);
            let mut order: Vec<usize> = (0..lp.len()).collect();
            order.sort_by(|&x, &y| lp[y].total_cmp(&lp[x]));
            let m = lp[order[0]] - lp[order[1]];
            let equal = argmax(gl) == argmax(wl);
            same += equal as usize;
            if m > margin {
                checked += 1;
                assert!(equal, "{what}, prompt {i} step {step}: another token at a reference margin of {m}");
            }
        }
        eprintln!(
            "prompt {i}: top-20 first-token logprob difference {d:.4}; {same} of {} greedy tokens equal, {checked} \
             with a margin over {margin}",
            w.len()
        );
        assert!(d < logprob_tol, "{what}, prompt {i}: a top-20 first-token logprob moved by {d}");
        assert!(checked >= w.len() / 4, "{what}, prompt {i}: only {checked} steps had a margin to check");
    }
}
