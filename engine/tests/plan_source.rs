//! Where `rserve plan` finds a model without its weights: a Hugging Face cache snapshot that holds only
//! config.json, a folder whose safetensors headers give the parameter count, and the errors for what is missing.

use std::collections::HashMap;
use std::path::Path;

use rserve_engine::error::ModelError;
use rserve_engine::plan::source::{locate, ConfigSource};
use rserve_engine::plan::{self, ParamSource, PlanOptions};
use rserve_engine::source::ResolveOptions;
use rserve_engine::EngineError;

fn offline(cache: &Path) -> ResolveOptions {
    let mut o = ResolveOptions::with_cache_dir(cache);
    o.offline = true;
    o
}

#[test]
fn a_cache_snapshot_with_only_config_json_is_enough() {
    let cache = tempfile::tempdir().unwrap();
    let repo = cache.path().join("models--meta-llama--Llama-3.1-405B");
    let commit = "0123456789abcdef0123456789abcdef01234567";
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::create_dir_all(repo.join("snapshots").join(commit)).unwrap();
    std::fs::write(repo.join("refs/main"), commit).unwrap();
    std::fs::copy(
        rserve_tests::fixture("configs/llama31_405b.json"),
        repo.join("snapshots").join(commit).join("config.json"),
    )
    .unwrap();

    let src = locate("meta-llama/Llama-3.1-405B", &offline(cache.path())).unwrap();
    assert!(matches!(&src, ConfigSource::Json { safetensors, .. } if safetensors.is_empty()), "{src:?}");
    let p = plan::plan_model("meta-llama/Llama-3.1-405B", &PlanOptions::default(), &offline(cache.path())).unwrap();
    assert_eq!(p.parameters_source, ParamSource::ConfigShapes);
    assert_eq!(p.layout.map(|l| (l.tp, l.pp)), Some((8, 2)));

    match locate("meta-llama/Llama-3.1-70B", &offline(cache.path())) {
        Err(EngineError::Model(ModelError::ModelNotFound { model, .. })) => {
            assert!(model.contains("offline"), "{model}")
        }
        other => panic!("expected ModelNotFound, got {other:?}"),
    }
}

#[test]
fn safetensors_headers_give_the_parameter_count_when_present() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(rserve_tests::fixture("configs/smollm2_135m_instruct.json"), dir.path().join("config.json")).unwrap();
    // Two tensors of 6 and 4 values stand in for the weights: only their headers are read.
    let a: Vec<u8> = vec![0; 6 * 2];
    let b: Vec<u8> = vec![0; 4 * 2];
    let tensors: HashMap<String, safetensors::tensor::TensorView<'_>> = HashMap::from([
        ("a".to_string(), safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, vec![2, 3], &a).unwrap()),
        ("b".to_string(), safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, vec![4], &b).unwrap()),
    ]);
    safetensors::serialize_to_file(&tensors, None, &dir.path().join("model.safetensors")).unwrap();

    let spec = dir.path().to_str().unwrap();
    let p = plan::plan_model(spec, &PlanOptions::default(), &offline(dir.path())).unwrap();
    assert_eq!((p.parameters, p.parameters_source), (10, ParamSource::SafetensorsHeaders));
    assert_eq!(p.parameters_from_config, 134_515_008);
    assert_eq!(p.weights_bytes, 20);

    // A sharded index whose shards are not all on disk: the headers are not used (no partial counts).
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        r#"{"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}"#,
    )
    .unwrap();
    let p = plan::plan_model(spec, &PlanOptions::default(), &offline(dir.path())).unwrap();
    assert_eq!(p.parameters_source, ParamSource::ConfigShapes);
}

#[test]
fn bad_configs_are_errors_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.json");
    std::fs::write(&cfg, r#"{"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 10}"#)
        .unwrap();
    let e = plan::plan_model(cfg.to_str().unwrap(), &PlanOptions::default(), &offline(dir.path())).unwrap_err();
    assert!(e.to_string().contains("num_hidden_layers"), "{e}");
    std::fs::write(&cfg, "not json").unwrap();
    let e = plan::plan_model(cfg.to_str().unwrap(), &PlanOptions::default(), &offline(dir.path())).unwrap_err();
    assert!(e.to_string().contains("not valid JSON"), "{e}");
    std::fs::write(&cfg, r#"{"hidden_size": -3}"#).unwrap();
    let e = plan::plan_model(cfg.to_str().unwrap(), &PlanOptions::default(), &offline(dir.path())).unwrap_err();
    assert!(e.to_string().contains("hidden_size"), "{e}");
    // Without max_position_embeddings the length must be given.
    std::fs::write(
        &cfg,
        r#"{"model_type": "x", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 10}"#,
    )
    .unwrap();
    let e = plan::plan_model(cfg.to_str().unwrap(), &PlanOptions::default(), &offline(dir.path())).unwrap_err();
    assert!(e.to_string().contains("--max-model-len"), "{e}");
    let opts = PlanOptions { max_model_len: Some(1024), ..PlanOptions::default() };
    assert!(
        plan::plan_model(cfg.to_str().unwrap(), &opts, &offline(dir.path())).is_ok(),
        "an unknown architecture still plans"
    );
}
