//! Packed GGUF weights on the CPU backend (`backend::cpu::quant`) with the real SmolLM2-135M-Instruct file: the
//! loader's block twins decode to exactly the tensors it dequantized (q/k rows permuted back included), the packed
//! matmul stays within the activation-quantization bound of the f32 matmul on real weights, and a Q8_0 copy of the
//! model stays close to the dequantized path on the golden prompts.
//!
//! Not equal: prompts of more than `quant::INTEGER_ROWS` tokens prefill through dequantized tiles (exact up to f32
//! rounding), but the LM head (one row per sequence) and every decode step quantize activations per 32-value block
//! (llama.cpp's scheme). On SmolLM2-135M that moves the first-token log-probs of the reference's top-20 tokens by
//! 0.07-0.15 (the head alone; measured 2026-12-05), and greedy runs part ways after 6-19 tokens on 6 of the 10
//! golden prompts (all 10 run once). The test runs the first `PROMPTS`, bounds the log-prob move at 0.3 to catch a
//! kernel regression (a wrong block or scale moves them by whole units) and prints both numbers.

mod common;

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{DType, Device};
use rserve_engine::backend::cpu::quant::{self, QuantActs, BLOCK};
use rserve_engine::backend::cpu::CpuBackend;
use rserve_engine::model::{BlockId, ScheduledSeq, TokenId};
use rserve_engine::runner::{ModelRunner, StepRunner};
use rserve_engine::sampling::argmax;
use rserve_engine::source::{resolve_model, ResolveOptions};
use serde_json::Value;

const BS: usize = 16;
/// Golden prompts the greedy comparison runs (all 10 for the numbers above; 4 keep the test near 10 s).
const PROMPTS: usize = 4;

fn load(path: &std::path::Path) -> (rserve_engine::config::ModelParams, rserve_engine::weights::Weights) {
    let resolved =
        resolve_model(path.to_str().unwrap(), &ResolveOptions::with_cache_dir(std::env::temp_dir())).unwrap();
    let params = resolved.load_params().unwrap();
    let weights = rserve_engine::weights::load(&resolved, &params, DType::F32).unwrap();
    (params, weights)
}

#[test]
fn smollm2_twins_decode_to_the_loaded_tensors_and_multiply_within_the_bound() {
    let (params, w) = load(&common::smollm2_gguf());
    // 30 layers of 7 Q4_1 projections, and the Q8_0 embedding table (tied to the head).
    assert_eq!(w.packed().len(), 30 * 7 + 1);
    let names = [
        ("model.layers.0.self_attn.q_proj.weight", quant::Format::Q4_1),
        ("model.layers.29.self_attn.k_proj.weight", quant::Format::Q4_1),
        ("model.layers.3.mlp.down_proj.weight", quant::Format::Q4_1),
        ("model.embed_tokens.weight", quant::Format::Q8_0),
    ];
    for (name, format) in names {
        let t = w.get(name).unwrap();
        let p = quant::lookup(t).unwrap_or_else(|| panic!("{name} has no packed twin"));
        assert_eq!(p.format(), format, "{name}");
        let dense = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert!(p.dequantize() == dense, "{name}: the twin does not decode to the loaded tensor");
        let [n, k] = p.dims();
        let m = 3;
        // Activations shaped like a hidden state: mostly small, a few large channels.
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * if i % 97 == 0 { 20.0 } else { 1.0 })
            .collect();
        let mut out = vec![0f32; m * n];
        quant::matmul(&x, &p, None, &mut out, m, k, n).unwrap();
        let acts = QuantActs::new(&x, m, k);
        // |x - d q| <= d / 2 per value, so |y - y_f32| <= sum |w| d / 2 (+ f32 rounding of the block sums).
        for i in 0..m {
            for j in (0..n).step_by(97) {
                let wr = &dense[j * k..(j + 1) * k];
                let exact: f64 = wr.iter().zip(&x[i * k..]).map(|(&a, &b)| a as f64 * b as f64).sum();
                let mag: f64 = wr.iter().zip(&x[i * k..]).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
                let bound: f64 = wr
                    .iter()
                    .enumerate()
                    .map(|(t, &a)| a.abs() as f64 * acts.scale(i, t / BLOCK) as f64 / 2.0)
                    .sum::<f64>()
                    + (k / BLOCK + 4) as f64 * f32::EPSILON as f64 * 2.0 * mag;
                let got = out[i * n + j] as f64;
                assert!((got - exact).abs() <= bound, "{name} [{i},{j}]: {got} vs {exact}, bound {bound}");
            }
        }
    }
    drop(w);
    let (_, w2) = load(&common::smollm2_gguf());
    let _ = params;
    assert_eq!(w2.packed().len(), 211);
}

