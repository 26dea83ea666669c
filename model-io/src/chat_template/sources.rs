//! Where a model's chat template comes from, in order of precedence:
//! 1. the `--chat-template` override: a file path, or the template text itself when no such file exists and the
//!    text contains `{`;
//! 2. `chat_template.jinja` in the model directory;
//! 3. `chat_template` in the model directory's `tokenizer_config.json` (a string, or a list of `{name, template}`
//!    from which the one named "default" is taken);
//! 4. GGUF metadata `tokenizer.chat_template`.
//!
//! None of them -> no template (`None`); the caller reports that chat requests need one. Nothing is guessed.

use std::fmt;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, Value};

use crate::error::{ModelError, Result};

/// The places to look for a template. Any of them may be absent.
#[derive(Debug, Clone, Copy, Default)]
pub struct TemplateSources<'a> {
    /// The `--chat-template` argument: a file, or an inline template.
    pub override_template: Option<&'a str>,
    /// The model's directory (Hugging Face layout), for `chat_template.jinja` and `tokenizer_config.json`.
    pub model_dir: Option<&'a Path>,
    /// A GGUF file's metadata.
    pub gguf: Option<&'a Content>,
}

/// Which source a template was taken from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateOrigin {
    /// Passed directly to `ChatTemplate::new` / `for_tokenizer`.
    Given,
    /// The `--chat-template` file.
    OverrideFile(PathBuf),
    /// The `--chat-template` argument itself.
    OverrideInline,
    /// `chat_template.jinja` in the model directory.
    JinjaFile(PathBuf),
    /// `tokenizer_config.json`'s `chat_template`.
    TokenizerConfig(PathBuf),
    /// GGUF metadata `tokenizer.chat_template`.
    Gguf,
}

impl fmt::Display for TemplateOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Given => write!(f, "the chat template"),
            Self::OverrideFile(p) => write!(f, "chat template file {}", p.display()),
            Self::OverrideInline => write!(f, "the --chat-template text"),
            Self::JinjaFile(p) => write!(f, "{}", p.display()),
            Self::TokenizerConfig(p) => write!(f, "chat_template of {}", p.display()),
            Self::Gguf => write!(f, "GGUF tokenizer.chat_template"),
        }
    }
}

impl TemplateSources<'_> {
    /// The first template found, with where it came from.
    pub(crate) fn find(&self) -> Result<Option<(String, TemplateOrigin)>> {
        if let Some(arg) = self.override_template {
            return from_override(arg).map(Some);
        }
        if let Some(dir) = self.model_dir {
            let jinja = dir.join("chat_template.jinja");
            if jinja.is_file() {
                return Ok(Some((read(&jinja)?, TemplateOrigin::JinjaFile(jinja))));
            }
            let config = dir.join("tokenizer_config.json");
            if config.is_file() {
                if let Some(template) = from_tokenizer_config(&config)? {
                    return Ok(Some((template, TemplateOrigin::TokenizerConfig(config))));
                }
            }
        }
        if let Some(content) = self.gguf {
            match content.metadata.get("tokenizer.chat_template") {
                Some(Value::String(s)) => return Ok(Some((s.clone(), TemplateOrigin::Gguf))),
                Some(_) => return Err(ModelError::ChatTemplate("GGUF tokenizer.chat_template is not a string".into())),
                None => {}
            }
        }
        Ok(None)
    }
}

fn from_override(arg: &str) -> Result<(String, TemplateOrigin)> {
    let path = Path::new(arg);
    if path.is_file() {
        return Ok((read(path)?, TemplateOrigin::OverrideFile(path.to_path_buf())));
    }
    if arg.contains('{') {
        return Ok((arg.to_owned(), TemplateOrigin::OverrideInline));
    }
    Err(ModelError::ChatTemplate(format!(
        "--chat-template '{arg}' is not a file, and does not look like a template (no '{{')"
    )))
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| ModelError::Io { path: path.to_path_buf(), source })
}

/// `chat_template` of a `tokenizer_config.json`: a string, or the "default" entry of a `[{name, template}]` list.
fn from_tokenizer_config(path: &Path) -> Result<Option<String>> {
    let json: serde_json::Value = serde_json::from_str(&read(path)?)
        .map_err(|e| ModelError::ChatTemplate(format!("{}: invalid JSON: {e}", path.display())))?;
    match json.get("chat_template") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
        Some(serde_json::Value::Array(entries)) => {
            let mut names = Vec::new();
            for entry in entries {
                let name = entry.get("name").and_then(serde_json::Value::as_str);
                let template = entry.get("template").and_then(serde_json::Value::as_str);
                match (name, template) {
                    (Some("default"), Some(t)) => return Ok(Some(t.to_owned())),
                    (Some(n), Some(_)) => names.push(n.to_owned()),
                    _ => {
                        return Err(ModelError::ChatTemplate(format!(
                            "{}: chat_template list entries need string 'name' and 'template'",
                            path.display()
                        )))
                    }
                }
            }
            Err(ModelError::ChatTemplate(format!(
                "{}: has named chat templates ({}) but none named 'default'; choose one with --chat-template",
                path.display(),
                names.join(", ")
            )))
        }
        Some(_) => Err(ModelError::ChatTemplate(format!(
            "{}: chat_template must be a string or a list of {{name, template}}",
            path.display()
        ))),
    }
}
