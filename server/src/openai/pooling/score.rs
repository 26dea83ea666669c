//! Scoring (query, document) pairs, for `/score` and `/rerank`. A cross-encoder reads each pair as one input (the
//! tokenizer's pair template, with `token_type_ids`) and its classifier's first score is the pair's score; any other
//! embedding model embeds both sides and a pair's score is the cosine similarity of their embeddings.

use rserve_engine::api::{EngineInfo, GenerateRequest, PoolingParams, PoolingTask};

use super::error::{Api, PoolingError};
use super::gather::Pooled;
use super::render;
use super::validate::{self, Limits};
use crate::error::ApiError;
use crate::openai::validate::ValidationError;
use crate::port::Engine;

type Result<T> = std::result::Result<T, PoolingError>;

/// The (first, second) index pairs of two sides, as vLLM pairs them: 1:1, 1:N (the one first against each second)
/// or N:N (element by element).
pub fn pairs(
    first_field: &'static str,
    first: usize,
    second_field: &'static str,
    second: usize,
) -> Result<Vec<(usize, usize)>> {
    if first == 0 {
        return Err(PoolingError::Empty(first_field));
    }
    if second == 0 {
        return Err(PoolingError::Empty(second_field));
    }
    if first == 1 {
        Ok((0..second).map(|j| (0, j)).collect())
    } else if first == second {
        Ok((0..first).map(|i| (i, i)).collect())
    } else {
        Err(PoolingError::ScoreLengths { first_field, second_field, first, second })
    }
}

/// How a pair is scored on the served model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    CrossEncoder,
    Cosine,
}

fn mode(info: &EngineInfo, api: Api) -> Result<Mode> {
    let p = info.pooling.as_ref().ok_or(PoolingError::Unsupported(api))?;
    if p.cross_encoder && p.tasks.contains(&PoolingTask::Classify) {
        Ok(Mode::CrossEncoder)
    } else if p.tasks.contains(&PoolingTask::Embed) {
        Ok(Mode::Cosine)
    } else {
        Err(PoolingError::Unsupported(api))
    }
}

/// The engine requests that score `pairs` of `first` and `second`, and how their results become scores.
#[derive(Debug, Clone)]
pub struct ScorePlan {
    pub requests: Vec<GenerateRequest>,
    mode: Mode,
    pairs: Vec<(usize, usize)>,
    /// Cosine: the first side's embeddings come first, the second side's after them.
    firsts: usize,
}

/// What a score request asks besides its texts.
#[derive(Debug, Clone, Copy)]
pub struct ScoreSettings {
    pub api: Api,
    pub first_field: &'static str,
    pub second_field: &'static str,
    pub truncate: Option<i64>,
    /// A cross-encoder's activation (sigmoid of its one logit); default true.
    pub activation: Option<bool>,
}

pub fn plan(
    engine: &dyn Engine,
    first: &[String],
    second: &[String],
    pairs: Vec<(usize, usize)>,
    s: &ScoreSettings,
) -> Result<ScorePlan> {
    let info = engine.info();
    let mode = mode(info, s.api)?;
    let limits = Limits::new(info, s.truncate, "scoring")?;
    let tokenize = |e: rserve_engine::EngineError| PoolingError::from(ValidationError::Tokenization(e.to_string()));
    let mut requests = Vec::new();
    match mode {
        Mode::CrossEncoder => {
            for &(i, j) in &pairs {
                let (ids, types) = engine.encode_pair(&first[i], &second[j]).map_err(tokenize)?;
                let (ids, types) = limits.fit(s.second_field, ids, Some(types))?;
                let mut params = PoolingParams::new(PoolingTask::Classify);
                params.activation = s.activation.unwrap_or(true);
                params.token_type_ids = types;
                requests.push(validate::request(ids, params));
            }
        }
        Mode::Cosine => {
            let sides = [(s.first_field, first), (s.second_field, second)];
            for (field, texts) in sides {
                for text in texts {
                    let ids = engine.encode(text, true).map_err(tokenize)?;
                    let (ids, _) = limits.fit(field, ids, None)?;
                    requests.push(validate::request(ids, PoolingParams::new(PoolingTask::Embed)));
                }
            }
        }
    }
    Ok(ScorePlan { requests, mode, pairs, firsts: first.len() })
}

impl ScorePlan {
    /// Each pair's score from the engine's results (in the order of `requests`).
    pub fn scores(&self, pooled: &[Pooled]) -> std::result::Result<Vec<f32>, ApiError> {
        let missing = || ApiError::Internal("the engine returned no score for a pair".into());
        match self.mode {
            Mode::CrossEncoder => pooled.iter().map(|p| p.data.first().copied().ok_or_else(missing)).collect(),
            Mode::Cosine => self
                .pairs
                .iter()
                .map(|&(i, j)| {
                    let a = pooled.get(i).ok_or_else(missing)?;
                    let b = pooled.get(self.firsts + j).ok_or_else(missing)?;
                    Ok(render::cosine(&a.data, &b.data))
                })
                .collect(),
        }
    }
}
