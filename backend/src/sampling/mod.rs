//! The row-level sampling math every backend shares: the draw (`draw`: temperature, top-k, top-p, min-p by
//! rejection rounds, no vocabulary sort) from a counter-based random stream (`philox`), a row's packed settings
//! (`params`), log-probs (`logprobs`), sparse logit edits (`edit`) and mask bits (`mask_bits`). The CPU backend's
//! sampling ops are these functions; the device kernels (`kernels/src/cl/sampling.cl`) are tested against them.
//! Building a step's rows from requests is the engine's (`rserve_engine::sampling`).

pub mod draw;
mod edit;
pub mod logprobs;
mod mask_bits;
pub mod params;
pub mod philox;

pub use draw::argmax;
pub use edit::Edit;
pub use mask_bits::apply_bits;
pub use params::RowParams;

/// A row that wants no log-probs (in `Op::RowLogprobs`' per-row counts).
pub const NO_LOGPROBS: u32 = u32::MAX;
