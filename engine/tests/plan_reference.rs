//! The planner's model-wide numbers checked against transformers on every config under tests/fixtures/configs/
//! (refs.json, made by scripts/reference/plan_refs.py): the parameter count of the model transformers builds from the
//! config, the K/V values its cache holds per token, and, for sliding-window configs, the values it holds after
//! 2 x window tokens. Also the GGUF path: SmolLM2's tensor directory against its config shapes.

mod common;

use rserve_engine::plan::memory::kv_bytes_per_token;
use rserve_engine::plan::params::count_params;
use rserve_engine::plan::source::{locate, ConfigSource};
use rserve_engine::plan::{self, ModelShape, ParamSource, PlanOptions};
use rserve_engine::source::ResolveOptions;
use serde_json::Value;

fn refs() -> Value {
    let text = std::fs::read_to_string(common::fixture("configs/refs.json")).expect("refs.json");
    serde_json::from_str(&text).expect("refs.json parses")
}

fn shape(name: &str) -> ModelShape {
    let text = std::fs::read_to_string(common::fixture(&format!("configs/{name}.json"))).expect("fixture");
    ModelShape::from_config_json(&text).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn configs() -> Vec<(String, Value)> {
    let r = refs();
    let map = r["configs"].as_object().expect("configs").clone();
    assert!(map.len() >= 9, "expected every fixture config in refs.json");
    map.into_iter().collect()
}

#[test]
fn parameter_counts_match_transformers() {
    for (name, r) in configs() {
        let counted = count_params(&shape(&name)).total;
        assert_eq!(counted, r["parameters"].as_u64().unwrap(), "{name}: parameters from config shapes");
    }
}

#[test]
fn kv_values_per_token_match_the_transformers_cache() {
    for (name, r) in configs() {
        // One byte per element: bytes per token = values per token.
        let ours = kv_bytes_per_token(&shape(&name), 1);
        assert_eq!(ours, r["kv_values_per_token"].as_u64().unwrap(), "{name}: K/V values per token");
    }
}

#[test]
fn sliding_layers_match_transformers_layer_types() {
    for (name, r) in configs() {
        let s = shape(&name);
        let Some(types) = r["layer_types"].as_array() else { continue };
        let sliding = types.iter().filter(|t| t.as_str() == Some("sliding_attention")).count();
        assert_eq!(s.sliding.map_or(0, |w| w.sliding_layers), sliding, "{name}: sliding layers");
        assert_eq!(types.len(), s.num_layers, "{name}: layers");
    }
}

#[test]
fn windowed_kv_matches_the_transformers_sliding_cache() {
    let mut checked = 0;
    for (name, r) in configs() {
        let (Some(len), Some(values)) = (r["kv_len"].as_u64(), r["kv_values_at_len"].as_u64()) else { continue };
        let s = shape(&name);
        let sliding = s.sliding.expect("a sliding config").sliding_layers as u64;
        let opts = PlanOptions { max_model_len: Some(len as usize), ..PlanOptions::default() };
        let p = plan::plan_shape(&name, "fixture", s.clone(), None, &opts).unwrap();
        let per_layer = p.kv_bytes_per_token / p.kv_cache_dtype.bytes() as u64 / s.num_layers as u64;
        // transformers keeps window - 1 tokens per sliding layer (what the next token attends to besides itself);
        // a cache that also holds the token being written keeps one more.
        let expected = (values + sliding * per_layer) * p.kv_cache_dtype.bytes() as u64;
        assert_eq!(p.kv_bytes_per_sequence_windowed, Some(expected), "{name}: windowed KV at {len} tokens");
        assert!(p.warnings.iter().any(|w| w.contains("sliding-window")), "{name}: {:?}", p.warnings);
        checked += 1;
    }
    assert!(checked >= 2, "gemma2 and mistral fixtures have windows");
}

#[test]
fn gguf_tensor_directory_agrees_with_config_shapes() {
    let gguf = common::smollm2_gguf();
    let source = locate(gguf.to_str().unwrap(), &ResolveOptions::with_cache_dir("/nonexistent")).unwrap();
    assert!(matches!(source, ConfigSource::Gguf { .. }));
    let (s, headers) = plan::read_source(&source).unwrap();
    let (from_headers, kind) = headers.expect("a GGUF has a tensor directory");
    assert_eq!(kind, ParamSource::GgufTensorDirectory);
    assert_eq!(from_headers, count_params(&s).total, "GGUF tensors vs its metadata shapes");
    let reference = refs()["configs"]["smollm2_135m_instruct"]["parameters"].as_u64().unwrap();
    assert_eq!(from_headers, reference, "SmolLM2 GGUF vs transformers");
    assert_eq!(kv_bytes_per_token(&s, 1), kv_bytes_per_token(&shape("smollm2_135m_instruct"), 1));
}
