//! `config.json` parsing checked against transformers: every sample config under tests/fixtures/config/inputs/ must
//! resolve to the values transformers 5 resolves (refs.json, made by scripts/reference/config_refs.py), and bad
//! configs must fail with the error that names the problem.

use std::path::PathBuf;

use rserve_engine::config::hf::parse_config_json;
use rserve_engine::config::{Architecture, ModelParams, RopeScaling};
use rserve_model_io::ModelError;
use serde_json::Value;

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/config")
}

/// `ModelParams` in the shape of the reference JSON.
fn as_json(p: &ModelParams) -> Value {
    let arch = match p.architecture {
        Architecture::Llama => "Llama",
        Architecture::Mistral => "Mistral",
        Architecture::Qwen2 => "Qwen2",
        other => other.hf_name(),
    };
    serde_json::json!({
        "architecture": arch,
        "vocab_size": p.vocab_size,
        "hidden_size": p.hidden_size,
        "intermediate_size": p.intermediate_size,
        "num_layers": p.num_layers,
        "num_heads": p.num_heads,
        "num_kv_heads": p.num_kv_heads,
        "head_dim": p.head_dim,
        "rms_norm_eps": p.rms_norm_eps,
        "rope_theta": p.rope_theta,
        "rope_scaling": p.rope_scaling.as_ref().map(|s| match s {
            RopeScaling::Llama3(s) => serde_json::json!({
            "factor": s.factor,
            "low_freq_factor": s.low_freq_factor,
            "high_freq_factor": s.high_freq_factor,
            "original_max_position_embeddings": s.original_max_position_embeddings,
            }),
            other => serde_json::json!(format!("{other:?}")),
        }),
        "max_position_embeddings": p.max_position_embeddings,
        "tie_word_embeddings": p.tie_word_embeddings,
        "attention_bias": p.attention_bias,
        "bos_token_id": p.bos_token_id,
        "eos_token_ids": p.eos_token_ids,
        "torch_dtype": p.torch_dtype,
        "sliding_window": p.sliding_window,
    })
}

#[test]
fn every_sample_config_matches_transformers() {
    let refs: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture_dir().join("refs.json")).expect("refs.json")).unwrap();
    let configs = refs["configs"].as_object().expect("configs");
    assert!(configs.len() >= 10, "expected the full set of reference configs");
    for (name, expected) in configs {
        let text = std::fs::read_to_string(fixture_dir().join("inputs").join(name)).expect(name);
        let params = parse_config_json(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        let got = as_json(&params);
        for (key, want) in expected.as_object().unwrap() {
            let have = &got[key.as_str()];
            let same = match (have.as_f64(), want.as_f64()) {
                (Some(a), Some(b)) => (a - b).abs() <= 1e-12 * b.abs().max(1.0),
                _ => have == want,
            };
            assert!(same, "{name}: `{key}` is {have}, transformers says {want}");
        }
    }
}

