//! How a pooling model turns hidden states into its output, as sentence-transformers writes it beside the checkpoint
//! (`modules.json`; `1_Pooling/config.json`; `2_Dense/config.json` and its weights; a `Normalize` module) and as
//! vLLM's `--pooler-config` overrides it. Read here, applied by the engine.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{ModelError, Result};

/// Which hidden states of an input become its vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolingType {
    /// The first token's (BERT's `[CLS]`).
    Cls,
    /// The mean over every token.
    Mean,
    /// The element-wise maximum over every token.
    Max,
    /// The last token's (decoder embedders: Qwen3-Embedding, e5-mistral).
    Last,
}

impl PoolingType {
    /// vLLM's `--pooler-config` spellings (`pooling_type`): CLS, MEAN, MAX, LAST, any case.
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_uppercase().as_str() {
            "CLS" => Some(Self::Cls),
            "MEAN" => Some(Self::Mean),
            "MAX" => Some(Self::Max),
            "LAST" | "LASTTOKEN" => Some(Self::Last),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cls => "CLS",
            Self::Mean => "MEAN",
            Self::Max => "MAX",
            Self::Last => "LAST",
        }
    }
}

/// The activation after a sentence-transformers `Dense` layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DenseActivation {
    Identity,
    Tanh,
}

/// One sentence-transformers `Dense` module: `out = act(x . W^T + b)`, its weights in `dir`.
#[derive(Debug, Clone, PartialEq)]
pub struct DenseLayer {
    pub dir: PathBuf,
    pub in_features: usize,
    pub out_features: usize,
    pub bias: bool,
    pub activation: DenseActivation,
}

/// A model folder's sentence-transformers pipeline after the transformer.
#[derive(Debug, Clone, PartialEq)]
pub struct SentenceTransformersPooler {
    pub pooling: PoolingType,
    pub dense: Vec<DenseLayer>,
    pub normalize: bool,
}

/// vLLM's `--pooler-config`: what the command line overrides of the model's pooler.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PoolerOverride {
    pub pooling_type: Option<PoolingType>,
    /// Embed: L2-normalise by default.
    pub normalize: Option<bool>,
    /// Classify: apply the activation by default (vLLM's `use_activation`, formerly `softmax` / `activation`).
    pub activation: Option<bool>,
    /// Embed: the default Matryoshka size of a request that names none.
    pub dimensions: Option<usize>,
}

impl PoolerOverride {
    /// Parses `--pooler-config`'s JSON object; an unknown key or a wrong value names itself.
    pub fn parse(json: &str) -> std::result::Result<Self, String> {
        let v: serde_json::Value = serde_json::from_str(json).map_err(|e| format!("--pooler-config: {e}"))?;
        let obj = v.as_object().ok_or("--pooler-config: expected a JSON object")?;
        let mut out = Self::default();
        for (k, val) in obj {
            let bool_of = |val: &serde_json::Value| {
                val.as_bool().ok_or_else(|| format!("--pooler-config: `{k}` must be true or false"))
            };
            match k.as_str() {
                "pooling_type" => {
                    let s = val.as_str().ok_or("--pooler-config: `pooling_type` must be a string")?;
                    out.pooling_type = Some(PoolingType::parse(s).ok_or_else(|| {
                        format!("--pooler-config: `pooling_type` {s:?} is not one of CLS, MEAN, MAX, LAST")
                    })?);
                }
                "normalize" => out.normalize = Some(bool_of(val)?),
                "use_activation" | "activation" | "softmax" => out.activation = Some(bool_of(val)?),
                "dimensions" => {
                    let n = val
                        .as_u64()
                        .filter(|&n| n > 0)
                        .ok_or("--pooler-config: `dimensions` must be a positive integer")?;
                    out.dimensions = Some(n as usize);
                }
                other => {
                    return Err(format!(
                    "--pooler-config: `{other}` is not supported (pooling_type, normalize, use_activation, dimensions)"
                ))
                }
            }
        }
        Ok(out)
    }
}

#[derive(Deserialize)]
struct Module {
    path: String,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Deserialize)]
struct PoolingConfig {
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
    #[serde(default)]
    pooling_mode_max_tokens: bool,
    #[serde(default)]
    pooling_mode_lasttoken: bool,
    #[serde(default)]
    pooling_mode_mean_sqrt_len_tokens: bool,
    #[serde(default)]
    pooling_mode_weightedmean_tokens: bool,
}

#[derive(Deserialize)]
struct DenseConfig {
    in_features: usize,
    out_features: usize,
    #[serde(default = "yes")]
    bias: bool,
    #[serde(default)]
    activation_function: Option<String>,
}

fn yes() -> bool {
    true
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(|e| ModelError::Io { path: path.to_path_buf(), source: e })?;
    serde_json::from_str(&text).map_err(|e| ModelError::Config(format!("{}: {e}", path.display())))
}