/// The SmolLM2 GGUF with every Q4_1 tensor requantized to Q8_0 (llama.cpp's quantizer, via candle).
fn write_q8_0_copy(dir: &std::path::Path) -> std::path::PathBuf {
    let src = common::smollm2_gguf();
    let mut f = std::fs::File::open(&src).unwrap();
    let content = gguf_file::Content::read(&mut f).unwrap();
    let mut tensors = Vec::new();
    for (name, info) in &content.tensor_infos {
        let q = info.read(&mut f, content.tensor_data_offset, &Device::Cpu).unwrap();
        let q = match info.ggml_dtype {
            GgmlDType::Q4_1 => QTensor::quantize(&q.dequantize(&Device::Cpu).unwrap(), GgmlDType::Q8_0).unwrap(),
            _ => q,
        };
        tensors.push((name.clone(), q));
    }
    let dst = dir.join("SmolLM2-135M-Instruct.Q8_0.gguf");
    let mut out = std::io::BufWriter::new(std::fs::File::create(&dst).unwrap());
    let meta: Vec<(&str, &gguf_file::Value)> = content.metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tens: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut out, &meta, &tens).unwrap();
    dst
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// Greedy tokens (as many as the golden has) and the first step's logits of every golden prompt.
fn greedy(backend: CpuBackend, path: &std::path::Path, golden: &Value) -> Vec<(Vec<u32>, Vec<f32>)> {
    let (params, weights) = load(path);
    let mut r = ModelRunner::new(backend, &params, &weights, 64, BS).unwrap();
    drop(weights);
    let mut all = Vec::new();
    for p in golden["prompts"].as_array().unwrap().iter().take(PROMPTS) {
        let prompt = ids(&p["prompt_token_ids"]);
        let steps = p["greedy_token_ids"].as_array().unwrap().len();
        let total = prompt.len() + steps;
        let seq = |tokens: &[u32], start: usize| {
            ScheduledSeq::new(
                tokens.iter().copied().map(TokenId).collect(),
                start,
                BlockId::run(0, total.div_ceil(BS)),
                BS,
            )
        };
        let first = r.execute(&[seq(&prompt, 0)]).unwrap();
        let mut logits = first.clone();
        let mut got = Vec::new();
        for step in 0..steps {
            let t = argmax(&logits);
            got.push(t);
            if step + 1 < steps {
                logits = r.execute(&[seq(&[t], prompt.len() + step)]).unwrap();
            }
        }
        all.push((got, first));
    }
    all
}

#[test]
fn smollm2_q8_0_packed_greedy_against_the_dequantized_path() {
    let golden: Value =
        serde_json::from_str(&std::fs::read_to_string(common::fixture("golden/smollm2_greedy.json")).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let q8 = write_q8_0_copy(dir.path());
    let want = greedy(CpuBackend::with_packed_weights(false), &q8, &golden);
    let got = greedy(CpuBackend::with_packed_weights(true), &q8, &golden);
    for (i, ((g, gl), (w, wl))) in got.iter().zip(&want).enumerate() {
        let lp = |l: &[f32]| rserve_engine::sampling::logprobs::log_softmax(l);
        let (a, b) = (lp(gl), lp(wl));
        let mut top: Vec<usize> = (0..b.len()).collect();
        top.sort_by(|&x, &y| b[y].total_cmp(&b[x]));
        let d = top[..20].iter().map(|&t| (a[t] - b[t]).abs()).fold(0f32, f32::max);
        let same = g.iter().zip(w).take_while(|(x, y)| x == y).count();
        eprintln!(
            "prompt {i}: top-20 first-token logprob difference {d:.4}, {same} of {} greedy tokens equal",
            w.len()
        );
        assert!(d < 0.3, "prompt {i}: packed Q8_0 moved a top-20 first-token logprob by {d}");
    }
}
