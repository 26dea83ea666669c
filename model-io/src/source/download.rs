//! Downloading a model repo from the Hugging Face Hub (or `HF_ENDPOINT`) into the hub cache with `hf-hub`.
//!
//! Fetches config.json, the safetensors weights (every shard of `model.safetensors.index.json`, else
//! `model.safetensors`) and, when the repo has them, generation_config.json, tokenizer.json, tokenizer_config.json and
//! chat_template.jinja. Files already in the cache snapshot are not fetched again. Proxies come from the usual
//! `HTTPS_PROXY` / `HTTP_PROXY` / `ALL_PROXY` variables (ureq reads them).

use std::path::PathBuf;

use hf_hub::api::sync::{Api, ApiBuilder, ApiError, ApiRepo};
use hf_hub::api::Progress;
use hf_hub::{Cache, CacheRepo, Repo, RepoType};
use indicatif::{ProgressBar, ProgressStyle};

use super::local::{
    shards_from_index, CHAT_TEMPLATE, CONFIG, GENERATION_CONFIG, SAFETENSORS_INDEX, SINGLE_SAFETENSORS, TOKENIZER,
    TOKENIZER_CONFIG,
};
use super::ResolveOptions;
use crate::{ModelError, Result};

/// A progress bar for one file, labelled with the file's place in the download.
struct FileProgress {
    bar: ProgressBar,
    label: String,
}

impl Progress for FileProgress {
    fn init(&mut self, size: usize, _filename: &str) {
        // hf-hub calls `init` again before each (resumed) attempt, then reports the resume offset via `update`.
        self.bar.set_length(size as u64);
        self.bar.set_position(0);
        self.bar.set_message(self.label.clone());
    }
    fn update(&mut self, size: usize) {
        self.bar.inc(size as u64);
    }
    fn finish(&mut self) {
        self.bar.finish();
    }
}

fn file_progress(label: String) -> FileProgress {
    let bar = ProgressBar::new(0);
    if let Ok(style) = ProgressStyle::with_template(
        "{msg} [{elapsed_precise}] [{wide_bar}] {bytes}/{total_bytes} {bytes_per_sec} ({eta})",
    ) {
        bar.set_style(style);
    }
    FileProgress { bar, label }
}

/// How a single file request ended when it did not deliver the file.
enum FetchError {
    /// The repo has no such file (HTTP 404).
    Absent,
    Failed(String),
}

/// Turns an hf-hub error into a message, telling a missing file (404) apart from other failures.
fn classify(err: ApiError, url: &str) -> FetchError {
    match err {
        ApiError::RequestError(e) => {
            let text = e.to_string();
            match (*e).into_response().map(|r| r.status()) {
                Some(404) => FetchError::Absent,
                Some(code @ (401 | 403)) => FetchError::Failed(format!(
                    "{url}: access denied (HTTP {code}); the repo may be gated or private: set HF_TOKEN"
                )),
                Some(code) => FetchError::Failed(format!("{url}: HTTP {code}")),
                None => FetchError::Failed(format!("{url}: {text}")),
            }
        }
        other => FetchError::Failed(format!("{url}: {other}")),
    }
}

struct Fetcher<'a> {
    repo: ApiRepo,
    cache: CacheRepo,
    repo_id: &'a str,
    progress: bool,
}

impl Fetcher<'_> {
    /// Fetches one file into the cache (or finds it there); `Ok(None)` when the repo does not have it.
    fn fetch(&self, filename: &str, label: String) -> Result<Option<PathBuf>> {
        if let Some(path) = self.cache.get(filename) {
            return Ok(Some(path));
        }
        let result = if self.progress {
            self.repo.download_with_progress(filename, file_progress(label))
        } else {
            self.repo.download_with_progress(filename, ())
        };
        match result {
            Ok(path) => Ok(Some(path)),
            Err(e) => match classify(e, &self.repo.url(filename)) {
                FetchError::Absent => Ok(None),
                FetchError::Failed(message) => Err(ModelError::Download { model: self.repo_id.to_string(), message }),
            },
        }
    }

    fn require(&self, filename: &str, label: String) -> Result<PathBuf> {
        self.fetch(filename, label)?.ok_or_else(|| ModelError::Download {
            model: self.repo_id.to_string(),
            message: format!("the repo has no {filename} ({})", self.repo.url(filename)),
        })
    }
}