#[test]
fn unsupported_architecture_is_named() {
    let err = parse_config_json(r#"{"architectures":["GPT2LMHeadModel"],"vocab_size":10}"#).unwrap_err();
    match err {
        ModelError::UnsupportedArchitecture(name) => assert_eq!(name, "GPT2LMHeadModel"),
        other => panic!("unexpected error {other}"),
    }
    let err = parse_config_json(r#"{"model_type":"gemma","vocab_size":10}"#).unwrap_err();
    assert!(matches!(err, ModelError::UnsupportedArchitecture(ref n) if n == "gemma"), "{err}");
}

fn base() -> Value {
    serde_json::json!({"architectures":["LlamaForCausalLM"],"hidden_size":64,"intermediate_size":128,
        "num_attention_heads":4,"num_key_value_heads":2,"num_hidden_layers":2,"vocab_size":100})
}

fn config_error(v: Value) -> String {
    match parse_config_json(&v.to_string()) {
        Err(ModelError::Config(msg)) => msg,
        other => panic!("expected a config error, got {other:?}"),
    }
}

#[test]
fn bad_configs_name_the_field() {
    let mut v = base();
    v.as_object_mut().unwrap().remove("hidden_size");
    assert!(config_error(v).contains("hidden_size"));

    let mut v = base();
    v["num_key_value_heads"] = 3.into();
    let msg = config_error(v);
    assert!(msg.contains("num_attention_heads") && msg.contains("num_key_value_heads"), "{msg}");

    let mut v = base();
    v["hidden_size"] = 66.into();
    assert!(config_error(v).contains("head_dim"));

    let mut v = base();
    v["rope_scaling"] = serde_json::json!({"rope_type":"mrope","factor":4.0});
    assert!(config_error(v).contains("mrope"));

    let mut v = base();
    v["rope_scaling"] =
        serde_json::json!({"rope_type":"longrope","short_factor":[1.0, 1.0, 1.0],"long_factor":[1.0, 1.0, 1.0]});
    assert!(config_error(v).contains("longrope factors have 3 and 3 entries, the head needs 8"));

    let mut v = base();
    v["rope_scaling"] = serde_json::json!({"rope_type":"llama3","factor":8.0});
    assert!(config_error(v).contains("low_freq_factor"));

    let mut v = base();
    v["num_hidden_layers"] = 0.into();
    assert!(config_error(v).contains("num_hidden_layers"));

    assert!(matches!(parse_config_json("{not json"), Err(ModelError::Config(_))));
}

#[test]
fn explicit_head_dim_wins_over_hidden_over_heads() {
    let mut v = base();
    v["head_dim"] = 32.into();
    let p = parse_config_json(&v.to_string()).unwrap();
    assert_eq!((p.head_dim, p.hidden_size / p.num_heads), (32, 16));
}

/// Mixtures of experts from published configs (Mixtral-8x7B, Qwen3-30B-A3B, Qwen3-235B-A22B): experts, top-k,
/// expert width, renormalising (Mixtral always; Qwen3-MoE by `norm_topk_prob`) and which layers route; and the
/// Qwen3-MoE defaults (no renormalising) with `mlp_only_layers` and `decoder_sparse_step`.
#[test]
fn mixture_of_experts_configs_resolve() {
    let read = |name: &str| {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/configs").join(name);
        parse_config_json(&std::fs::read_to_string(path).expect(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
    };
    for (name, arch, experts, top_k, width, layers) in [
        ("mixtral_8x7b_instruct.json", Architecture::Mixtral, 8, 2, 14336, 32),
        ("qwen3_30b_a3b.json", Architecture::Qwen3Moe, 128, 8, 768, 48),
        ("qwen3_235b_a22b.json", Architecture::Qwen3Moe, 128, 8, 1536, 94),
    ] {
        let p = read(name);
        assert_eq!(p.architecture, arch, "{name}");
        let m = p.moe.as_ref().expect(name);
        assert_eq!((m.num_experts, m.top_k, m.expert_intermediate, m.renormalize), (experts, top_k, width, true));
        assert_eq!(m.layers, vec![true; layers], "{name}: every layer routes");
        assert_eq!(p.qk_norm, arch == Architecture::Qwen3Moe, "{name}");
        assert_eq!(p.sliding_window, None, "{name}");
    }
    let mut v: Value =
        serde_json::from_str(include_str!("../../tests/fixtures/configs/qwen3_30b_a3b.json")).expect("fixture");
    let o = v.as_object_mut().unwrap();
    o.remove("norm_topk_prob");
    o.insert("num_hidden_layers".into(), 6.into());
    o.insert("decoder_sparse_step".into(), 2.into());
    o.insert("mlp_only_layers".into(), serde_json::json!([3]));
    let m = parse_config_json(&v.to_string()).unwrap().moe.unwrap();
    assert!(!m.renormalize, "Qwen3-MoE's default: norm_topk_prob false");
    assert_eq!(m.layers, vec![false, true, false, false, false, true]);
    assert!(parse_config_json(&base_moe(9)).unwrap_err().to_string().contains("`num_experts_per_tok` (9)"));
    assert!(parse_config_json(&base_moe(0)).unwrap_err().to_string().contains("num_experts_per_tok"));
    // More experts a token than the routing kernel places (its picks live in local memory).
    let mut many: Value = serde_json::from_str(&base_moe(33)).unwrap();
    many["num_local_experts"] = 64.into();
    let err = parse_config_json(&many.to_string()).unwrap_err().to_string();
    assert!(err.contains("`num_experts_per_tok` (33): at most 32"), "{err}");
}

fn base_moe(top_k: usize) -> String {
    let mut v: Value =
        serde_json::from_str(include_str!("../../tests/fixtures/configs/mixtral_8x7b_instruct.json")).expect("fixture");
    v["num_experts_per_tok"] = top_k.into();
    v.to_string()
}
