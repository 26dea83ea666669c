//! An encoder checkpoint's tensors (BERT, XLM-RoBERTa), read by name from its safetensors files. The encoder's own
//! tensors sit under the architecture's prefix in a `...ForSequenceClassification` checkpoint (`bert.`, `roberta.`)
//! and under none in a bare `BertModel` (as sentence-transformers saves it); the classifier head is outside it.

use std::path::PathBuf;

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{Device, Tensor};

use crate::{ModelError, Result};

const PROBE: &str = "embeddings.word_embeddings.weight";

pub struct EncoderWeights {
    st: MmapedSafetensors,
    prefix: &'static str,
}

impl EncoderWeights {
    /// Opens the files and finds the encoder's prefix; a checkpoint without the word embeddings is an error.
    pub fn open(paths: &[PathBuf]) -> Result<Self> {
        if let Some(p) = paths.iter().find(|p| !p.is_file()) {
            return Err(ModelError::Weights(format!("weight file {} does not exist", p.display())));
        }
        // SAFETY: the files are mapped read-only and only read through the maps, as in `safetensors::load`.
        let st = unsafe { MmapedSafetensors::multi(paths) }
            .map_err(|e| ModelError::Weights(format!("cannot read safetensors header: {e}")))?;
        let prefix = ["", "bert.", "roberta.", "model."]
            .into_iter()
            .find(|p| st.get(&format!("{p}{PROBE}")).is_ok())
            .ok_or_else(|| {
            ModelError::Weights(format!("no `{PROBE}` in the checkpoint (an encoder's word embeddings)"))
        })?;
        Ok(Self { st, prefix })
    }

    /// An encoder tensor by its name without the prefix (`encoder.layer.0.attention.self.query.weight`).
    pub fn get(&self, name: &str) -> Result<Tensor> {
        self.load(&format!("{}{name}", self.prefix))
    }

    /// A tensor by its full name (the classifier head's, `classifier.weight`).
    pub fn head(&self, name: &str) -> Result<Tensor> {
        self.load(name)
    }

    /// Whether the checkpoint holds `name` (full name).
    pub fn has(&self, name: &str) -> bool {
        self.st.get(name).is_ok()
    }

    fn load(&self, name: &str) -> Result<Tensor> {
        self.st.load(name, &Device::Cpu).map_err(|e| ModelError::Weights(format!("tensor `{name}`: {e}")))
    }
}