fn build_api(opts: &ResolveOptions) -> Result<Api> {
    // (`ApiBuilder::new` would look up the home folder and panic without one; start from our cache instead.)
    ApiBuilder::from_cache(Cache::new(opts.cache_dir.clone()))
        .with_endpoint(opts.endpoint.clone())
        .with_token(opts.token.clone())
        .with_retries(2)
        .with_user_agent("rserve", env!("CARGO_PKG_VERSION"))
        .build()
        .map_err(|e| ModelError::Download {
            model: String::new(),
            message: format!("cannot set up the Hub client: {e}"),
        })
}

/// Downloads `repo_id` at `revision` into `opts.cache_dir` and returns the snapshot folder.
pub fn download_repo(repo_id: &str, revision: &str, opts: &ResolveOptions) -> Result<PathBuf> {
    let api = build_api(opts)?;
    let repo = Repo::with_revision(repo_id.to_string(), RepoType::Model, revision.to_string());
    let cache = Cache::new(opts.cache_dir.clone()).repo(repo.clone());
    let fetcher = Fetcher { repo: api.repo(repo), cache, repo_id, progress: opts.progress };
    let label = |name: &str| format!("{repo_id}: {name}");

    let config = fetcher.require(CONFIG, label(CONFIG))?;
    for optional in [GENERATION_CONFIG, TOKENIZER, TOKENIZER_CONFIG, CHAT_TEMPLATE] {
        fetcher.fetch(optional, label(optional))?;
    }
    match fetcher.fetch(SAFETENSORS_INDEX, label(SAFETENSORS_INDEX))? {
        Some(index) => {
            let shards = shards_from_index(&index)?;
            let n = shards.len();
            for (i, shard) in shards.iter().enumerate() {
                fetcher.require(shard, format!("{repo_id}: {shard} ({}/{n})", i + 1))?;
            }
        }
        None => {
            if fetcher.fetch(SINGLE_SAFETENSORS, label(SINGLE_SAFETENSORS))?.is_none() {
                return Err(ModelError::Download {
                    model: repo_id.to_string(),
                    message: format!(
                        "the repo has neither {SAFETENSORS_INDEX} nor {SINGLE_SAFETENSORS} (only safetensors weights \
                         are downloaded; for a GGUF, download the .gguf file and pass its path)"
                    ),
                });
            }
        }
    }
    config.parent().map(|p| p.to_path_buf()).ok_or_else(|| ModelError::Download {
        model: repo_id.to_string(),
        message: format!("unexpected cache path {}", config.display()),
    })
}

/// Downloads only a repo's tokenizer files (`tokenizer.json`, required; `tokenizer_config.json` and the chat template
/// when present) into `opts.cache_dir`, for `--tokenizer REPO`; returns the snapshot folder.
pub fn download_tokenizer(repo_id: &str, revision: &str, opts: &ResolveOptions) -> Result<PathBuf> {
    let api = build_api(opts)?;
    let repo = Repo::with_revision(repo_id.to_string(), RepoType::Model, revision.to_string());
    let cache = Cache::new(opts.cache_dir.clone()).repo(repo.clone());
    let fetcher = Fetcher { repo: api.repo(repo), cache, repo_id, progress: opts.progress };
    let tokenizer = fetcher.require(TOKENIZER, format!("{repo_id}: {TOKENIZER}"))?;
    for optional in [TOKENIZER_CONFIG, CHAT_TEMPLATE] {
        fetcher.fetch(optional, format!("{repo_id}: {optional}"))?;
    }
    tokenizer.parent().map(|p| p.to_path_buf()).ok_or_else(|| ModelError::Download {
        model: repo_id.to_string(),
        message: format!("unexpected cache path {}", tokenizer.display()),
    })
}
