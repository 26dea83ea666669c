//! `ResolveOptions`: where and how models are looked up (cache folder, revision, offline mode, token, endpoint).
//!
//! The resolver only reads these explicit options; `ResolveOptions::from_env` is the one place that reads the
//! Hugging Face environment variables, through `from_vars` so that tests can pass a map instead of the process
//! environment.

use std::path::PathBuf;

/// The Hub used when `HF_ENDPOINT` is unset.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// How `resolve_model` looks a model up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolveOptions {
    /// Branch, tag or commit hash of a Hub repo (`--revision`); `None` means `main`.
    pub revision: Option<String>,
    /// Never contact the Hub (`HF_HUB_OFFLINE` / `TRANSFORMERS_OFFLINE`).
    pub offline: bool,
    /// Bearer token for gated or private repos (`HF_TOKEN`, or the token file `huggingface-cli login` writes).
    pub token: Option<String>,
    /// Base URL of the Hub (`HF_ENDPOINT`), without a trailing slash.
    pub endpoint: String,
    /// The hub cache folder that holds `models--{org}--{name}/` (`HF_HUB_CACHE`, else `HF_HOME/hub`).
    pub cache_dir: PathBuf,
    /// Show a progress bar on stderr while downloading (drawn only when stderr is a terminal).
    pub progress: bool,
}

/// Values huggingface_hub treats as true for boolean environment variables.
fn truthy(value: &str) -> bool {
    matches!(value.trim().to_ascii_uppercase().as_str(), "1" | "ON" | "YES" | "TRUE")
}

impl ResolveOptions {
    /// Options for a given cache folder with everything else at its default (online, `main`, public Hub).
    pub fn with_cache_dir(cache_dir: impl Into<PathBuf>) -> Self {
        ResolveOptions {
            revision: None,
            offline: false,
            token: None,
            endpoint: DEFAULT_ENDPOINT.to_string(),
            cache_dir: cache_dir.into(),
            progress: true,
        }
    }

    /// Reads the process environment (`HF_HUB_OFFLINE`, `TRANSFORMERS_OFFLINE`, `HF_TOKEN`, `HF_ENDPOINT`,
    /// `HF_HUB_CACHE`, `HF_HOME`, `HOME`, ...).
    pub fn from_env() -> Self {
        Self::from_vars(|key| std::env::var(key).ok())
    }

    /// Builds options from a variable lookup; empty values count as unset. Precedence follows huggingface_hub:
    /// cache = `HF_HUB_CACHE` > `HUGGINGFACE_HUB_CACHE` > `HF_HOME/hub` > `XDG_CACHE_HOME/huggingface/hub` >
    /// `~/.cache/huggingface/hub`; token = `HF_TOKEN` > `HUGGING_FACE_HUB_TOKEN` > the file at `HF_TOKEN_PATH`
    /// (default `HF_HOME/token`).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Self {
        let get = |key: &str| var(key).filter(|v| !v.trim().is_empty());
        let home = get("HOME").or_else(|| get("USERPROFILE")).map(PathBuf::from);
        let expand = |value: String| -> PathBuf {
            match (value.strip_prefix("~/"), &home) {
                (Some(rest), Some(home)) => home.join(rest),
                _ => PathBuf::from(value),
            }
        };
        let hf_home = get("HF_HOME").map(&expand).unwrap_or_else(|| {
            let cache_root = get("XDG_CACHE_HOME")
                .map(&expand)
                .unwrap_or_else(|| home.clone().unwrap_or_else(|| PathBuf::from(".")).join(".cache"));
            cache_root.join("huggingface")
        });
        let cache_dir = get("HF_HUB_CACHE")
            .or_else(|| get("HUGGINGFACE_HUB_CACHE"))
            .map(&expand)
            .unwrap_or_else(|| hf_home.join("hub"));
        let offline = ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"].iter().any(|k| get(k).is_some_and(|v| truthy(&v)));
        let token = get("HF_TOKEN").or_else(|| get("HUGGING_FACE_HUB_TOKEN")).or_else(|| {
            let path = get("HF_TOKEN_PATH").map(&expand).unwrap_or_else(|| hf_home.join("token"));
            std::fs::read_to_string(path).ok().map(|t| t.trim().to_string()).filter(|t| !t.is_empty())
        });
        let endpoint = get("HF_ENDPOINT")
            .map(|e| e.trim().trim_end_matches('/').to_string())
            .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        ResolveOptions { revision: None, offline, token, endpoint, cache_dir, progress: true }
    }

    /// Sets the revision (`--revision`).
    pub fn revision(mut self, revision: Option<String>) -> Self {
        self.revision = revision;
        self
    }

    /// The revision to look up: the explicit one or `main`.
    pub fn revision_or_main(&self) -> &str {
        self.revision.as_deref().unwrap_or("main")
    }
}
