//! Reading a model folder from disk: which of the expected files it holds (config, safetensors weights, tokenizer
//! files) and which are missing. Used for local folders, Hub cache snapshots and freshly downloaded snapshots alike.

use std::path::{Path, PathBuf};

use super::{GgufModel, ModelFiles, ModelOrigin, ResolvedModel, SafetensorsModel};
use crate::{ModelError, Result};

pub const CONFIG: &str = "config.json";
pub const SAFETENSORS_INDEX: &str = "model.safetensors.index.json";
pub const SINGLE_SAFETENSORS: &str = "model.safetensors";
pub const TOKENIZER: &str = "tokenizer.json";
pub const TOKENIZER_CONFIG: &str = "tokenizer_config.json";
pub const CHAT_TEMPLATE: &str = "chat_template.jinja";
pub const GENERATION_CONFIG: &str = "generation_config.json";

/// The result of looking into a folder: a complete model, or the paths that were expected and not found.
#[allow(clippy::large_enum_variant)] // short-lived; returned once per scan
pub enum DirScan {
    Complete(SafetensorsModel),
    Missing(Vec<PathBuf>),
}

fn existing(dir: &Path, name: &str) -> Option<PathBuf> {
    let p = dir.join(name);
    p.is_file().then_some(p)
}

/// The optional tokenizer and generation files of a folder.
pub fn model_files(dir: &Path) -> ModelFiles {
    ModelFiles {
        tokenizer: existing(dir, TOKENIZER),
        tokenizer_config: existing(dir, TOKENIZER_CONFIG),
        chat_template: existing(dir, CHAT_TEMPLATE),
        generation_config: existing(dir, GENERATION_CONFIG),
    }
}

/// The shard file names listed in a `model.safetensors.index.json`, sorted and without duplicates.
pub fn shards_from_index(index: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(index).map_err(|source| ModelError::Io { path: index.to_path_buf(), source })?;
    shards_from_index_text(&text).map_err(|msg| ModelError::Weights(format!("{}: {msg}", index.display())))
}

/// Parses the `weight_map` of a safetensors index.
pub fn shards_from_index_text(text: &str) -> std::result::Result<Vec<String>, String> {
    #[derive(serde::Deserialize)]
    struct Index {
        weight_map: std::collections::BTreeMap<String, String>,
    }
    let index: Index = serde_json::from_str(text).map_err(|e| format!("not a valid safetensors index: {e}"))?;
    let mut shards: Vec<String> = index.weight_map.into_values().collect();
    shards.sort();
    shards.dedup();
    if shards.is_empty() {
        return Err("the index lists no tensors".into());
    }
    if let Some(bad) = shards.iter().find(|s| s.contains("..") || s.starts_with('/') || s.contains('\\')) {
        return Err(format!("shard name '{bad}' points outside the model folder"));
    }
    Ok(shards)
}

/// Looks for a safetensors model in `dir`.
pub fn scan_dir(dir: &Path, origin: ModelOrigin) -> Result<DirScan> {
    let config = dir.join(CONFIG);
    let mut missing = Vec::new();
    if !config.is_file() {
        missing.push(config.clone());
    }
    let index = existing(dir, SAFETENSORS_INDEX);
    let safetensors: Vec<PathBuf> = match &index {
        Some(index) => {
            let shards: Vec<PathBuf> = shards_from_index(index)?.iter().map(|s| dir.join(s)).collect();
            missing.extend(shards.iter().filter(|p| !p.is_file()).cloned());
            shards
        }
        None => {
            let mut found: Vec<PathBuf> = match std::fs::read_dir(dir) {
                Ok(entries) => entries
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|e| e == "safetensors") && p.is_file())
                    .collect(),
                Err(_) => Vec::new(),
            };
            found.sort();
            if found.is_empty() {
                missing.push(dir.join(SINGLE_SAFETENSORS));
                missing.push(dir.join(SAFETENSORS_INDEX));
            }
            found
        }
    };
    if !missing.is_empty() {
        return Ok(DirScan::Missing(missing));
    }
    Ok(DirScan::Complete(SafetensorsModel {
        dir: dir.to_path_buf(),
        config,
        safetensors,
        index,
        files: model_files(dir),
        origin,
    }))
}

/// The `.gguf` files directly inside `dir`, sorted.
pub fn gguf_files_in(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(entries) => {
            entries.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| is_gguf_path(p) && p.is_file()).collect()
        }
        Err(_) => Vec::new(),
    };
    found.sort();
    found
}

/// Whether a path names a GGUF file by its extension.
pub fn is_gguf_path(path: &Path) -> bool {
    path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

/// A `.gguf` file, with the tokenizer files that sit next to it.
pub fn gguf_model(file: &Path) -> ResolvedModel {
    let dir = file.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let files = model_files(dir);
    let tokenizer_dir = files.tokenizer.is_some().then(|| dir.to_path_buf());
    ResolvedModel::Gguf(GgufModel { file: file.to_path_buf(), tokenizer_dir, files })
}

/// Resolves a local folder: a safetensors model (config.json + weights), or a folder holding exactly one `.gguf`.
pub fn resolve_dir(spec: &str, dir: &Path) -> Result<ResolvedModel> {
    match scan_dir(dir, ModelOrigin::Local)? {
        DirScan::Complete(model) => Ok(ResolvedModel::Safetensors(model)),
        DirScan::Missing(missing) => {
            let ggufs = gguf_files_in(dir);
            let has_config = dir.join(CONFIG).is_file();
            match ggufs.as_slice() {
                [one] if !has_config => Ok(gguf_model(one)),
                many if many.is_empty() || has_config => {
                    Err(ModelError::ModelNotFound { model: spec.to_string(), searched: missing })
                }
                many => Err(ModelError::InvalidArgument(format!(
                    "'{spec}' has no complete safetensors model and {} .gguf files ({}); pass the .gguf file itself",
                    many.len(),
                    many.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
                ))),
            }
        }
    }
}
