//! What rserve reads from a Hugging Face `tokenizer_config.json`: the BOS/EOS/PAD/UNK token strings and the
//! `add_bos_token` / `add_eos_token` flags. Token entries may be a plain string or an added-token object with a
//! `content` field; anything else is ignored rather than failing the load.

use std::path::Path;

use serde_json::Value;

use crate::error::{ModelError, Result};

/// The special-token facts of a `tokenizer_config.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct HfTokenizerConfig {
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub pad_token: Option<String>,
    pub unk_token: Option<String>,
    pub add_bos_token: Option<bool>,
    pub add_eos_token: Option<bool>,
}

impl HfTokenizerConfig {
    pub(crate) fn read(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ModelError::Io { path: path.to_path_buf(), source })?;
        let value: Value = serde_json::from_str(&text)
            .map_err(|e| ModelError::Tokenizer(format!("{}: invalid JSON: {e}", path.display())))?;
        Ok(Self::from_json(&value))
    }

    pub(crate) fn from_json(value: &Value) -> Self {
        Self {
            bos_token: token_string(value.get("bos_token")),
            eos_token: token_string(value.get("eos_token")),
            pad_token: token_string(value.get("pad_token")),
            unk_token: token_string(value.get("unk_token")),
            add_bos_token: value.get("add_bos_token").and_then(Value::as_bool),
            add_eos_token: value.get("add_eos_token").and_then(Value::as_bool),
        }
    }
}

/// `"<s>"` or `{"content": "<s>", ...}` -> `Some("<s>")`; `null`, absent or other shapes -> `None`.
fn token_string(value: Option<&Value>) -> Option<String> {
    match value? {
        Value::String(s) => Some(s.clone()),
        Value::Object(map) => map.get("content").and_then(Value::as_str).map(str::to_owned),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_both_token_shapes_and_flags() {
        let json = serde_json::json!({
            "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": false},
            "eos_token": "</s>",
            "pad_token": null,
            "add_bos_token": true
        });
        let config = HfTokenizerConfig::from_json(&json);
        assert_eq!(config.bos_token.as_deref(), Some("<s>"));
        assert_eq!(config.eos_token.as_deref(), Some("</s>"));
        assert_eq!(config.pad_token, None);
        assert_eq!(config.add_bos_token, Some(true));
        assert_eq!(config.add_eos_token, None);
    }
}
