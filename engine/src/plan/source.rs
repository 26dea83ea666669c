//! Finding what the planner reads: a model's `config.json` (a file, a folder, a Hugging Face cache snapshot, or
//! only that one file fetched from the Hub) or a GGUF header. Weights are never needed: safetensors files are
//! listed only when they are already on disk, for their headers' parameter count.

use std::path::{Path, PathBuf};

use hf_hub::api::sync::ApiBuilder;
use hf_hub::{Cache, Repo, RepoType};

use crate::error::{EngineError, ModelError, Result};
use crate::source::{hf_cache, local, ResolveOptions};

/// Where a plan's model description comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigSource {
    /// A `config.json`, with the safetensors files found next to it (empty when the weights are not there).
    Json { config: PathBuf, safetensors: Vec<PathBuf> },
    /// A `.gguf` file (only its header is read).
    Gguf { file: PathBuf },
}

impl ConfigSource {
    pub fn path(&self) -> &Path {
        match self {
            ConfigSource::Json { config, .. } => config,
            ConfigSource::Gguf { file } => file,
        }
    }
}

/// The safetensors files of a folder when every one of them is present: the index's shards, or `*.safetensors`.
fn safetensors_in(dir: &Path) -> Vec<PathBuf> {
    let index = dir.join(local::SAFETENSORS_INDEX);
    let files: Vec<PathBuf> = if index.is_file() {
        match local::shards_from_index(&index) {
            Ok(shards) => shards.iter().map(|s| dir.join(s)).collect(),
            Err(_) => return Vec::new(),
        }
    } else {
        let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
                    .collect()
            })
            .unwrap_or_default();
        found.sort();
        found
    };
    if files.iter().all(|p| p.is_file()) {
        files
    } else {
        Vec::new()
    }
}

fn from_dir(spec: &str, dir: &Path) -> Result<ConfigSource> {
    let config = dir.join(local::CONFIG);
    if config.is_file() {
        return Ok(ConfigSource::Json { safetensors: safetensors_in(dir), config });
    }
    match local::gguf_files_in(dir).as_slice() {
        [one] => Ok(ConfigSource::Gguf { file: one.clone() }),
        [] => Err(ModelError::ModelNotFound { model: spec.to_string(), searched: vec![config] }.into()),
        many => Err(EngineError::InvalidArgument(format!(
            "'{spec}' has no config.json and {} .gguf files; pass the .gguf file itself",
            many.len()
        ))),
    }
}

/// Fetches only `config.json` of a Hub repo into the cache.
fn fetch_config(repo_id: &str, revision: &str, opts: &ResolveOptions) -> Result<PathBuf> {
    let fail = |message: String| ModelError::Download { model: repo_id.to_string(), message };
    let api = ApiBuilder::from_cache(Cache::new(opts.cache_dir.clone()))
        .with_endpoint(opts.endpoint.clone())
        .with_token(opts.token.clone())
        .with_progress(false)
        .with_user_agent("rserve", env!("CARGO_PKG_VERSION"))
        .build()
        .map_err(|e| fail(format!("cannot set up the Hub client: {e}")))?;
    let repo = api.repo(Repo::with_revision(repo_id.to_string(), RepoType::Model, revision.to_string()));
    Ok(repo.get(local::CONFIG).map_err(|e| fail(format!("{}: {e}", repo.url(local::CONFIG))))?)
}

/// Finds the config of `spec`: a `.gguf` or `config.json` path, a folder, or a Hub repo id (its cache snapshot, or
/// only its `config.json` downloaded when the cache lacks it and the options allow the Hub).
pub fn locate(spec: &str, opts: &ResolveOptions) -> Result<ConfigSource> {
    let spec = spec.trim();
    if spec.is_empty() {
        return Err(EngineError::InvalidArgument("the model name is empty".into()));
    }
    let path = Path::new(spec);
    if path.is_file() {
        if local::is_gguf_path(path) {
            return Ok(ConfigSource::Gguf { file: path.to_path_buf() });
        }
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let safetensors =
            if path.file_name().is_some_and(|n| n == local::CONFIG) { safetensors_in(dir) } else { Vec::new() };
        return Ok(ConfigSource::Json { config: path.to_path_buf(), safetensors });
    }
    if path.is_dir() {
        return from_dir(spec, path);
    }
    if !hf_cache::is_repo_id(spec) {
        return Err(ModelError::ModelNotFound { model: spec.to_string(), searched: vec![path.to_path_buf()] }.into());
    }
    let revision = opts.revision_or_main();
    let searched = match hf_cache::snapshot_dir(&opts.cache_dir, spec, revision) {
        Ok((_, snapshot)) if snapshot.join(local::CONFIG).is_file() => return from_dir(spec, &snapshot),
        Ok((_, snapshot)) => vec![snapshot.join(local::CONFIG)],
        Err(searched) => searched,
    };
    if opts.offline {
        return Err(ModelError::ModelNotFound { model: format!("{spec}@{revision} (offline)"), searched }.into());
    }
    let config = fetch_config(spec, revision, opts)?;
    Ok(ConfigSource::Json { config, safetensors: Vec::new() })
}
