//! Turning one sequence's logits into its next token: `allowed_token_ids` and `bad_words` (`masks`), penalties and
//! logit bias (`penalties`), then greedy or
//! temperature / top-k / top-p / min-p sampling with a per-request RNG (`sampler`), and log-probs of the raw model
//! distribution (`logprobs`).

pub mod logprobs;
pub mod masks;
pub mod penalties;
pub mod sampler;

pub use sampler::{argmax, sample, Sampled};
