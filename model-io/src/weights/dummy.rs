//! `--load-format dummy`: random weights of the shapes a model's `config.json` implies (as vLLM's dummy format), so
//! speed can be measured at real scale without the checkpoint. Norm weights are 1, biases 0, every other tensor
//! uniform in `[-DUMMY_RANGE, DUMMY_RANGE]`. Values depend only on the seed and the tensor's name (not on the thread
//! count): each chunk of a tensor draws from its own SplitMix64 stream keyed by (seed, name, chunk).

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use rayon::prelude::*;

use super::{expected_tensors, Weights};
use crate::config::ModelParams;
use crate::source::local::model_files;
use crate::source::{ModelOrigin, ResolvedModel, SafetensorsModel};
use crate::{ModelError, Result};

/// Half-width of the uniform distribution of dummy matrices.
pub const DUMMY_RANGE: f32 = 0.02;
const CHUNK: usize = 1 << 16;

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn name_hash(name: &str) -> u64 {
    rserve_backend::hash::fnv1a64(&[name.as_bytes()])
}

/// Values of one tensor as f32 (`len` of them), deterministic in (seed, name).
pub fn dummy_values(name: &str, len: usize, seed: u64) -> Vec<f32> {
    if name.ends_with("norm.weight") {
        return vec![1.0; len];
    }
    if name.ends_with(".bias") {
        return vec![0.0; len];
    }
    let key = seed ^ name_hash(name);
    let mut out = vec![0f32; len];
    out.par_chunks_mut(CHUNK).enumerate().for_each(|(c, chunk)| {
        let mut s = key ^ (c as u64).wrapping_mul(0xd1b5_4a32_d192_ed03);
        for v in chunk.iter_mut() {
            // 24 random bits -> [0, 1) -> [-R, R].
            let u = (splitmix64(&mut s) >> 40) as f32 / (1u64 << 24) as f32;
            *v = (2.0 * u - 1.0) * DUMMY_RANGE;
        }
    });
    out
}

fn tensor(values: Vec<f32>, shape: &[usize], dtype: DType) -> Result<Tensor> {
    Ok(match dtype {
        DType::F32 => Tensor::from_vec(values, shape, &Device::Cpu)?,
        DType::BF16 => {
            let v: Vec<half::bf16> = values.par_iter().map(|&x| half::bf16::from_f32(x)).collect();
            Tensor::from_vec(v, shape, &Device::Cpu)?
        }
        DType::F16 => {
            let v: Vec<half::f16> = values.par_iter().map(|&x| half::f16::from_f32(x)).collect();
            Tensor::from_vec(v, shape, &Device::Cpu)?
        }
        other => return Err(ModelError::InvalidArgument(format!("dummy weights in {other:?} are not supported"))),
    })
}

/// Random weights for every tensor `params` needs, in `dtype`.
pub fn dummy(params: &ModelParams, dtype: DType, seed: u64) -> Result<Weights> {
    super::check_dtype(dtype)?;
    let mut map = HashMap::new();
    for spec in expected_tensors(params) {
        let len: usize = spec.shape.iter().product();
        let t = tensor(dummy_values(&spec.name, len, seed), &spec.shape, dtype)?;
        map.insert(spec.name, t);
    }
    Weights::from_tensors(map, params, dtype)
}

/// A local folder with a `config.json` (and a tokenizer) but no weight files, as a model for the dummy format.
pub fn resolve(spec: &str) -> Result<ResolvedModel> {
    let dir = Path::new(spec);
    let config = dir.join("config.json");
    if !config.is_file() {
        return Err(ModelError::InvalidArgument(format!(
            "--load-format dummy needs a folder with a config.json; '{spec}' has none"
        )));
    }
    Ok(ResolvedModel::Safetensors(SafetensorsModel {
        dir: dir.to_path_buf(),
        config,
        safetensors: Vec::new(),
        index: None,
        files: model_files(dir),
        origin: ModelOrigin::Local,
    }))
}
