//! A sentence-transformers `Dense` module on the host: `act(x . W^T + b)`, its weights read from the module's
//! folder (`model.safetensors`, tensors `linear.weight` `[out, in]` and `linear.bias`, any float type, kept as f32);
//! a classifier head's layers are the same computation.

use rserve_model_io::config::pooling::{DenseActivation, DenseLayer};
use safetensors::{Dtype, SafeTensors};

use crate::error::{EngineError, Result};

#[derive(Debug, Clone)]
pub struct Dense {
    weight: Vec<f32>,
    bias: Option<Vec<f32>>,
    in_features: usize,
    out_features: usize,
    activation: DenseActivation,
}

fn err(layer: &DenseLayer, what: impl std::fmt::Display) -> EngineError {
    EngineError::InvalidArgument(format!("{}: {what}", layer.dir.display()))
}

fn to_f32(layer: &DenseLayer, name: &str, st: &SafeTensors<'_>, len: usize) -> Result<Vec<f32>> {
    let t = st.tensor(name).map_err(|e| err(layer, format!("tensor {name}: {e}")))?;
    let data = t.data();
    let v: Vec<f32> = match t.dtype() {
        Dtype::F32 => data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
        Dtype::BF16 => data.chunks_exact(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        Dtype::F16 => data.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        other => return Err(err(layer, format!("tensor {name} is {other:?}; a Dense layer takes f32, bf16 or f16"))),
    };
    if v.len() != len {
        return Err(err(layer, format!("tensor {name} has {} values, the config implies {len}", v.len())));
    }
    Ok(v)
}

impl Dense {
    /// Reads the layer's weights; a missing file or a tensor of the wrong size names itself.
    pub fn load(layer: &DenseLayer) -> Result<Self> {
        let path = layer.dir.join("model.safetensors");
        let bytes = std::fs::read(&path).map_err(|e| err(layer, format!("{}: {e}", path.display())))?;
        let st = SafeTensors::deserialize(&bytes).map_err(|e| err(layer, format!("{}: {e}", path.display())))?;
        let (i, o) = (layer.in_features, layer.out_features);
        let weight = to_f32(layer, "linear.weight", &st, i * o)?;
        let bias = if layer.bias { Some(to_f32(layer, "linear.bias", &st, o)?) } else { None };
        Ok(Self { weight, bias, in_features: i, out_features: o, activation: layer.activation })
    }

    /// A layer from weights already read (`weight` `[out, in]`), e.g. a classifier head's.
    pub fn from_parts(
        weight: Vec<f32>,
        bias: Vec<f32>,
        in_features: usize,
        activation: DenseActivation,
    ) -> Result<Self> {
        let out_features = bias.len();
        if weight.len() != in_features * out_features {
            return Err(EngineError::InvalidArgument(format!(
                "a head layer of {} weights for {in_features} inputs and {out_features} outputs",
                weight.len()
            )));
        }
        Ok(Self { weight, bias: Some(bias), in_features, out_features, activation })
    }

    pub fn in_features(&self) -> usize {
        self.in_features
    }

    pub fn out_features(&self) -> usize {
        self.out_features
    }

    /// `act(x . W^T + b)` of one vector.
    pub fn apply(&self, x: &[f32]) -> Vec<f32> {
        (0..self.out_features)
            .map(|o| {
                let row = &self.weight[o * self.in_features..(o + 1) * self.in_features];
                let mut y = row.iter().zip(x).map(|(&w, &v)| w as f64 * v as f64).sum::<f64>() as f32;
                if let Some(b) = &self.bias {
                    y += b[o];
                }
                match self.activation {
                    DenseActivation::Identity => y,
                    DenseActivation::Tanh => y.tanh(),
                }
            })
            .collect()
    }
}
