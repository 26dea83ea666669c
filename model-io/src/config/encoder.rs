//! Encoder-only models (BERT and XLM-RoBERTa: BGE, e5, MiniLM, bge-m3, multilingual-e5, and their
//! `...ForSequenceClassification` cross-encoders such as bge-reranker) from `config.json`, with transformers'
//! defaults. Served for pooling only (`--runner pooling`), by their own forward pass: post-norm layers with biases,
//! absolute position embeddings, bidirectional attention.

use serde::Deserialize;

use crate::error::{ModelError, Result};

/// The encoder family: what differs is where positions start and the classifier head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncoderFamily {
    /// `BertModel` / `BertForSequenceClassification`: positions from 0.
    Bert,
    /// `XLMRobertaModel` / `RobertaModel` and their classifiers: positions from `pad_token_id + 1`.
    Roberta,
}

/// What sits on top of the encoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncoderHead {
    /// None: the hidden states are pooled into embeddings.
    Embeddings,
    /// BERT's classifier: `classifier(tanh(pooler.dense(h[CLS])))`.
    BertClassifier,
    /// RoBERTa's: `out_proj(tanh(dense(h[CLS])))`.
    RobertaClassifier,
}

/// A checked encoder config.
#[derive(Debug, Clone, PartialEq)]
pub struct EncoderParams {
    pub architecture: String,
    pub family: EncoderFamily,
    pub head: EncoderHead,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub intermediate_size: usize,
    pub max_position_embeddings: usize,
    pub type_vocab_size: usize,
    pub layer_norm_eps: f64,
    pub pad_token_id: u32,
    /// Classifier labels by index (`id2label`, else `LABEL_i`); empty without a classifier.
    pub labels: Vec<String>,
    pub torch_dtype: Option<String>,
}

impl EncoderParams {
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
    }

    /// The longest input: positions past the table's end have no embedding (RoBERTa's start after the padding id).
    pub fn max_len(&self) -> usize {
        match self.family {
            EncoderFamily::Bert => self.max_position_embeddings,
            EncoderFamily::Roberta => self.max_position_embeddings.saturating_sub(self.pad_token_id as usize + 1),
        }
    }

    /// The position embedding row of the `i`-th token of an input.
    pub fn position(&self, i: usize) -> usize {
        match self.family {
            EncoderFamily::Bert => i,
            EncoderFamily::Roberta => i + self.pad_token_id as usize + 1,
        }
    }
}

#[derive(Deserialize)]
struct Raw {
    architectures: Option<Vec<String>>,
    vocab_size: usize,
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    intermediate_size: usize,
    #[serde(default = "d_positions")]
    max_position_embeddings: usize,
    #[serde(default = "d_types")]
    type_vocab_size: usize,
    #[serde(default = "d_eps")]
    layer_norm_eps: f64,
    #[serde(default)]
    pad_token_id: Option<u32>,
    #[serde(default = "d_act")]
    hidden_act: String,
    #[serde(default = "d_pos_type")]
    position_embedding_type: String,
    #[serde(default)]
    id2label: Option<std::collections::BTreeMap<String, String>>,
    #[serde(default)]
    num_labels: Option<usize>,
    #[serde(default)]
    torch_dtype: Option<String>,
    #[serde(default)]
    dtype: Option<String>,
}

fn d_positions() -> usize {
    512
}
fn d_types() -> usize {
    2
}
fn d_eps() -> f64 {
    1e-12
}
fn d_act() -> String {
    "gelu".into()
}
fn d_pos_type() -> String {
    "absolute".into()
}

/// Whether `architecture` is an encoder this server runs.
pub fn is_encoder(architecture: &str) -> bool {
    family_and_head(architecture).is_some()
}

fn family_and_head(architecture: &str) -> Option<(EncoderFamily, EncoderHead)> {
    Some(match architecture {
        "BertModel" => (EncoderFamily::Bert, EncoderHead::Embeddings),
        "BertForSequenceClassification" => (EncoderFamily::Bert, EncoderHead::BertClassifier),
        "XLMRobertaModel" | "RobertaModel" => (EncoderFamily::Roberta, EncoderHead::Embeddings),
        "XLMRobertaForSequenceClassification" | "RobertaForSequenceClassification" => {
            (EncoderFamily::Roberta, EncoderHead::RobertaClassifier)
        }
        _ => return None,
    })
}

