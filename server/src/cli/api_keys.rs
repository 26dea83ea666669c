//! The API keys the `/v1` routes accept: `--api-key` (or `VLLM_API_KEY`, as vLLM) and `--api-key-file` (rserve's: one
//! key per line, so a key need not appear in the process list, a job script or the shell history). Keys are never
//! logged: `--help` hides the environment's value and nothing prints them.

use std::path::Path;

use super::{CliError, FrontendArgs};

impl FrontendArgs {
    /// Every configured key: those of `--api-key` / `VLLM_API_KEY` (empty ones dropped), then the lines of
    /// `--api-key-file` (blank lines and `#` comments skipped). Empty when no key is configured (no check).
    pub fn api_keys(&self) -> Result<Vec<String>, CliError> {
        let mut keys: Vec<String> = self.api_key.iter().filter(|k| !k.is_empty()).cloned().collect();
        if let Some(path) = &self.api_key_file {
            keys.extend(read_key_file(path)?);
        }
        Ok(keys)
    }
}

fn read_key_file(path: &Path) -> Result<Vec<String>, CliError> {
    // The error names the file and the reason, never its content.
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::ApiKeyFile(format!("cannot read {}: {}", path.display(), e.kind())))?;
    let keys: Vec<String> =
        text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(str::to_owned).collect();
    if keys.is_empty() {
        return Err(CliError::ApiKeyFile(format!("{} holds no key (one key per line)", path.display())));
    }
    Ok(keys)
}
