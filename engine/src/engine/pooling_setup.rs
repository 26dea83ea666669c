//! Whether an engine pools (`--runner`, `--convert`, the legacy `--task`) and with what pooler, decided once at
//! start-up from the command line and the model folder.

use std::path::Path;

use rserve_model_io::source::ResolvedModel;

use super::config::{ConvertChoice, EngineConfig, RunnerChoice};
use crate::config::ModelParams;
use crate::error::{EngineError, Result};
use crate::pooling::Pooler;

/// The pooler of a model served with `--runner pooling`; None for a generating engine.
pub(super) fn pooler_for(cfg: &EngineConfig, resolved: &ResolvedModel, params: &ModelParams) -> Result<Option<Pooler>> {
    match cfg.runner {
        RunnerChoice::Auto | RunnerChoice::Generate => return Ok(None),
        RunnerChoice::Pooling => {}
    }
    if cfg.tensor_parallel_size * cfg.pipeline_parallel_size > 1 {
        return Err(EngineError::InvalidArgument(
            "--runner pooling runs the whole model in one process (-tp 1 -pp 1); -dp replicas may serve it".into(),
        ));
    }
    if cfg.convert == ConvertChoice::Classify {
        return Err(EngineError::InvalidArgument(format!(
            "--convert classify: a {:?} decoder is served as an embedder only (--convert embed)",
            params.architecture
        )));
    }
    let dir = resolved.path().is_dir().then(|| resolved.path());
    let matryoshka = dir.and_then(matryoshka_dimensions);
    Ok(Some(Pooler::decoder_embedder(dir, params.hidden_size, matryoshka, &cfg.pooler_config)?))
}

/// The config's Matryoshka support: `matryoshka_dimensions` (the sizes allowed) or `is_matryoshka: true` (any size).
pub(super) fn matryoshka_dimensions(dir: &Path) -> Option<Vec<usize>> {
    let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    if let Some(dims) = v.get("matryoshka_dimensions").and_then(|d| d.as_array()) {
        return Some(dims.iter().filter_map(|d| d.as_u64().map(|d| d as usize)).collect());
    }
    v.get("is_matryoshka").and_then(|b| b.as_bool()).filter(|&b| b).map(|_| Vec::new())
}
