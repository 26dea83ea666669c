//! Structured outputs: generation constrained to a JSON schema, a regular expression, a list of choices or a
//! grammar, with llguidance as the grammar engine (vLLM's and llama.cpp's too).
//!
//! The server turns a request's `response_format` / `structured_outputs` / `guided_*` fields into a `GrammarSpec`
//! and compiles it with the engine's `GrammarCompiler` (a bad spec is the request's 400; compiled grammars are
//! cached per spec). The engine thread keeps one `Constraint` per constrained request: before each sampling step it
//! computes the allowed-token mask of every constrained row (while the device runs the forward pass), the mask is
//! applied to the row's logits, and the sampled token advances the constraint. Unconstrained rows pay nothing.

mod compiler;
mod constraint;
mod gbnf;
mod regex_classes;
mod spec;
mod tok_env;

pub use compiler::{Grammar, GrammarCompiler, GrammarError};
pub use constraint::{apply_mask, Constraint, TokenMask};
pub use spec::GrammarSpec;
