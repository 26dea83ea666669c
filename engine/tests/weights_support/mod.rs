//! Shared helpers for the source / config / weights / convert tests: small synthetic llama-family checkpoints
//! (random weights in Hugging Face layout, written as safetensors or GGUF). The real test models are found through
//! `rserve_tests`.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use rserve_engine::config::{Architecture, ModelDims, ModelParams};
use rserve_engine::weights::{expected_tensors, gguf::permute_rows, names::hf_to_gguf};

/// A small llama-family configuration; hidden 256 so that every k-quant block (256 values) fits a row.
pub fn tiny_params(architecture: Architecture, tie: bool) -> ModelParams {
    ModelParams {
        architecture,
        dims: ModelDims {
            vocab_size: 64,
            hidden_size: 256,
            intermediate_size: 512,
            num_layers: 2,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 64,
        },
        rms_norm_eps: 1e-5,
        rope_theta: 10000.0,
        rope_scaling: None,
        local_rope: None,
        layers: rserve_engine::config::uniform_layers(2, None),
        qk_norm: false,
        activation: rserve_engine::backend::Activation::Silu,
        attn_scale: 0.125,
        attn_softcap: None,
        final_softcap: None,
        max_position_embeddings: 512,
        tie_word_embeddings: tie,
        attention_bias: architecture == Architecture::Qwen2,
        o_proj_bias: false,
        attention_sinks: false,
        bos_token_id: Some(1),
        eos_token_ids: vec![2],
        torch_dtype: None,
        sliding_window: None,
        moe: None,
    }
}

/// Random f32 tensors with the Hugging Face names and shapes `params` needs.
pub fn random_hf_tensors(params: &ModelParams) -> HashMap<String, Tensor> {
    expected_tensors(params)
        .into_iter()
        .map(|spec| {
            let t = Tensor::randn(0f32, 0.5, spec.shape.as_slice(), &Device::Cpu).unwrap();
            (spec.name, t)
        })
        .collect()
}

fn tokens_value(vocab: usize) -> Value {
    Value::Array((0..vocab).map(|i| Value::String(format!("<t{i}>"))).collect())
}

/// Writes a GGUF file the way llama.cpp lays one out: llama.cpp names, `{arch}.*` metadata, and for `llama` the q/k
/// rows permuted. `dtype_for` picks each tensor's storage type by its Hugging Face name.
pub fn write_gguf(
    path: &Path,
    arch: &str,
    params: &ModelParams,
    hf: &HashMap<String, Tensor>,
    dtype_for: impl Fn(&str) -> GgmlDType,
) {
    let key = |s: &str| format!("{arch}.{s}");
    let mut meta: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(arch.into())),
        (key("block_count"), Value::U32(params.num_layers as u32)),
        (key("context_length"), Value::U32(params.max_position_embeddings as u32)),
        (key("embedding_length"), Value::U32(params.hidden_size as u32)),
        (key("feed_forward_length"), Value::U32(params.intermediate_size as u32)),
        (key("attention.head_count"), Value::U32(params.num_heads as u32)),
        (key("attention.head_count_kv"), Value::U32(params.num_kv_heads as u32)),
        (key("attention.key_length"), Value::U32(params.head_dim as u32)),
        (key("attention.value_length"), Value::U32(params.head_dim as u32)),
        (key("rope.freq_base"), Value::F32(params.rope_theta as f32)),
        (key("attention.layer_norm_rms_epsilon"), Value::F32(params.rms_norm_eps as f32)),
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        ("tokenizer.ggml.tokens".into(), tokens_value(params.vocab_size)),
    ];
    if let Some(bos) = params.bos_token_id {
        meta.push(("tokenizer.ggml.bos_token_id".into(), Value::U32(bos)));
    }
    if let Some(eos) = params.eos_token_ids.first() {
        meta.push(("tokenizer.ggml.eos_token_id".into(), Value::U32(*eos)));
    }
    let mut names: Vec<&String> = hf.keys().collect();
    names.sort();
    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    for name in names {
        let mut t = hf[name].clone();
        if arch == "llama" && name.ends_with("q_proj.weight") {
            t = permute_rows(&t, params.num_heads).unwrap();
        } else if arch == "llama" && name.ends_with("k_proj.weight") {
            t = permute_rows(&t, params.num_kv_heads).unwrap();
        }
        let q = QTensor::quantize(&t, dtype_for(name)).unwrap();
        tensors.push((hf_to_gguf(name).unwrap(), q));
    }
    let meta_refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut file = std::fs::File::create(path).unwrap();
    gguf_file::write(&mut file, &meta_refs, &tensor_refs).unwrap();
}

/// What a tensor becomes after a round trip through `dtype` (the values a GGUF loader must return).
pub fn through(t: &Tensor, dtype: GgmlDType) -> Tensor {
    QTensor::quantize(t, dtype).unwrap().dequantize(&Device::Cpu).unwrap()
}

/// Largest absolute difference between two tensors (compared in f32).
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
    let a = a.to_dtype(DType::F32).unwrap();
    let b = b.to_dtype(DType::F32).unwrap();
    (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap()
}

/// Row sums in f64 of a 2-D tensor (or the one sum of a 1-D tensor).
pub fn row_sums(t: &Tensor) -> Vec<f64> {
    let t = t.to_dtype(DType::F32).unwrap();
    match t.rank() {
        1 => vec![t.to_vec1::<f32>().unwrap().iter().map(|&x| x as f64).sum()],
        _ => t.to_vec2::<f32>().unwrap().iter().map(|r| r.iter().map(|&x| x as f64).sum()).collect(),
    }
}
