//! Safetensors weight loading: single and sharded checkpoints in bf16, f16 and f32, loaded as each target dtype, and
//! the errors for missing tensors, wrong shapes and unsupported storage types.

#[path = "weights_support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Tensor};
use rserve_engine::config::Architecture;
use rserve_engine::source::{resolve_model, ResolveOptions, ResolvedModel};
use rserve_engine::weights::{self, expected_tensors, safetensors::load_safetensors, safetensors_param_count};
use support::*;

fn save(path: &Path, tensors: &HashMap<String, Tensor>, dtype: DType) {
    let converted: HashMap<String, Tensor> =
        tensors.iter().map(|(k, v)| (k.clone(), v.to_dtype(dtype).unwrap())).collect();
    candle_core::safetensors::save(&converted, path).unwrap();
}

/// Writes `tensors` as two shards plus `model.safetensors.index.json`; returns the shard paths.
fn save_sharded(dir: &Path, tensors: &HashMap<String, Tensor>, dtype: DType) -> Vec<PathBuf> {
    let mut names: Vec<&String> = tensors.keys().collect();
    names.sort();
    let (a, b) = names.split_at(names.len() / 2);
    let mut weight_map = serde_json::Map::new();
    let mut paths = Vec::new();
    for (i, part) in [a, b].iter().enumerate() {
        let file = format!("model-0000{}-of-00002.safetensors", i + 1);
        let subset: HashMap<String, Tensor> = part.iter().map(|n| ((*n).clone(), tensors[*n].clone())).collect();
        save(&dir.join(&file), &subset, dtype);
        for n in part.iter() {
            weight_map.insert((*n).clone(), file.clone().into());
        }
        paths.push(dir.join(file));
    }
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    paths
}

#[test]
fn every_source_dtype_to_every_target_dtype() {
    let params = tiny_params(Architecture::Llama, false);
    let hf = random_hf_tensors(&params);
    let dir = tempfile::tempdir().unwrap();
    for source in [DType::F32, DType::BF16, DType::F16] {
        let path = dir.path().join(format!("{source:?}.safetensors"));
        save(&path, &hf, source);
        for target in [DType::F32, DType::BF16, DType::F16] {
            let w = load_safetensors(std::slice::from_ref(&path), &params, target).unwrap();
            assert_eq!(w.dtype(), target);
            assert_eq!(w.len(), expected_tensors(&params).len());
            assert_eq!(w.total_bytes(), w.param_count() * target.size_in_bytes());
            for (name, original) in &hf {
                let t = w.get(name).unwrap();
                assert_eq!(t.dtype(), target);
                // Exactly what converting the stored values to the target type gives.
                let want = original.to_dtype(source).unwrap().to_dtype(target).unwrap();
                assert_eq!(max_abs_diff(t, &want), 0.0, "{name}: {source:?} -> {target:?}");
            }
        }
    }
}

#[test]
fn sharded_checkpoint_resolves_and_loads() {
    let params = tiny_params(Architecture::Qwen2, true);
    let hf = random_hf_tensors(&params);
    let dir = tempfile::tempdir().unwrap();
    let shards = save_sharded(dir.path(), &hf, DType::BF16);
    let config = rserve_engine::convert::config_json(&params, DType::BF16).unwrap();
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();

    let opts = ResolveOptions::with_cache_dir(dir.path().join("no-cache"));
    let resolved = resolve_model(dir.path().to_str().unwrap(), &opts).unwrap();
    let ResolvedModel::Safetensors(m) = &resolved else { panic!("expected a safetensors model") };
    assert_eq!(m.safetensors, shards);
    assert!(m.index.is_some());
    let loaded_params = resolved.load_params().unwrap();
    assert!(loaded_params.attention_bias);
    let w = weights::load(&resolved, &loaded_params, DType::F32).unwrap();
    assert!(w.contains("model.layers.1.self_attn.v_proj.bias"));
    for (name, original) in &hf {
        let want = original.to_dtype(DType::BF16).unwrap().to_dtype(DType::F32).unwrap();
        assert_eq!(max_abs_diff(w.get(name).unwrap(), &want), 0.0, "{name}");
    }
    assert_eq!(w.lm_head().unwrap().dims(), w.get("model.embed_tokens.weight").unwrap().dims());
    let count: usize = hf.values().map(Tensor::elem_count).sum();
    assert_eq!(safetensors_param_count(&shards).unwrap(), count as u64);
}

#[test]
fn extra_tensors_are_ignored_and_missing_ones_named() {
    let params = tiny_params(Architecture::Llama, true);
    let mut hf = random_hf_tensors(&params);
    // A tied checkpoint that still carries lm_head, plus a buffer transformers used to save.
    hf.insert("lm_head.weight".into(), hf["model.embed_tokens.weight"].clone());
    hf.insert(
        "model.layers.0.self_attn.rotary_emb.inv_freq".into(),
        Tensor::ones(32, DType::F32, &candle_core::Device::Cpu).unwrap(),
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    save(&path, &hf, DType::F32);
    let w = load_safetensors(std::slice::from_ref(&path), &params, DType::F32).unwrap();
    assert!(!w.contains("lm_head.weight") && !w.contains("model.layers.0.self_attn.rotary_emb.inv_freq"));
    let err = w.get("model.layers.9.mlp.up_proj.weight").unwrap_err().to_string();
    assert!(err.contains("model.layers.9.mlp.up_proj.weight"), "{err}");

    hf.remove("model.layers.1.mlp.down_proj.weight");
    save(&path, &hf, DType::F32);
    let err = load_safetensors(std::slice::from_ref(&path), &params, DType::F32).unwrap_err().to_string();
    assert!(err.contains("model.layers.1.mlp.down_proj.weight"), "{err}");
}

#[test]
fn wrong_shapes_and_dtypes_are_reported() {
    let params = tiny_params(Architecture::Llama, true);
    let mut hf = random_hf_tensors(&params);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");

    let mut more_heads = params.clone();
    more_heads.dims.num_kv_heads = 4;
    save(&path, &hf, DType::F32);
    let err = load_safetensors(std::slice::from_ref(&path), &more_heads, DType::F32).unwrap_err().to_string();
    assert!(err.contains("model.layers.0.self_attn.k_proj.weight") && err.contains("[128, 256]"), "{err}");
    assert!(err.contains("[256, 256]") && err.contains("num_kv_heads=4"), "{err}");

    hf.insert("model.norm.weight".into(), Tensor::zeros(256, DType::U8, &candle_core::Device::Cpu).unwrap());
    candle_core::safetensors::save(&hf, &path).unwrap();
    let err = load_safetensors(std::slice::from_ref(&path), &params, DType::F32).unwrap_err().to_string();
    assert!(err.contains("model.norm.weight") && err.contains("U8"), "{err}");

    let err = load_safetensors(&[dir.path().join("absent.safetensors")], &params, DType::F32).unwrap_err();
    assert!(err.to_string().contains("absent.safetensors"), "{err}");
}
