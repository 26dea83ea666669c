//! Turning logits into next tokens, the same pipeline on every backend: rows' bans and grammar masks (`masks`),
//! log-probs of the raw distribution (`logprobs`), penalties and logit bias as sparse edits (`adjust`), then the draw
//! (`draw`: temperature, top-k, top-p, min-p by rejection, no vocabulary sort) from each request's counter-based
//! random stream (`philox`); the row-level math is `rserve_backend::sampling`'s, re-exported here. `step` is one step's choice as runners take it (and its host form); `device` runs it
//! as ops on a backend. `reference` (the exact distribution, chi-square) and `penalties` (dense penalties) are the
//! slow references the tests hold the samplers to.

pub mod adjust;
pub mod device;
pub mod masks;
pub mod penalties;
pub mod prompt;
pub mod reference;
pub mod step;

pub use rserve_backend::sampling::{argmax, RowParams};
/// The row-level math (the draw, its random stream, packed settings, log-probs) lives with the backends, whose CPU
/// sampling ops it is.
pub use rserve_backend::sampling::{draw, logprobs, params, philox};
pub use step::row_params;
pub use step::{RowLogprobs, SampledRows, StepSampling, NO_LOGPROBS};