/// The sentence-transformers pipeline of `dir` (None: the folder has no `modules.json`). A module this server does
/// not apply (anything but Transformer, Pooling, Dense and Normalize) or a pooling mode it cannot (weighted mean,
/// mean over sqrt(len), several at once) is an error naming it.
pub fn read_sentence_transformers(dir: &Path) -> Result<Option<SentenceTransformersPooler>> {
    let modules_path = dir.join("modules.json");
    if !modules_path.exists() {
        return Ok(None);
    }
    let modules: Vec<Module> = read_json(&modules_path)?;
    let mut pooling = None;
    let mut dense = Vec::new();
    let mut normalize = false;
    for m in modules {
        let kind = m.kind.rsplit('.').next().unwrap_or(&m.kind);
        let sub = dir.join(&m.path);
        match kind {
            "Transformer" => {}
            "Pooling" => {
                let c: PoolingConfig = read_json(&sub.join("config.json"))?;
                if c.pooling_mode_mean_sqrt_len_tokens || c.pooling_mode_weightedmean_tokens {
                    return Err(ModelError::Config(format!(
                        "{}: weighted-mean and mean-sqrt-len pooling are not supported",
                        sub.display()
                    )));
                }
                let modes = [
                    (c.pooling_mode_cls_token, PoolingType::Cls),
                    (c.pooling_mode_mean_tokens, PoolingType::Mean),
                    (c.pooling_mode_max_tokens, PoolingType::Max),
                    (c.pooling_mode_lasttoken, PoolingType::Last),
                ];
                let on: Vec<PoolingType> = modes.iter().filter(|(b, _)| *b).map(|(_, t)| *t).collect();
                if on.len() != 1 {
                    return Err(ModelError::Config(format!(
                        "{}: exactly one pooling mode must be on (found {})",
                        sub.display(),
                        on.len()
                    )));
                }
                pooling = Some(on[0]);
            }
            "Dense" => {
                let c: DenseConfig = read_json(&sub.join("config.json"))?;
                let activation = match c.activation_function.as_deref().map(|a| a.rsplit('.').next().unwrap_or(a)) {
                    None | Some("Identity") => DenseActivation::Identity,
                    Some("Tanh") => DenseActivation::Tanh,
                    Some(other) => {
                        return Err(ModelError::Config(format!(
                            "{}: Dense activation {other} is not supported (Identity, Tanh)",
                            sub.display()
                        )))
                    }
                };
                dense.push(DenseLayer {
                    dir: sub,
                    in_features: c.in_features,
                    out_features: c.out_features,
                    bias: c.bias,
                    activation,
                });
            }
            "Normalize" => normalize = true,
            other => {
                return Err(ModelError::Config(format!(
                "{}: sentence-transformers module {other} is not supported (Transformer, Pooling, Dense, Normalize)",
                modules_path.display()
            )))
            }
        }
    }
    let pooling =
        pooling.ok_or_else(|| ModelError::Config(format!("{}: no Pooling module", modules_path.display())))?;
    Ok(Some(SentenceTransformersPooler { pooling, dense, normalize }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooler_config_parses_vllm_keys_and_names_bad_ones() {
        let o = PoolerOverride::parse(r#"{"pooling_type": "mean", "normalize": false}"#).unwrap();
        assert_eq!(o.pooling_type, Some(PoolingType::Mean));
        assert_eq!(o.normalize, Some(false));
        let e = PoolerOverride::parse(r#"{"pooling_type": "STEP"}"#).unwrap_err();
        assert!(e.contains("pooling_type"), "{e}");
        let e = PoolerOverride::parse(r#"{"weird": 1}"#).unwrap_err();
        assert!(e.contains("weird"), "{e}");
    }

    #[test]
    fn sentence_transformers_modules_are_read() {
        let dir = std::env::temp_dir().join(format!("rserve-st-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("1_Pooling")).unwrap();
        std::fs::create_dir_all(dir.join("2_Dense")).unwrap();
        std::fs::write(
            dir.join("modules.json"),
            r#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
               {"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"},
               {"idx":2,"name":"2","path":"2_Dense","type":"sentence_transformers.models.Dense"},
               {"idx":3,"name":"3","path":"3_Normalize","type":"sentence_transformers.models.Normalize"}]"#,
        )
        .unwrap();
        std::fs::write(
            dir.join("1_Pooling/config.json"),
            r#"{"word_embedding_dimension": 8, "pooling_mode_mean_tokens": true}"#,
        )
        .unwrap();
        std::fs::write(
            dir.join("2_Dense/config.json"),
            r#"{"in_features": 8, "out_features": 4, "bias": true, "activation_function": "torch.nn.modules.activation.Tanh"}"#,
        )
        .unwrap();
        let p = read_sentence_transformers(&dir).unwrap().unwrap();
        assert_eq!(p.pooling, PoolingType::Mean);
        assert!(p.normalize);
        assert_eq!(p.dense.len(), 1);
        assert_eq!(p.dense[0].activation, DenseActivation::Tanh);
        assert_eq!((p.dense[0].in_features, p.dense[0].out_features), (8, 4));
        std::fs::remove_dir_all(&dir).ok();
    }
}
