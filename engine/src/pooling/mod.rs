//! A pooling model's head on the host: the final hidden states a step returns (`runner::PoolRows`) become one
//! vector per request: pooled (CLS / mean / max / last), through sentence-transformers' `Dense` layers, cut to the
//! request's Matryoshka `dimensions` and L2-normalised, as sentence-transformers and vLLM compute it. The model
//! itself runs on the device; only each request's pooled rows come back, and this is a few small products per
//! request.

mod dense;

use std::path::Path;

use rserve_model_io::config::pooling::{read_sentence_transformers, PoolerOverride, PoolingType};

use crate::api::{PoolingInfo, PoolingParams, PoolingTask};
use crate::error::{EngineError, Result};
use crate::runner::PoolRows;

pub use dense::Dense;

/// How a pooling engine turns each request's hidden states into its result.
#[derive(Debug, Clone)]
pub struct Pooler {
    pooling: PoolingType,
    /// Embed: sentence-transformers' Dense layers; Classify: the classifier head's layers.
    dense: Vec<Dense>,
    normalize: bool,
    default_dimensions: Option<usize>,
    /// Classify: whether the head's logits become probabilities by default (vLLM's `use_activation`).
    activation: bool,
    hidden: usize,
    info: PoolingInfo,
}

/// An encoder's classifier head, its layers in order (the last gives one logit per label).
pub struct ClassifierHead {
    pub layers: Vec<Dense>,
    pub labels: Vec<String>,
}

impl Pooler {
    /// A decoder served as an embedder (`--runner pooling` on a `...ForCausalLM`): the folder's sentence-transformers
    /// pipeline when it has one, else the last token's state, normalised (vLLM's default for decoders), with
    /// `--pooler-config` over either. `matryoshka`: the config's `is_matryoshka` / `matryoshka_dimensions`.
    pub fn decoder_embedder(
        dir: Option<&Path>,
        hidden: usize,
        matryoshka: Option<Vec<usize>>,
        over: &PoolerOverride,
    ) -> Result<Self> {
        let st = match dir {
            Some(d) => read_sentence_transformers(d)?,
            None => None,
        };
        let (mut pooling, mut normalize, mut dense) = (PoolingType::Last, true, Vec::new());
        if let Some(st) = st {
            pooling = st.pooling;
            normalize = st.normalize;
            let mut width = hidden;
            for layer in &st.dense {
                let d = Dense::load(layer)?;
                if d.in_features() != width {
                    return Err(EngineError::InvalidArgument(format!(
                        "{}: a Dense layer of {} inputs after {width} values",
                        layer.dir.display(),
                        d.in_features()
                    )));
                }
                width = d.out_features();
                dense.push(d);
            }
        }
        pooling = over.pooling_type.unwrap_or(pooling);
        normalize = over.normalize.unwrap_or(normalize);
        let embed_dim = dense.last().map_or(hidden, Dense::out_features);
        if let Some(d) = over.dimensions {
            if d > embed_dim {
                return Err(EngineError::InvalidArgument(format!(
                    "--pooler-config: `dimensions` {d} is more than the model's {embed_dim}"
                )));
            }
        }
        let info = PoolingInfo {
            tasks: vec![PoolingTask::Embed],
            embed_dim,
            matryoshka,
            labels: Vec::new(),
            cross_encoder: false,
            bidirectional: false,
        };
        Ok(Self { pooling, dense, normalize, default_dimensions: over.dimensions, activation: true, hidden, info })
    }

    /// An encoder embedder: as a decoder's, but CLS pooling when the folder says nothing (vLLM's default for BERT),
    /// and bidirectional (each input runs whole).
    pub fn encoder_embedder(
        dir: Option<&Path>,
        hidden: usize,
        matryoshka: Option<Vec<usize>>,
        over: &PoolerOverride,
    ) -> Result<Self> {
        let has_st = dir.is_some_and(|d| d.join("modules.json").exists());
        let over = PoolerOverride {
            pooling_type: over.pooling_type.or(if has_st { None } else { Some(PoolingType::Cls) }),
            ..over.clone()
        };
        let mut p = Self::decoder_embedder(dir, hidden, matryoshka, &over)?;
        p.info.bidirectional = true;
        Ok(p)
    }

    /// An encoder classifier (`...ForSequenceClassification`): the first token's state through the head. One label
    /// is a cross-encoder's relevance score (sigmoid; `/score` and `/rerank` feed it query-document pairs); more are
    /// classes (softmax).
    pub fn encoder_classifier(head: ClassifierHead, hidden: usize, over: &PoolerOverride) -> Result<Self> {
        if head.layers.first().is_some_and(|d| d.in_features() != hidden)
            || head.layers.last().is_none_or(|d| d.out_features() != head.labels.len())
        {
            return Err(EngineError::InvalidArgument(
                "the classifier head does not fit the model's width and labels".into(),
            ));
        }
        let info = PoolingInfo {
            tasks: vec![PoolingTask::Classify],
            embed_dim: hidden,
            matryoshka: None,
            cross_encoder: head.labels.len() == 1,
            labels: head.labels,
            bidirectional: true,
        };
        Ok(Self {
            pooling: over.pooling_type.unwrap_or(PoolingType::Cls),
            dense: head.layers,
            normalize: false,
            default_dimensions: None,
            activation: over.activation.unwrap_or(true),
            hidden,
            info,
        })
    }

    pub fn info(&self) -> &PoolingInfo {
        &self.info
    }

    pub fn pooling_type(&self) -> PoolingType {
        self.pooling
    }

