//! The planner's model-wide numbers checked against transformers on every config under tests/fixtures/configs/
//! (refs.json, made by scripts/reference/plan_refs.py): the parameter count of the model transformers builds from the
//! config, the K/V values its cache holds per token, and, for sliding-window configs, the values it holds after
//! 2 x window tokens. Also the GGUF path: SmolLM2's tensor directory against its config shapes.
//!
//! The published configs of Qwen3-8B, Qwen3-32B, Gemma-3-27B-it (a multimodal `Gemma3ForConditionalGeneration`: the
//! decoder from `text_config`, plus the SigLIP vision tower and projector transformers builds), Phi-4 and
//! Mistral-7B-v0.3 are among the fixtures; for every config the plan's per-sequence KV at a context longer than the
//! window is checked against the reference built from refs.json (K/V values per token per layer x tokens, each
//! sliding layer at its window), and Gemma-3-27B's KV cache groups against the dense formula on a PVC tile.

use rserve_engine::plan::memory::{kv_bytes_per_token, kv_bytes_per_token_on, KvGroups};
use rserve_engine::plan::params::count_params;
use rserve_engine::plan::source::{locate, ConfigSource};
use rserve_engine::plan::{self, DeviceChoice, ModelShape, ParamSource, PlanOptions};
use rserve_engine::source::ResolveOptions;
use serde_json::Value;

fn refs() -> Value {
    let text = std::fs::read_to_string(rserve_tests::fixture("configs/refs.json")).expect("refs.json");
    serde_json::from_str(&text).expect("refs.json parses")
}

