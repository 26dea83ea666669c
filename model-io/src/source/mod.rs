//! Model resolution: turns what the user typed (`--model`) into files on disk, a `ResolvedModel`.
//!
//! A spec is, in this order: a path to a `.gguf` file; a local folder (safetensors model, or a folder with one
//! `.gguf`); a Hub repo id (`org/name`), looked up in the Hugging Face cache (`hf_cache`) and, unless offline,
//! downloaded into it (`download`). Boundary: this module finds files; parsing them is `config`, `weights` and
//! `tokenizer`'s job. All inputs come from an explicit `ResolveOptions`; only `ResolveOptions::from_env` reads the
//! environment.

pub mod download;
pub mod hf_cache;
pub mod local;
mod options;

use std::path::{Path, PathBuf};

pub use options::{ResolveOptions, DEFAULT_ENDPOINT};

use crate::config::ModelParams;
use crate::{ModelError, Result};

/// The optional files that come with a model (each `None` when the folder does not have it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelFiles {
    pub tokenizer: Option<PathBuf>,
    pub tokenizer_config: Option<PathBuf>,
    pub chat_template: Option<PathBuf>,
    pub generation_config: Option<PathBuf>,
}

/// Where a safetensors model folder came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelOrigin {
    /// A folder the user named.
    Local,
    /// A snapshot already in the hub cache.
    HfCache { repo: String, revision: String, commit: String },
    /// A snapshot this resolve just downloaded.
    Downloaded { repo: String, revision: String },
}

/// A Hugging Face model folder: config.json plus safetensors weights.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SafetensorsModel {
    pub dir: PathBuf,
    pub config: PathBuf,
    /// The weight files: every shard named by the index, or the folder's `*.safetensors` files; sorted.
    pub safetensors: Vec<PathBuf>,
    /// `model.safetensors.index.json`, when the weights are sharded.
    pub index: Option<PathBuf>,
    pub files: ModelFiles,
    pub origin: ModelOrigin,
}

/// A single `.gguf` file (weights, config and tokenizer in one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufModel {
    pub file: PathBuf,
    /// The folder next to the file when it holds a tokenizer.json (used instead of the GGUF's tokenizer).
    pub tokenizer_dir: Option<PathBuf>,
    /// Tokenizer and generation files found next to the `.gguf`.
    pub files: ModelFiles,
}

/// The files of a resolved model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResolvedModel {
    Safetensors(SafetensorsModel),
    Gguf(GgufModel),
}

impl ResolvedModel {
    /// The tokenizer / generation files that come with the model.
    pub fn files(&self) -> &ModelFiles {
        match self {
            ResolvedModel::Safetensors(m) => &m.files,
            ResolvedModel::Gguf(m) => &m.files,
        }
    }

    /// The model folder, or the `.gguf` file.
    pub fn path(&self) -> &Path {
        match self {
            ResolvedModel::Safetensors(m) => &m.dir,
            ResolvedModel::Gguf(m) => &m.file,
        }
    }

    /// Reads and checks the model's configuration (config.json, or the GGUF metadata).
    pub fn load_params(&self) -> Result<ModelParams> {
        match self {
            ResolvedModel::Safetensors(m) => crate::config::hf::parse_config_file(&m.config),
            ResolvedModel::Gguf(m) => crate::config::gguf_meta::params_from_gguf_file(&m.file),
        }
    }
}

fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Resolves a model spec to files on disk, downloading from the Hub when the options allow it.
///
/// Errors: `ModelNotFound` (naming every path that was searched) when nothing matches, or when the repo is not in
/// the cache and `opts.offline` is set; `Download` when the Hub could not deliver it.
pub fn resolve_model(spec: &str, opts: &ResolveOptions) -> Result<ResolvedModel> {
    let spec = spec.trim();
    if spec.is_empty() {
        return Err(ModelError::InvalidArgument("the model name is empty".into()));
    }
    let path = Path::new(spec);
    if local::is_gguf_path(path) {
        return if path.is_file() {
            Ok(local::gguf_model(path))
        } else {
            Err(ModelError::ModelNotFound { model: spec.to_string(), searched: vec![absolute(path)] })
        };
    }
    if path.is_dir() {
        return local::resolve_dir(spec, path);
    }
    if path.is_file() {
        return Err(ModelError::InvalidArgument(format!(
            "'{spec}' is a file but not a .gguf; pass a model folder, a .gguf file or a Hub repo id"
        )));
    }
    let mut searched = vec![absolute(path)];
    if !hf_cache::is_repo_id(spec) {
        return Err(ModelError::ModelNotFound { model: spec.to_string(), searched });
    }
    let revision = opts.revision_or_main();
    match hf_cache::lookup(&opts.cache_dir, spec, revision)? {
        hf_cache::CacheLookup::Found(model) => return Ok(ResolvedModel::Safetensors(model)),
        hf_cache::CacheLookup::NotFound(paths) => searched.extend(paths),
    }
    if opts.offline {
        return Err(ModelError::ModelNotFound { model: format!("{spec}@{revision} (offline)"), searched });
    }
    let snapshot = download::download_repo(spec, revision, opts)?;
    let origin = ModelOrigin::Downloaded { repo: spec.to_string(), revision: revision.to_string() };
    match local::scan_dir(&snapshot, origin)? {
        local::DirScan::Complete(model) => Ok(ResolvedModel::Safetensors(model)),
        local::DirScan::Missing(missing) => Err(ModelError::Download {
            model: spec.to_string(),
            message: format!(
                "after downloading, the snapshot still lacks: {}",
                missing.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
            ),
        }),
    }
}

/// Resolves `--tokenizer`: a folder holding `tokenizer.json`, or a Hub repo id found in the cache (a snapshot with a
/// `tokenizer.json`) or, unless offline, downloaded into it (tokenizer files only). Returns the folder.
pub fn resolve_tokenizer(spec: &str, opts: &ResolveOptions) -> Result<PathBuf> {
    let spec = spec.trim();
    let path = Path::new(spec);
    if path.is_dir() {
        return Ok(path.to_path_buf());
    }
    let mut searched = vec![absolute(path)];
    if !hf_cache::is_repo_id(spec) {
        return Err(ModelError::ModelNotFound { model: format!("tokenizer {spec}"), searched });
    }
    let revision = opts.revision_or_main();
    match hf_cache::snapshot_dir(&opts.cache_dir, spec, revision) {
        Ok((_, dir)) if dir.join(local::TOKENIZER).is_file() => return Ok(dir),
        Ok((_, dir)) => searched.push(dir.join(local::TOKENIZER)),
        Err(paths) => searched.extend(paths),
    }
    if opts.offline {
        return Err(ModelError::ModelNotFound { model: format!("tokenizer {spec}@{revision} (offline)"), searched });
    }
    download::download_tokenizer(spec, revision, opts)
}
