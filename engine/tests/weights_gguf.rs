//! GGUF weight loading: the real SmolLM2 Q4_1 file against what transformers loads from it
//! (tests/fixtures/weights/smollm2_q4_1_refs.json, made by scripts/reference/weights_refs.py), and synthetic GGUF
//! files with every supported storage type, llama.cpp's q/k permutation, and broken shapes or names.

#[path = "weights_support/mod.rs"]
mod support;

use std::path::PathBuf;

use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device, Tensor};
use rserve_engine::config::Architecture;
use rserve_engine::source::{resolve_model, ResolveOptions, ResolvedModel};
use rserve_engine::weights::gguf::{load_gguf, permute_rows, unpermute_rows};
use rserve_engine::weights::{self, expected_tensors};
use rserve_model_io::ModelError;
use rserve_tests::smollm2_gguf;
use serde_json::Value;
use support::*;

fn refs() -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/weights/smollm2_q4_1_refs.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol * (1.0 + b.abs())
}

#[test]
fn smollm2_gguf_matches_transformers() {
    let opts = ResolveOptions::with_cache_dir(std::env::temp_dir().join("rserve-unused-cache"));
    let resolved = resolve_model(smollm2_gguf().to_str().unwrap(), &opts).unwrap();
    assert!(matches!(resolved, ResolvedModel::Gguf(_)));
    let params = resolved.load_params().unwrap();
    let w = weights::load(&resolved, &params, DType::F32).unwrap();
    assert_eq!(w.len(), expected_tensors(&params).len());
    assert!(!w.contains("lm_head.weight"), "SmolLM2 ties its embeddings");
    assert_eq!(w.total_bytes(), w.param_count() * 4);

    let refs = refs();
    for (name, want) in refs["tensors"].as_object().unwrap() {
        let t = w.get(name).unwrap();
        let shape: Vec<usize> =
            want["shape"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
        assert_eq!(t.dims(), shape.as_slice(), "{name}");
        let sums = row_sums(t);
        let total: f64 = sums.iter().sum();
        assert!(close(total, want["sum"].as_f64().unwrap(), 1e-6), "{name}: sum {total} vs {}", want["sum"]);
        let row0: Vec<f32> = if t.rank() == 1 { t.to_vec1().unwrap() } else { t.get(0).unwrap().to_vec1().unwrap() };
        for (i, v) in want["row0_first"].as_array().unwrap().iter().enumerate() {
            // Exact as f32 (serde_json's float parsing may be one f64 ulp off the printed value).
            assert_eq!(row0[i], v.as_f64().unwrap() as f32, "{name}: row 0 value {i}");
        }
        if let Some(want_rows) = want.get("row_sums").and_then(Value::as_array) {
            assert_eq!(sums.len(), want_rows.len());
            for (r, (have, want)) in sums.iter().zip(want_rows).enumerate() {
                assert!(close(*have, want.as_f64().unwrap(), 1e-9), "{name}: row {r} sum {have} vs {want}");
            }
        }
    }
}

/// The fixture's q_proj rows really are in a different order than the GGUF stores them, so the comparison above
/// fails when the permutation is not undone.
#[test]
fn smollm2_q_rows_are_permuted_in_the_file() {
    let refs = refs();
    let want: Vec<f64> = refs["tensors"]["model.layers.0.self_attn.q_proj.weight"]["row_sums"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    let path = smollm2_gguf();
    let content = rserve_engine::config::gguf_meta::read_gguf_header(&path).unwrap();
    let mut file = std::fs::File::open(&path).unwrap();
    let raw = content.tensor(&mut file, "blk.0.attn_q.weight", &Device::Cpu).unwrap().dequantize(&Device::Cpu).unwrap();
    let raw_sums = row_sums(&raw);
    let differing = raw_sums.iter().zip(&want).filter(|(a, b)| !close(**a, **b, 1e-9)).count();
    assert!(differing > 100, "only {differing} rows differ: the file's rows should be permuted");
    let fixed = row_sums(&unpermute_rows(&raw, 9).unwrap());
    assert!(fixed.iter().zip(&want).all(|(a, b)| close(*a, *b, 1e-9)));
}

#[test]
fn smollm2_loads_as_bf16() {
    let path = smollm2_gguf();
    let params = rserve_engine::config::gguf_meta::params_from_gguf_file(&path).unwrap();
    let w32 = load_gguf(&path, &params, DType::F32).unwrap();
    let w16 = load_gguf(&path, &params, DType::BF16).unwrap();
    assert_eq!(w16.dtype(), DType::BF16);
    assert_eq!(w16.total_bytes() * 2, w32.total_bytes());
    let name = "model.layers.3.mlp.down_proj.weight";
    let want = w32.get(name).unwrap().to_dtype(DType::BF16).unwrap();
    assert_eq!(max_abs_diff(w16.get(name).unwrap(), &want), 0.0);
}

#[test]
fn permutation_moves_rows_as_llama_cpp_documents() {
    // One head of dimension 4: llama.cpp stores HF rows (0, 1 | 2, 3) as 0, 2, 1, 3 (pairs of x_j and x_{j+d/2}).
    let hf = Tensor::arange(0f32, 8., &Device::Cpu).unwrap().reshape((4, 2)).unwrap();
    let stored = permute_rows(&hf, 1).unwrap();
    assert_eq!(stored.to_vec2::<f32>().unwrap(), vec![vec![0., 1.], vec![4., 5.], vec![2., 3.], vec![6., 7.]]);
    assert_eq!(unpermute_rows(&stored, 1).unwrap().to_vec2::<f32>().unwrap(), hf.to_vec2::<f32>().unwrap());
    let big = Tensor::randn(0f32, 1., (3 * 64, 5), &Device::Cpu).unwrap();
    let back = unpermute_rows(&permute_rows(&big, 3).unwrap(), 3).unwrap();
    assert_eq!(max_abs_diff(&big, &back), 0.0);
    assert!(unpermute_rows(&big, 7).is_err());
}

/// Storage of each projection in layer 0 and in the other layers: every GGML type appears at least once.
const PROJ_STORAGE: [(&str, [GgmlDType; 2]); 7] = [
    ("q_proj", [GgmlDType::Q4K, GgmlDType::Q4_0]),
    ("k_proj", [GgmlDType::Q6K, GgmlDType::Q8_0]),
    ("v_proj", [GgmlDType::Q4_1, GgmlDType::F16]),
    ("o_proj", [GgmlDType::BF16, GgmlDType::Q4K]),
    ("gate_proj", [GgmlDType::F16, GgmlDType::Q6K]),
    ("up_proj", [GgmlDType::Q8_0, GgmlDType::BF16]),
    ("down_proj", [GgmlDType::Q4_0, GgmlDType::Q4_1]),
];

fn storage_for(name: &str) -> GgmlDType {
    if name.ends_with("norm.weight") || name.ends_with(".bias") {
        return GgmlDType::F32;
    }
    if let Some((_, [l0, rest])) = PROJ_STORAGE.iter().find(|(proj, _)| name.contains(proj)) {
        return if name.contains("layers.0.") { *l0 } else { *rest };
    }
    if name == "model.embed_tokens.weight" {
        GgmlDType::Q8_0
    } else {
        GgmlDType::F32
    }
}

#[test]
fn every_storage_type_dequantizes_and_unpermutes() {
    let dir = tempfile::tempdir().unwrap();
    for (arch, architecture, tie) in [("llama", Architecture::Llama, false), ("qwen2", Architecture::Qwen2, true)] {
        let params = tiny_params(architecture, tie);
        let hf = random_hf_tensors(&params);
        let path = dir.path().join(format!("{arch}.gguf"));
        write_gguf(&path, arch, &params, &hf, storage_for);
        let read_params = rserve_engine::config::gguf_meta::params_from_gguf_file(&path).unwrap();
        assert_eq!(read_params, params, "{arch}: params from the metadata");
        let w = load_gguf(&path, &params, DType::F32).unwrap();
        assert_eq!(w.len(), hf.len());
        for (name, original) in &hf {
            let storage = storage_for(name);
            // Blocks run along rows, so the row permutation commutes with quantization: the loader must return
            // exactly the quantization round trip of the Hugging Face tensor.
            let want = through(original, storage);
            let got = w.get(name).unwrap();
            assert_eq!(max_abs_diff(got, &want), 0.0, "{arch} {name} ({storage:?})");
            let err = max_abs_diff(got, original);
            assert!(err < 0.5, "{arch} {name} ({storage:?}): quantization error {err}");
        }
    }
}

#[test]
fn shape_and_name_errors_are_clear() {
    let dir = tempfile::tempdir().unwrap();
    let params = tiny_params(Architecture::Llama, true);
    let mut hf = random_hf_tensors(&params);
    let path = dir.path().join("ok.gguf");
    write_gguf(&path, "llama", &params, &hf, |_| GgmlDType::F32);

    let mut wrong = params.clone();
    wrong.dims.intermediate_size = 768;
    let err = load_gguf(&path, &wrong, DType::F32).unwrap_err().to_string();
    assert!(err.contains("model.layers.0.mlp.gate_proj.weight") && err.contains("[512, 256]"), "{err}");
    assert!(err.contains("blk.0.ffn_gate.weight"), "{err}");

    let mut untied = params.clone();
    untied.tie_word_embeddings = false;
    let err = load_gguf(&path, &untied, DType::F32).unwrap_err().to_string();
    assert!(err.contains("output.weight") && err.contains("lm_head.weight"), "{err}");

    hf.remove("model.layers.1.post_attention_layernorm.weight");
    let path = dir.path().join("missing.gguf");
    write_gguf(&path, "llama", &params, &hf, |_| GgmlDType::F32);
    let err = load_gguf(&path, &params, DType::F32).unwrap_err().to_string();
    assert!(err.contains("blk.1.ffn_norm.weight"), "{err}");

    let err = load_gguf(&path, &params, DType::U8).unwrap_err();
    assert!(matches!(err, ModelError::InvalidArgument(_)), "{err}");

    let garbage = dir.path().join("garbage.gguf");
    std::fs::write(&garbage, b"GGUF\x03\x00\x00\x00 not really").unwrap();
    assert!(load_gguf(&garbage, &params, DType::F32).is_err());
}
