//! Model weights on the CPU: `Weights` maps Hugging Face tensor names (`model.layers.{i}.self_attn.q_proj.weight`,
//! ...) to `candle_core::Tensor`s in one requested dtype (F32, BF16 or F16).
//!
//! Loaders: `safetensors` (mmapped, single or sharded, bf16/f16/f32) and `gguf` (dequantized at load, llama.cpp names
//! mapped back to HF names, llama's q/k row permutation undone). Invariant: a `Weights` holds exactly the tensors
//! `expected_tensors(params)` lists, each with the shape it gives, so models can index without further checks.

pub mod dummy;
pub mod encoder;
pub mod gguf;
pub mod gpt_oss;
pub mod names;
mod progress;
pub mod safetensors;

use std::collections::HashMap;

use crate::shard::Shard;

use candle_core::{DType, Tensor};

use crate::config::ModelParams;
use crate::source::ResolvedModel;
use crate::{ModelError, Result};

pub use names::{expected_tensors, TensorSpec};
pub use safetensors::safetensors_param_count;

/// The model's tensors by Hugging Face name, all in one dtype on the CPU.
#[derive(Debug, Clone)]
pub struct Weights {
    tensors: HashMap<String, Tensor>,
    dtype: DType,
    /// The tensors were cut to one shard while loading (`load_shard`): take them as they are.
    cut: bool,
    /// Block-format twins of tensors dequantized from GGUF, kept alive for the CPU backend (`backend::cpu::quant`).
    packed: rserve_backend::cpu::quant::Keep,
}

/// Checks that a dtype is one the weights may be held in.
pub fn check_dtype(dtype: DType) -> Result<()> {
    match dtype {
        DType::F32 | DType::BF16 | DType::F16 => Ok(()),
        other => Err(ModelError::InvalidArgument(format!("weights can be loaded as f32, bf16 or f16, not {other:?}"))),
    }
}

impl Weights {
    /// Builds `Weights` from named tensors: keeps the tensors `params` needs, checks that none is missing and that
    /// every shape matches, and converts them to `dtype`. Extra tensors (e.g. `rotary_emb.inv_freq`, or an
    /// `lm_head.weight` of a tied model) are dropped.
    pub fn from_tensors(mut tensors: HashMap<String, Tensor>, params: &ModelParams, dtype: DType) -> Result<Self> {
        check_dtype(dtype)?;
        names::unfuse(&mut tensors, params)?;
        let mut out = HashMap::new();
        for spec in expected_tensors(params) {
            let tensor = tensors.remove(&spec.name).ok_or_else(|| {
                ModelError::Weights(format!("the checkpoint has no tensor `{}` (shape {:?})", spec.name, spec.shape))
            })?;
            spec.check(tensor.dims(), params)?;
            let tensor = if tensor.dtype() == dtype { tensor } else { tensor.to_dtype(dtype)? };
            out.insert(spec.name, tensor);
        }
        Ok(Weights { tensors: out, dtype, cut: false, packed: Default::default() })
    }

    /// Tensors already cut to one shard (shapes were checked against the checkpoint's header before cutting).
    pub fn from_cut_tensors(tensors: HashMap<String, Tensor>, dtype: DType) -> Self {
        Weights { tensors, dtype, cut: true, packed: Default::default() }
    }

    /// The same weights, keeping `packed` (twins registered with `backend::cpu::quant::register`) alive with them.
    pub fn with_packed(mut self, packed: rserve_backend::cpu::quant::Keep) -> Self {
        self.packed = packed;
        self
    }

    /// The packed twins these weights keep alive.
    pub fn packed(&self) -> &rserve_backend::cpu::quant::Keep {
        &self.packed
    }

    /// The tensors were cut to one shard while loading.
    pub fn is_cut(&self) -> bool {
        self.cut
    }

    /// The tensor called `name`; the error names it.
    pub fn get(&self, name: &str) -> Result<&Tensor> {
        self.tensors.get(name).ok_or_else(|| ModelError::Weights(format!("no tensor named `{name}` was loaded")))
    }

    /// Whether a tensor called `name` was loaded.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// `lm_head.weight`, or the token embeddings when they are tied.
    pub fn lm_head(&self) -> Result<&Tensor> {
        match self.tensors.get(names::LM_HEAD) {
            Some(t) => Ok(t),
            None => self.get(names::EMBED_TOKENS),
        }
    }

    /// The dtype every tensor is held in.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The dtype as a weight type (what the model computes in; f32 for anything else).
    pub fn compute_dtype(&self) -> rserve_backend::WeightDType {
        rserve_backend::WeightDType::from_candle(self.dtype).unwrap_or(rserve_backend::WeightDType::F32)
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether no tensor was loaded (never true for a loaded model).
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// Tensor names, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.tensors.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// Bytes held by all tensors (a tensor kept only as GGUF blocks counts what the CPU backend holds of it:
    /// `PackedMatrix::resident_bytes`).
    pub fn total_bytes(&self) -> usize {
        use rserve_backend::cpu::quant;
        let bytes = |t: &Tensor| match quant::is_placeholder(t) {
            true => quant::lookup(t).map_or(0, |p| p.resident_bytes()),
            false => t.elem_count() * t.dtype().size_in_bytes(),
        };
        self.tensors.values().map(bytes).sum()
    }

    /// Number of parameters (elements) held.
    pub fn param_count(&self) -> usize {
        self.tensors.values().map(Tensor::elem_count).sum()
    }

    /// Iterates over `(name, tensor)` in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Tensor)> {
        self.tensors.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Gives the map away (e.g. to save it).
    pub fn into_tensors(self) -> HashMap<String, Tensor> {
        self.tensors
    }
}

/// Loads the weights of a resolved model as `dtype`, checking every shape against `params`.
pub fn load(resolved: &ResolvedModel, params: &ModelParams, dtype: DType) -> Result<Weights> {
    match resolved {
        ResolvedModel::Safetensors(m) => safetensors::load_safetensors(&m.safetensors, params, dtype),
        ResolvedModel::Gguf(m) => gguf::load_gguf(&m.file, params, dtype),
    }
}

/// As `load`, but GGUF tensors the CPU backend multiplies packed keep only their blocks (`gguf::load_gguf_packed`):
/// for the CPU backend keeping GGUF weights packed (the default; not with `--cpu-dequantize-weights`), whose host
/// memory then holds the file's blocks, not an f32 copy.
pub fn load_packed(resolved: &ResolvedModel, params: &ModelParams, dtype: DType) -> Result<Weights> {
    match resolved {
        ResolvedModel::Safetensors(m) => safetensors::load_safetensors(&m.safetensors, params, dtype),
        ResolvedModel::Gguf(m) => gguf::load_gguf_packed(&m.file, params, dtype),
    }
}

/// Loads only what `shard` holds: safetensors tensors of other stages are skipped and each kept one is cut to the
/// shard's slice as it is read, so an MPI rank's host memory holds its share, not the checkpoint (a 405B model on
/// 16 ranks). GGUF files (small models) load whole and are cut at upload.
pub fn load_shard(resolved: &ResolvedModel, params: &ModelParams, dtype: DType, shard: &Shard) -> Result<Weights> {
    match resolved {
        ResolvedModel::Safetensors(m) => safetensors::load_safetensors_shard(&m.safetensors, params, dtype, shard),
        ResolvedModel::Gguf(m) => gguf::load_gguf(&m.file, params, dtype),
    }
}
