//! The same model from the GGUF file and from a Hugging Face folder written by `rserve convert` gives identical
//! greedy tokens; bf16 compute runs the same model and agrees on the first greedy token.

use candle_core::DType;
use rserve_engine::backend::cpu::CpuBackend;
use rserve_engine::model::{BlockId, ScheduledSeq, TokenId};
use rserve_engine::runner::{ModelRunner, StepRunner};
use rserve_engine::source::{resolve_model, ResolveOptions};
use serde_json::Value;

const BS: usize = 16;

fn runner(spec: &str, dtype: DType) -> ModelRunner<CpuBackend> {
    let resolved = resolve_model(spec, &ResolveOptions::with_cache_dir(std::env::temp_dir())).unwrap();
    let params = resolved.load_params().unwrap();
    let weights = rserve_engine::weights::load(&resolved, &params, dtype).unwrap();
    ModelRunner::new(CpuBackend::new(), &params, &weights, 16, BS).unwrap()
}

fn argmax(l: &[f32]) -> u32 {
    (0..l.len()).fold(0, |b, i| if l[i] > l[b] { i } else { b }) as u32
}

fn greedy(r: &mut ModelRunner<CpuBackend>, prompt: &[u32], n: usize) -> Vec<u32> {
    let table = BlockId::run(0, 16);
    let mut toks = prompt.to_vec();
    let mut start = 0;
    let mut out = Vec::new();
    while out.len() < n {
        let seq = ScheduledSeq::new(toks[start..].iter().copied().map(TokenId).collect(), start, table.clone(), BS);
        let logits = r.execute(&[seq]).unwrap();
        start = toks.len();
        let t = argmax(&logits);
        out.push(t);
        toks.push(t);
    }
    out
}

fn golden_prompts() -> Vec<Vec<u32>> {
    let g: Value =
        serde_json::from_str(&std::fs::read_to_string(rserve_tests::fixture("golden/smollm2_greedy.json")).unwrap())
            .unwrap();
    g["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .take(4)
        .map(|p| p["prompt_token_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect())
        .collect()
}

#[test]
fn gguf_and_converted_hf_folder_give_identical_greedy_tokens() {
    let gguf = rserve_tests::smollm2_gguf();
    let dir = tempfile::tempdir().unwrap();
    rserve_engine::convert::gguf_to_hf_dir(&gguf, dir.path(), DType::F32).unwrap();
    assert!(dir.path().join("model.safetensors").exists() && dir.path().join("tokenizer.json").exists());
    let mut a = runner(gguf.to_str().unwrap(), DType::F32);
    let mut b = runner(dir.path().to_str().unwrap(), DType::F32);
    for p in golden_prompts() {
        assert_eq!(greedy(&mut a, &p, 32), greedy(&mut b, &p, 32));
    }
}

#[test]
fn bf16_compute_agrees_on_the_first_token() {
    let gguf = rserve_tests::smollm2_gguf();
    let mut f32r = runner(gguf.to_str().unwrap(), DType::F32);
    let mut bf16r = runner(gguf.to_str().unwrap(), DType::BF16);
    for p in golden_prompts() {
        assert_eq!(greedy(&mut f32r, &p, 1), greedy(&mut bf16r, &p, 1));
    }
}
