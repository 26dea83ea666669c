//! The Hugging Face hub cache layout, read without network access:
//! `{cache}/models--{org}--{name}/refs/{revision}` holds a commit hash, and
//! `{cache}/models--{org}--{name}/snapshots/{commit}/` holds the files (symlinks into `blobs/`).

use std::path::{Path, PathBuf};

use super::local::{scan_dir, DirScan};
use super::{ModelOrigin, SafetensorsModel};
use crate::Result;

/// Whether `spec` has the shape of a Hub repo id: `name` or `org/name`, made of letters, digits, `-`, `_`, `.`.
pub fn is_repo_id(spec: &str) -> bool {
    let part_ok = |p: &str| {
        !p.is_empty()
            && p != "."
            && p != ".."
            && !p.starts_with('-')
            && !p.contains("..")
            && p.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    let mut parts = spec.split('/');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(name), None, None) => part_ok(name),
        (Some(org), Some(name), None) => part_ok(org) && part_ok(name),
        _ => false,
    }
}

/// Whether a revision is a full commit hash (40 lowercase hex digits).
pub fn is_commit_hash(revision: &str) -> bool {
    revision.len() == 40 && revision.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// `{cache}/models--{org}--{name}`.
pub fn repo_folder(cache_dir: &Path, repo_id: &str) -> PathBuf {
    cache_dir.join(format!("models--{}", repo_id.replace('/', "--")))
}

/// What a cache lookup found.
#[allow(clippy::large_enum_variant)] // short-lived; returned once per resolve
pub enum CacheLookup {
    Found(SafetensorsModel),
    /// Not (completely) cached; the paths that were looked at.
    NotFound(Vec<PathBuf>),
}

/// Finds the snapshot folder of `revision`: through `refs/{revision}`, or directly when the revision is a commit
/// hash. Returns the commit and the folder, or the paths that were looked at.
pub fn snapshot_dir(
    cache_dir: &Path,
    repo_id: &str,
    revision: &str,
) -> std::result::Result<(String, PathBuf), Vec<PathBuf>> {
    let repo = repo_folder(cache_dir, repo_id);
    let ref_path = repo.join("refs").join(revision);
    let mut searched = vec![ref_path.clone()];
    if let Ok(text) = std::fs::read_to_string(&ref_path) {
        let commit = text.trim().to_string();
        if !commit.is_empty() && !commit.contains('/') && !commit.contains("..") {
            let snapshot = repo.join("snapshots").join(&commit);
            if snapshot.is_dir() {
                return Ok((commit, snapshot));
            }
            searched.push(snapshot);
            return Err(searched);
        }
    }
    if is_commit_hash(revision) {
        let snapshot = repo.join("snapshots").join(revision);
        if snapshot.is_dir() {
            return Ok((revision.to_string(), snapshot));
        }
        searched.push(snapshot);
    }
    Err(searched)
}

/// Looks `repo_id` at `revision` up in the cache; a snapshot counts only when it holds a complete model.
pub fn lookup(cache_dir: &Path, repo_id: &str, revision: &str) -> Result<CacheLookup> {
    let (commit, snapshot) = match snapshot_dir(cache_dir, repo_id, revision) {
        Ok(found) => found,
        Err(searched) => return Ok(CacheLookup::NotFound(searched)),
    };
    let origin = ModelOrigin::HfCache { repo: repo_id.to_string(), revision: revision.to_string(), commit };
    match scan_dir(&snapshot, origin)? {
        DirScan::Complete(model) => Ok(CacheLookup::Found(model)),
        DirScan::Missing(missing) => Ok(CacheLookup::NotFound(missing)),
    }
}