    /// The rows a step returns of a request's prompt chunk: `first` when the chunk starts the prompt, `completes`
    /// when it ends it.
    pub fn rows(&self, first: bool, completes: bool) -> PoolRows {
        match self.pooling {
            PoolingType::Cls if first => PoolRows::First,
            PoolingType::Last if completes => PoolRows::Last,
            PoolingType::Mean | PoolingType::Max => PoolRows::All,
            _ => PoolRows::Nothing,
        }
    }

    /// One request's result from the hidden rows its steps returned, in order (`[rows, hidden]`).
    pub fn finish(&self, rows: &[f32], params: &PoolingParams) -> Result<Vec<f32>> {
        let h = self.hidden;
        let n = rows.len() / h.max(1);
        if n == 0 || rows.len() != n * h {
            return Err(EngineError::Backend(format!("pooling: {} values are not rows of {h}", rows.len())));
        }
        let mut v = match self.pooling {
            PoolingType::Cls => rows[..h].to_vec(),
            PoolingType::Last => rows[(n - 1) * h..].to_vec(),
            PoolingType::Mean => {
                let mut acc = vec![0f64; h];
                for r in rows.chunks_exact(h) {
                    acc.iter_mut().zip(r).for_each(|(a, &x)| *a += x as f64);
                }
                acc.into_iter().map(|a| (a / n as f64) as f32).collect()
            }
            PoolingType::Max => {
                let mut acc = vec![f32::NEG_INFINITY; h];
                for r in rows.chunks_exact(h) {
                    acc.iter_mut().zip(r).for_each(|(a, &x)| *a = a.max(x));
                }
                acc
            }
        };
        for d in &self.dense {
            v = d.apply(&v);
        }
        match params.task {
            PoolingTask::Embed if !self.info.tasks.contains(&PoolingTask::Embed) => {
                Err(EngineError::InvalidArgument("this model classifies; it does not embed".into()))
            }
            PoolingTask::Embed => {
                if let Some(d) = params.dimensions.or(self.default_dimensions) {
                    if d == 0 || d > v.len() {
                        return Err(EngineError::InvalidArgument(format!(
                            "dimensions {d} is outside 1..={} for this model",
                            v.len()
                        )));
                    }
                    v.truncate(d);
                }
                if params.normalize.unwrap_or(self.normalize) {
                    l2_normalize(&mut v);
                }
                Ok(v)
            }
            PoolingTask::Classify if self.info.tasks.contains(&PoolingTask::Classify) => {
                if params.activation && self.activation {
                    activate(&mut v);
                }
                Ok(v)
            }
            PoolingTask::Classify => {
                Err(EngineError::InvalidArgument("this model embeds; it has no classifier".into()))
            }
        }
    }
}

/// A classifier's probabilities: sigmoid of a single logit, softmax over several (as sentence-transformers'
/// CrossEncoder and vLLM's classify do).
fn activate(v: &mut [f32]) {
    if let [x] = v {
        *x = 1.0 / (1.0 + (-*x).exp());
        return;
    }
    let max = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = v.iter().map(|x| (x - max).exp()).sum();
    v.iter_mut().for_each(|x| *x = (*x - max).exp() / sum);
}

/// `v / max(|v|, 1e-12)`, as torch's `F.normalize`.
pub fn l2_normalize(v: &mut [f32]) {
    let norm = v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt().max(1e-12);
    v.iter_mut().for_each(|x| *x = (*x as f64 / norm) as f32);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pooler(pooling: PoolingType) -> Pooler {
        let over = PoolerOverride { pooling_type: Some(pooling), normalize: Some(false), ..Default::default() };
        Pooler::decoder_embedder(None, 2, None, &over).unwrap()
    }

    #[test]
    fn each_pooling_type_reduces_the_rows_as_sentence_transformers_does() {
        let rows = [1.0, -2.0, 3.0, 4.0, -5.0, 0.0];
        let p = PoolingParams::new(PoolingTask::Embed);
        assert_eq!(pooler(PoolingType::Cls).finish(&rows, &p).unwrap(), vec![1.0, -2.0]);
        assert_eq!(pooler(PoolingType::Last).finish(&rows, &p).unwrap(), vec![-5.0, 0.0]);
        assert_eq!(pooler(PoolingType::Mean).finish(&rows, &p).unwrap(), vec![-1.0 / 3.0, 2.0 / 3.0]);
        assert_eq!(pooler(PoolingType::Max).finish(&rows, &p).unwrap(), vec![3.0, 4.0]);
    }

    #[test]
    fn dimensions_cut_before_normalising_and_out_of_range_is_refused() {
        let rows = [3.0, 4.0];
        let p = PoolingParams { dimensions: Some(1), normalize: Some(true), ..PoolingParams::new(PoolingTask::Embed) };
        assert_eq!(pooler(PoolingType::Last).finish(&rows, &p).unwrap(), vec![1.0]);
        let full = PoolingParams { normalize: Some(true), ..PoolingParams::new(PoolingTask::Embed) };
        assert_eq!(pooler(PoolingType::Last).finish(&rows, &full).unwrap(), vec![0.6, 0.8]);
        let bad = PoolingParams { dimensions: Some(3), ..PoolingParams::new(PoolingTask::Embed) };
        assert!(pooler(PoolingType::Last).finish(&rows, &bad).is_err());
    }

    #[test]
    fn chunks_return_only_the_rows_the_pooling_reads() {
        assert_eq!(pooler(PoolingType::Cls).rows(true, false), PoolRows::First);
        assert_eq!(pooler(PoolingType::Cls).rows(false, true), PoolRows::Nothing);
        assert_eq!(pooler(PoolingType::Last).rows(false, false), PoolRows::Nothing);
        assert_eq!(pooler(PoolingType::Last).rows(false, true), PoolRows::Last);
        assert_eq!(pooler(PoolingType::Mean).rows(false, false), PoolRows::All);
    }
}
