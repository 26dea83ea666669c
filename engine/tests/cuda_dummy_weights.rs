//! `--load-format dummy` (used to measure the CUDA backend at 8B scale): random weights have exactly the shapes the
//! config implies, are deterministic in the seed, and the Llama-3.1-8B fixture config describes the real model.

use candle_core::DType;
use rserve_engine::config::hf::parse_config_json;
use rserve_engine::weights::{dummy, expected_tensors};

const TINY: &str = r#"{"architectures":["LlamaForCausalLM"],"model_type":"llama","hidden_size":64,"intermediate_size":160,
"num_attention_heads":4,"num_key_value_heads":2,"num_hidden_layers":2,"vocab_size":300,"rms_norm_eps":1e-5,
"rope_theta":10000.0,"max_position_embeddings":256,"tie_word_embeddings":false,"torch_dtype":"bfloat16"}"#;

#[test]
fn dummy_weights_have_every_expected_shape_in_the_dtype() {
    let p = parse_config_json(TINY).unwrap();
    let w = dummy::dummy(&p, DType::BF16, 1).unwrap();
    let specs = expected_tensors(&p);
    assert_eq!(w.len(), specs.len());
    for s in &specs {
        let t = w.get(&s.name).unwrap();
        assert_eq!(t.dims(), s.shape.as_slice(), "{}", s.name);
        assert_eq!(t.dtype(), DType::BF16);
    }
}

#[test]
fn dummy_weights_are_deterministic_in_the_seed() {
    let p = parse_config_json(TINY).unwrap();
    let name = "model.layers.1.mlp.down_proj.weight";
    let a =
        dummy::dummy(&p, DType::F32, 7).unwrap().get(name).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let b =
        dummy::dummy(&p, DType::F32, 7).unwrap().get(name).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let c =
        dummy::dummy(&p, DType::F32, 8).unwrap().get(name).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert!(a.iter().all(|v| v.abs() <= dummy::DUMMY_RANGE));
    let mean = a.iter().sum::<f32>() / a.len() as f32;
    assert!(mean.abs() < 0.1 * dummy::DUMMY_RANGE, "uniform around 0, mean {mean}");
    // Different tensors get different values; norms are ones (a model of random norms would not be llama-like).
    let q = dummy::dummy_values("model.layers.0.self_attn.q_proj.weight", a.len(), 7);
    assert_ne!(q, a);
    assert!(dummy::dummy_values("model.norm.weight", 64, 7).iter().all(|&v| v == 1.0));
    // Chunked generation does not depend on the thread count: the same length gives the same prefix values.
    let long = dummy::dummy_values(name, 200_000, 7);
    let longer = dummy::dummy_values(name, 300_000, 7);
    assert_eq!(long[..], longer[..200_000]);
}

#[test]
fn llama_3_1_8b_fixture_has_the_published_parameter_count() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/configs/llama-3.1-8b-instruct/config.json");
    let p = parse_config_json(&std::fs::read_to_string(path).unwrap()).unwrap();
    let n: usize = expected_tensors(&p).iter().map(|s| s.shape.iter().product::<usize>()).sum();
    // Hugging Face lists meta-llama/Llama-3.1-8B-Instruct at 8,030,261,248 parameters (bf16: 16.06 GB).
    assert_eq!(n, 8_030_261_248);
}

#[test]
fn dummy_resolve_needs_a_config() {
    let dir = tempfile::tempdir().unwrap();
    assert!(dummy::resolve(dir.path().to_str().unwrap()).is_err());
    std::fs::write(dir.path().join("config.json"), TINY).unwrap();
    let r = dummy::resolve(dir.path().to_str().unwrap()).unwrap();
    assert_eq!(r.load_params().unwrap().hidden_size, 64);
}
