//! GGUF -> Hugging Face folder conversion: the converted SmolLM2 folder must resolve, parse and load to the same
//! `ModelParams` (but for `torch_dtype`) and bit-identical tensors as loading the GGUF directly, in f32 and bf16, and
//! carry the GGUF's tokenizer, special tokens and chat template.

#[path = "weights_support/mod.rs"]
mod support;

use candle_core::quantized::gguf_file::Value;
use candle_core::DType;
use rserve_engine::config::gguf_meta::read_gguf_header;
use rserve_engine::convert::gguf_to_hf_dir;
use rserve_engine::source::{resolve_model, ResolveOptions, ResolvedModel};
use rserve_engine::tokenizer::Tokenizer;
use rserve_engine::weights;
use rserve_engine::TokenId;
use rserve_tests::smollm2_gguf;
use support::*;

fn gguf_string(content: &candle_core::quantized::gguf_file::Content, key: &str) -> String {
    match content.metadata.get(key) {
        Some(Value::String(s)) => s.clone(),
        other => panic!("{key}: {other:?}"),
    }
}

fn gguf_token(content: &candle_core::quantized::gguf_file::Content, id_key: &str) -> String {
    let id = content.metadata[id_key].to_u32().unwrap() as usize;
    match &content.metadata["tokenizer.ggml.tokens"] {
        Value::Array(tokens) => tokens[id].to_string().unwrap().clone(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn smollm2_converts_to_an_identical_hf_folder() {
    let gguf = smollm2_gguf();
    let opts =
        ResolveOptions { offline: true, ..ResolveOptions::with_cache_dir(std::env::temp_dir().join("rserve-none")) };
    let direct = resolve_model(gguf.to_str().unwrap(), &opts).unwrap();
    let direct_params = direct.load_params().unwrap();
    let content = read_gguf_header(&gguf).unwrap();

    for (dtype, torch_dtype) in [(DType::F32, "float32"), (DType::BF16, "bfloat16")] {
        let out = tempfile::tempdir().unwrap();
        gguf_to_hf_dir(&gguf, out.path(), dtype).unwrap();

        let converted = resolve_model(out.path().to_str().unwrap(), &opts).unwrap();
        let ResolvedModel::Safetensors(m) = &converted else { panic!("{converted:?}") };
        assert!(
            m.files.tokenizer.is_some() && m.files.tokenizer_config.is_some() && m.files.generation_config.is_some()
        );
        let params = converted.load_params().unwrap();
        assert_eq!(params.torch_dtype.as_deref(), Some(torch_dtype));
        let mut same = params.clone();
        same.torch_dtype = None;
        assert_eq!(same, direct_params);

        let from_gguf = weights::load(&direct, &direct_params, dtype).unwrap();
        let from_dir = weights::load(&converted, &params, dtype).unwrap();
        assert_eq!(from_dir.names(), from_gguf.names());
        assert_eq!(from_dir.total_bytes(), from_gguf.total_bytes());
        for name in from_gguf.names() {
            let d = max_abs_diff(from_dir.get(name).unwrap(), from_gguf.get(name).unwrap());
            assert_eq!(d, 0.0, "{name} differs by {d} ({dtype:?})");
        }
        assert_eq!(weights::safetensors_param_count(&m.safetensors).unwrap(), from_gguf.param_count() as u64);

        // Tokenizer files: the GGUF's special tokens and chat template, and the same token ids.
        let tc: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(m.files.tokenizer_config.as_ref().unwrap()).unwrap())
                .unwrap();
        assert_eq!(tc["bos_token"], gguf_token(&content, "tokenizer.ggml.bos_token_id"));
        assert_eq!(tc["eos_token"], gguf_token(&content, "tokenizer.ggml.eos_token_id"));
        assert_eq!(tc["chat_template"], gguf_string(&content, "tokenizer.chat_template"));
        assert_eq!(
            tc["add_bos_token"],
            serde_json::json!(content.metadata["tokenizer.ggml.add_bos_token"].to_bool().unwrap())
        );
        let from_file =
            Tokenizer::from_file(m.files.tokenizer.as_ref().unwrap(), m.files.tokenizer_config.as_deref()).unwrap();
        let from_meta = Tokenizer::from_gguf(&content).unwrap();
        for text in
            ["Hello world", "<|im_start|>user\nWhat is 2+2?<|im_end|>\n", "  spaces\tand\nnewlines ünïcödé 12345"]
        {
            assert_eq!(from_file.encode(text, true).unwrap(), from_meta.encode(text, true).unwrap(), "{text:?}");
        }
        assert_eq!(from_file.bos_token_id(), direct_params.bos_token_id.map(TokenId));
        assert_eq!(
            from_file.eos_token_ids(),
            direct_params.eos_token_ids.iter().copied().map(TokenId).collect::<Vec<_>>()
        );
    }
}

#[test]
fn conversion_refuses_integer_dtypes_and_bad_input() {
    let out = tempfile::tempdir().unwrap();
    let gguf = smollm2_gguf();
    assert!(gguf_to_hf_dir(&gguf, out.path(), DType::U32).is_err());
    let garbage = out.path().join("bad.gguf");
    std::fs::write(&garbage, b"not a gguf").unwrap();
    assert!(gguf_to_hf_dir(&garbage, &out.path().join("x"), DType::F32).is_err());
    assert!(!out.path().join("x").exists(), "nothing is written for a bad input");
}