/// The encoder a `config.json` text describes; None when its `architectures[0]` is not an encoder. Settings this
/// server cannot run (another activation, relative positions, heads that do not divide the width) are errors that
/// name the key.
pub fn parse_encoder_config(text: &str) -> Result<Option<EncoderParams>> {
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| ModelError::Config(format!("config.json: {e}")))?;
    let Some(arch) = v.get("architectures").and_then(|a| a.get(0)).and_then(|a| a.as_str()) else { return Ok(None) };
    let Some((family, head)) = family_and_head(arch) else { return Ok(None) };
    let raw: Raw = serde_json::from_value(v.clone()).map_err(|e| ModelError::Config(format!("config.json: {e}")))?;
    let bad = |what: String| Err(ModelError::Config(format!("config.json ({arch}): {what}")));
    if raw.hidden_act != "gelu" {
        return bad(format!("hidden_act {:?} is not supported (gelu)", raw.hidden_act));
    }
    if raw.position_embedding_type != "absolute" {
        return bad(format!("position_embedding_type {:?} is not supported (absolute)", raw.position_embedding_type));
    }
    if raw.num_attention_heads == 0 || !raw.hidden_size.is_multiple_of(raw.num_attention_heads) {
        return bad(format!(
            "hidden_size {} is not a multiple of num_attention_heads {}",
            raw.hidden_size, raw.num_attention_heads
        ));
    }
    let labels = match head {
        EncoderHead::Embeddings => Vec::new(),
        _ => {
            let n = raw.num_labels.or(raw.id2label.as_ref().map(|m| m.len())).unwrap_or(2);
            (0..n)
                .map(|i| {
                    raw.id2label.as_ref().and_then(|m| m.get(&i.to_string()).cloned()).unwrap_or(format!("LABEL_{i}"))
                })
                .collect()
        }
    };
    let pad = raw.pad_token_id.unwrap_or(match family {
        EncoderFamily::Bert => 0,
        EncoderFamily::Roberta => 1,
    });
    let _ = raw.architectures;
    Ok(Some(EncoderParams {
        architecture: arch.to_string(),
        family,
        head,
        vocab_size: raw.vocab_size,
        hidden_size: raw.hidden_size,
        num_layers: raw.num_hidden_layers,
        num_heads: raw.num_attention_heads,
        intermediate_size: raw.intermediate_size,
        max_position_embeddings: raw.max_position_embeddings,
        type_vocab_size: raw.type_vocab_size.max(1),
        layer_norm_eps: raw.layer_norm_eps,
        pad_token_id: pad,
        labels,
        torch_dtype: raw.torch_dtype.or(raw.dtype),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bert_and_xlm_r_configs_parse_with_their_position_rules() {
        let bert = r#"{"architectures": ["BertModel"], "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "intermediate_size": 128}"#;
        let p = parse_encoder_config(bert).unwrap().unwrap();
        assert_eq!(
            (p.family, p.head, p.head_dim(), p.max_len(), p.position(3)),
            (EncoderFamily::Bert, EncoderHead::Embeddings, 16, 512, 3)
        );
        let xlmr = r#"{"architectures": ["XLMRobertaForSequenceClassification"], "vocab_size": 100, "hidden_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128, "pad_token_id": 1,
            "max_position_embeddings": 514, "type_vocab_size": 1, "id2label": {"0": "no", "1": "yes"}}"#;
        let p = parse_encoder_config(xlmr).unwrap().unwrap();
        assert_eq!((p.max_len(), p.position(0)), (512, 2));
        assert_eq!(p.labels, vec!["no", "yes"]);
        assert!(parse_encoder_config(r#"{"architectures": ["LlamaForCausalLM"]}"#).unwrap().is_none());
        let relu = bert.replace("\"intermediate_size\": 128", "\"intermediate_size\": 128, \"hidden_act\": \"relu\"");
        assert!(parse_encoder_config(&relu).unwrap_err().to_string().contains("hidden_act"));
    }
}