fn shape(name: &str) -> ModelShape {
    let text = std::fs::read_to_string(rserve_tests::fixture(&format!("configs/{name}.json"))).expect("fixture");
    ModelShape::from_config_json(&text).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The published configs this file was extended with (issue: real configs of current models).
const NEW_CONFIGS: &[&str] = &[
    "qwen3_8b",
    "qwen3_32b",
    "gemma3_27b_it",
    "phi4",
    "mistral_7b_v03",
    "mixtral_8x7b_instruct",
    "qwen3_30b_a3b",
    "qwen3_235b_a22b",
    "gpt_oss_120b",
];

/// A fixture's raw JSON (its decoder's keys: `text_config` for a multimodal wrapper).
fn raw_decoder(name: &str) -> Value {
    let text = std::fs::read_to_string(rserve_tests::fixture(&format!("configs/{name}.json"))).expect("fixture");
    let root: Value = serde_json::from_str(&text).expect("fixture parses");
    match root.get("text_config") {
        Some(t) if root.get("hidden_size").is_none() => t.clone(),
        _ => root,
    }
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

/// Mixtures of experts: the parameters one token uses (total less the experts it is not routed to), against
/// transformers' `experts` modules; a dense model has none.
#[test]
fn active_parameters_match_transformers_experts() {
    let mut checked = 0;
    for (name, r) in configs() {
        let counts = count_params(&shape(&name));
        match r["active_parameters"].as_u64() {
            Some(want) => {
                assert_eq!(counts.active, want, "{name}: active parameters");
                checked += 1;
            }
            None => assert_eq!(counts.active, counts.total, "{name}: a dense model uses every parameter"),
        }
    }
    assert!(checked >= 4, "Mixtral, Qwen3-MoE (two) and DeepSeek-V2-Lite carry a reference");
}

#[test]
fn new_configs_are_in_the_reference() {
    let r = refs();
    for name in NEW_CONFIGS {
        assert!(r["configs"][name].is_object(), "{name} missing from refs.json (rerun scripts/reference/plan_refs.py)");
    }
}

#[test]
fn gemma3_counts_the_vision_tower_as_transformers_does() {
    let r = refs();
    let parts = &r["configs"]["gemma3_27b_it"]["parameters_by_module"];
    let s = shape("gemma3_27b_it");
    let counts = count_params(&s);
    assert!(s.vision.is_some(), "the SigLIP vision_config is read");
    let vision = parts["vision_tower"].as_u64().unwrap() + parts["multi_modal_projector"].as_u64().unwrap();
    assert_eq!(counts.vision, vision, "vision tower + projector");
    assert_eq!(counts.total - counts.vision, parts["language_model"].as_u64().unwrap(), "language model (tied head)");
    assert_eq!(counts.lm_head, 0, "Gemma 3 ties the output head to the embeddings");
    assert_eq!(s.vocab_size, 262_208, "Gemma3TextConfig's default vocabulary");
    assert_eq!(s.max_position_embeddings, Some(131_072), "Gemma3TextConfig's default context");
    // The first pipeline stage holds the tower with the embeddings (the last its own copy of the tied head).
    let stages = counts.stages(2);
    assert_eq!(stages.iter().sum::<u64>(), counts.total + counts.embedding);
    let layers = |r: std::ops::Range<usize>| counts.per_layer[r].iter().sum::<u64>();
    assert_eq!(stages[0], counts.embedding + counts.vision + layers(0..31));
    assert_eq!(stages[1], layers(31..62) + counts.final_norm + counts.embedding);
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
    let gguf = rserve_tests::smollm2_gguf();
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

/// The reference KV bytes of one sequence of `tokens` tokens, from refs.json: K/V values per token per layer (the
/// model's values per token over its layers) x `tokens` for every full-attention layer, x `min(tokens, window)` for
/// every sliding layer (transformers' `layer_types`; a config with a window and no `layer_types` slides in every
/// layer, as Mistral's), times the element bytes.
fn reference_kv_per_sequence(name: &str, r: &Value, tokens: u64, elem: u64) -> u64 {
    let layers = match r["layer_types"].as_array() {
        Some(t) => t.len() as u64,
        None => raw_decoder(name)["num_hidden_layers"].as_u64().expect("num_hidden_layers"),
    };
    let per_layer = r["kv_values_per_token"].as_u64().unwrap();
    assert_eq!(per_layer % layers, 0, "{name}: equal K/V per layer");
    let per_layer = per_layer / layers;
    let (sliding, window) = match r["sliding_window"].as_u64() {
        None => (0, 0),
        Some(w) => match r["layer_types"].as_array() {
            Some(t) => (t.iter().filter(|k| k.as_str() == Some("sliding_attention")).count() as u64, w),
            None => (layers, w),
        },
    };
    per_layer * ((layers - sliding) * tokens + sliding * tokens.min(window)) * elem
}

#[test]
fn kv_per_sequence_beyond_the_window_matches_the_reference() {
    let mut seen = Vec::new();
    for (name, r) in configs() {
        let s = shape(&name);
        let max = s.max_position_embeddings.expect("max_position_embeddings") as u64;
        // Past the window where there is one (4 windows, within the model's context), else a long context.
        let tokens = match r["sliding_window"].as_u64() {
            Some(w) => (4 * w).min(max),
            None => max.min(32_768),
        };
        let opts = PlanOptions { max_model_len: Some(tokens as usize), ..PlanOptions::default() };
        let p = plan::plan_shape(&name, "fixture", s.clone(), None, &opts).unwrap();
        let elem = p.kv_cache_dtype.bytes() as u64;
        let expected = reference_kv_per_sequence(&name, &r, tokens, elem);
        assert_eq!(p.kv_bytes_per_sequence, expected, "{name}: KV of one {tokens}-token sequence");
        match r["sliding_window"].as_u64() {
            Some(w) => {
                assert!(tokens > w, "{name}: {tokens} tokens must pass the {w}-token window");
                assert_eq!(p.kv_bytes_per_sequence_windowed, Some(expected), "{name}: window-aware KV");
                assert!(expected < p.kv_bytes_per_token * tokens, "{name}: the window saves KV");
            }
            None => {
                assert_eq!(p.kv_bytes_per_sequence_windowed, None, "{name}: no window");
                assert_eq!(expected, p.kv_bytes_per_token * tokens, "{name}: dense KV");
            }
        }
        // Weights: the parameters transformers builds, at the plan's dtype.
        assert_eq!(p.parameters, r["parameters"].as_u64().unwrap(), "{name}: parameters");
        assert_eq!(p.weights_bytes, p.parameters * p.dtype.bytes() as u64, "{name}: weights bytes");
        seen.push(name);
    }
    for name in NEW_CONFIGS {
        assert!(seen.iter().any(|n| n == name), "{name} checked");
    }
}

#[test]
fn gemma3_kv_groups_beat_the_dense_formula_on_a_pvc_tile() {
    let s = shape("gemma3_27b_it");
    let groups = KvGroups::of(&s);
    assert_eq!(s.sliding.map(|w| (w.window, w.sliding_layers)), Some((1024, 52)), "52 local layers of 1024 tokens");
    assert_eq!((groups.group_size, groups.full_groups, groups.sliding_groups), (10, 1, 6));
    for len in [32_768usize, 131_072] {
        let opts = PlanOptions {
            max_model_len: Some(len),
            device: DeviceChoice::Profile("pvc-tile".into()),
            ..PlanOptions::default()
        };
        let p = plan::plan_shape("gemma3_27b_it", "fixture", s.clone(), None, &opts).unwrap();
        let l = p.layout.as_ref().unwrap_or_else(|| panic!("a layout at {len} tokens: {:?}", p.warnings));
        assert!(l.fits(), "{len}: {l:?}");
        assert_eq!(
            l.max_concurrency,
            groups.max_concurrency(l.num_blocks_per_device, len, p.block_size, p.step.max_num_batched_tokens)
        );
        // The dense formula: every layer of the stage holds every token, so the device's KV bytes buy
        // `kv / (per-token bytes of all the stage's layers x block)` blocks of `block_size` tokens.
        let elem = p.kv_cache_dtype.bytes();
        let dense_per_token = kv_bytes_per_token_on(&s, s.kv_layers().div_ceil(l.pp), l.tp, elem);
        let dense_blocks = l.kv_bytes_per_device / (dense_per_token * p.block_size as u64);
        let dense = (dense_blocks * p.block_size as u64) as f64 / len as f64;
        assert!(
            l.max_concurrency > dense,
            "{len} tokens on TP={} x PP={}: groups {:.2} vs dense {dense:.2}",
            l.tp,
            l.pp,
            l.max_concurrency
        );
        eprintln!(
            "gemma3_27b_it @ {len} tokens, TP={} x PP={} on {}: max concurrency {:.2} (KV groups) vs {dense:.2} (dense)",
            l.tp, l.pp, p.device.name, l.max_concurrency
        );
    }
}
