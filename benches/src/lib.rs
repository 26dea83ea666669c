//! The rserve benchmark crate: criterion benches live in `benches/`.
