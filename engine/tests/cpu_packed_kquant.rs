//! Packed k-quant weights (`Q4_K`, `Q5_K`, `Q6_K`) on the CPU backend with the real SmolLM2-135M-Instruct: a
//! `Q4_K_M`-like copy of the GGUF (every matrix whose rows are whole 256-value super-blocks, i.e. each layer's
//! down_proj, requantized from its dequantized values by candle's llama.cpp quantizer into Q6_K / Q4_K / Q5_K by
//! layer; the 576-wide matrices cannot be k-quants and stay Q4_1, the embedding Q8_0, as llama.cpp itself falls
//! back for them) keeps every one of them packed, their twins decode to the loaded tensors, and the packed path stays
//! close to the dequantized f32 path on the golden prompts.
//!
//! The prompts are prefilled `quant::INTEGER_ROWS` tokens at a time, so every matmul of every step takes the integer
//! kernels on every CPU (a longer prefill would take dequantized tiles, exact up to f32 rounding, for the k-quants,
//! and for the other formats where the CPU lacks 512-bit VNNI). Measured (2026-12-05, all
//! 10 golden prompts once): the reference's top-20 first-token log-probs move by 0.16-0.52 (activations quantized
//! per 32 values for the Q4_1 / Q8_0 matrices, per 256 for the k-quants), against 0.17-0.48 for the original Q4_1
//! file run the same way, so the k-quants add no error of their own that shows; 15-16 of 16 teacher-forced greedy
//! tokens equal. The test runs the first `PROMPTS` and bounds the move at `LOGPROB_TOL` (a wrong block layout or
//! scale moves log-probs by whole units); wherever the reference's top-2 margin exceeds `MARGIN`, the packed path
//! must pick its token.

mod common;

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{DType, Device};
use rserve_engine::backend::cpu::quant::{self, Format};
use rserve_engine::backend::cpu::CpuBackend;
use rserve_engine::model::{BlockId, ScheduledSeq, TokenId};
use rserve_engine::runner::{ModelRunner, StepRunner};
use rserve_engine::sampling::argmax;
use rserve_engine::source::{resolve_model, ResolveOptions};
use serde_json::Value;

const BS: usize = 16;
/// Golden prompts compared.
const PROMPTS: usize = 4;
/// Decode steps compared per prompt.
const STEPS: usize = 16;
/// Bound on the move of the reference's top-20 first-token log-probs (measured up to 0.52).
const LOGPROB_TOL: f32 = 0.8;
/// Top-2 log-prob margin (nats) of the reference above which the packed path must pick its token.
const MARGIN: f32 = 1.0;

fn load(path: &std::path::Path) -> (rserve_engine::config::ModelParams, rserve_engine::weights::Weights) {
    let resolved =
        resolve_model(path.to_str().unwrap(), &ResolveOptions::with_cache_dir(std::env::temp_dir())).unwrap();
    let params = resolved.load_params().unwrap();
    let weights = rserve_engine::weights::load(&resolved, &params, DType::F32).unwrap();
    (params, weights)
}

/// The k-quant a layer's down_proj gets: llama.cpp's Q4_K_M puts Q6_K on some layers' ffn_down and Q4_K on the
/// rest; every third layer takes Q5_K here so all three formats run.
fn k_type(layer: usize) -> GgmlDType {
    [GgmlDType::Q6K, GgmlDType::Q4K, GgmlDType::Q5K][layer % 3]
}

