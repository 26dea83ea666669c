//! (in progress)
pub struct Tokenizer;