/// The SmolLM2 GGUF with every matrix of whole super-blocks requantized to a k-quant (`k_type`).
fn write_k_quant_copy(dir: &std::path::Path) -> std::path::PathBuf {
    let src = rserve_tests::smollm2_gguf();
    let mut f = std::fs::File::open(&src).unwrap();
    let content = gguf_file::Content::read(&mut f).unwrap();
    let mut tensors = Vec::new();
    for (name, info) in &content.tensor_infos {
        let q = info.read(&mut f, content.tensor_data_offset, &Device::Cpu).unwrap();
        let dims = q.shape().dims().to_vec();
        let q = match (dims.as_slice(), name.strip_prefix("blk.")) {
            (&[_, cols], Some(rest)) if cols % 256 == 0 => {
                let layer: usize = rest.split('.').next().unwrap().parse().unwrap();
                QTensor::quantize(&q.dequantize(&Device::Cpu).unwrap(), k_type(layer)).unwrap()
            }
            _ => q,
        };
        tensors.push((name.clone(), q));
    }
    let dst = dir.join("SmolLM2-135M-Instruct.Q4_K_M-like.gguf");
    let mut out = std::io::BufWriter::new(std::fs::File::create(&dst).unwrap());
    let meta: Vec<(&str, &gguf_file::Value)> = content.metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tens: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut out, &meta, &tens).unwrap();
    dst
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// Per golden prompt: the logits of the first step and of each decode step, the decode steps fed `forced` tokens
/// (the reference's greedy ones) or, when None, the run's own greedy tokens.
fn run(
    backend: CpuBackend,
    path: &std::path::Path,
    prompts: &[Vec<u32>],
    forced: Option<&[Vec<u32>]>,
) -> Vec<Vec<Vec<f32>>> {
    let (params, weights) = load(path);
    let mut r = ModelRunner::new(backend, &params, &weights, 64, BS).unwrap();
    drop(weights);
    let mut all = Vec::new();
    for (p, prompt) in prompts.iter().enumerate() {
        let total = prompt.len() + STEPS;
        let seq = |tokens: &[u32], start: usize| {
            ScheduledSeq::new(
                tokens.iter().copied().map(TokenId).collect(),
                start,
                BlockId::run(0, total.div_ceil(BS)),
                BS,
            )
        };
        let mut logits = Vec::new();
        for (c, chunk) in prompt.chunks(quant::INTEGER_ROWS).enumerate() {
            logits = r.execute(&[seq(chunk, c * quant::INTEGER_ROWS)]).unwrap();
        }
        let mut steps = vec![logits];
        for step in 0..STEPS - 1 {
            let t = match forced {
                Some(f) => f[p][step],
                None => argmax(&steps[step]),
            };
            steps.push(r.execute(&[seq(&[t], prompt.len() + step)]).unwrap());
        }
        all.push(steps);
    }
    all
}

#[test]
fn smollm2_q4_k_m_like_stays_packed_and_close_to_the_dequantized_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_k_quant_copy(dir.path());

    let (_, w) = load(&path);
    // 30 layers of 7 projections and the embedding table: all packed, the down_projs as k-quants.
    assert_eq!(w.packed().len(), 30 * 7 + 1);
    for layer in 0..30 {
        let name = format!("model.layers.{layer}.mlp.down_proj.weight");
        let t = w.get(&name).unwrap();
        let p = quant::lookup(t).unwrap_or_else(|| panic!("{name} has no packed twin"));
        assert_eq!(p.format(), Format::from_ggml(k_type(layer)).unwrap(), "{name}");
        if layer < 3 {
            let dense = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            assert!(p.dequantize() == dense, "{name}: the twin does not decode to the loaded tensor");
        }
    }
    drop(w);

    let golden: Value =
        serde_json::from_str(&std::fs::read_to_string(rserve_tests::fixture("golden/smollm2_greedy.json")).unwrap())
            .unwrap();
    let prompts: Vec<Vec<u32>> =
        golden["prompts"].as_array().unwrap().iter().take(PROMPTS).map(|p| ids(&p["prompt_token_ids"])).collect();
    let want = run(CpuBackend::with_packed_weights(false), &path, &prompts, None);
    let greedy: Vec<Vec<u32>> = want.iter().map(|steps| steps.iter().map(|l| argmax(l)).collect()).collect();
    let got = run(CpuBackend::with_packed_weights(true), &path, &prompts, Some(&greedy));
    common::teacher::compare(&got, &want, MARGIN, LOGPROB_TOL, "packed k-quants");
}
