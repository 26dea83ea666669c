//! The model shelf against Hugging Face transformers (float32): tiny random-weight checkpoints of Qwen3, Gemma 2,
//! Gemma 3, Phi-3 (LongRoPE), Mistral with a sliding window, and the mixtures of experts Mixtral (top 2,
//! renormalised) and Qwen3-MoE (top 4, dense and routed layers) (`scripts/reference/tiny_models.py`, made at setup
//! without torch) give transformers' 32 greedy tokens and first-token top-20 log-probs within 1e-3
//! (`tests/fixtures/golden/tiny/*.json`, `scripts/reference/tiny_goldens.py`), on the CPU backend and on OpenCL, with
//! prompts longer than the 16-token window. On OpenCL the prompts also run together in one ragged batch.

mod backends;
mod weights_support;

use std::path::PathBuf;

use candle_core::DType;
use rserve_engine::backend::cpu::CpuBackend;
use rserve_engine::backend::Backend;
use rserve_engine::config::ModelParams;
use rserve_engine::model::{BlockId, KvLayout, ScheduledSeq, TokenId};
use rserve_engine::runner::{ModelRunner, StepRunner};
use rserve_engine::sampling::{argmax, logprobs};
use rserve_engine::source::{resolve_model, ResolveOptions};
use rserve_engine::weights::Weights;
use serde_json::Value;

const STEPS: usize = 32;
const LOGPROB_TOL: f32 = 1e-3;

/// One architecture's golden file and its checkpoint.
struct Golden {
    name: String,
    prompts: Vec<Prompt>,
    params: ModelParams,
    weights: Weights,
    /// KV cache groups of the model (sliding-window and global layers keep separate block tables).
    groups: usize,
}

struct Prompt {
    name: String,
    ids: Vec<u32>,
    greedy: Vec<u32>,
    top20: Vec<(usize, f32)>,
    margins: Vec<f32>,
    near_tie: f32,
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn golden(name: &str) -> Golden {
    golden_from(name, None)
}

/// The golden of `name`, with its checkpoint read from `folder` instead of the one the golden names.
fn golden_from(name: &str, folder: Option<PathBuf>) -> Golden {
    let path = rserve_tests::fixture(&format!("golden/tiny/{name}.json"));
    let g: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let folder = folder.unwrap_or_else(|| tiny_folder(&g));
    let near_tie = g["settings"]["near_tie_threshold"].as_f64().unwrap() as f32;
    let prompts = g["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| Prompt {
            name: p["name"].as_str().unwrap().to_string(),
            ids: ids(&p["prompt_token_ids"]),
            greedy: ids(&p["greedy_token_ids"]),
            top20: p["first_step_top20"]
                .as_array()
                .unwrap()
                .iter()
                .map(|pair| (pair[0].as_u64().unwrap() as usize, pair[1].as_f64().unwrap() as f32))
                .collect(),
            margins: p["margins"].as_array().unwrap().iter().map(|m| m.as_f64().unwrap() as f32).collect(),
            near_tie,
        })
        .collect();
    let resolved =
        resolve_model(folder.to_str().unwrap(), &ResolveOptions::with_cache_dir(std::env::temp_dir())).unwrap();
    let params = resolved.load_params().unwrap();
    let weights = rserve_engine::weights::load(&resolved, &params, DType::F32).unwrap();
    let groups = KvLayout::of(&params).groups.len();
    Golden { name: name.to_string(), prompts, params, weights, groups }
}

/// A sequence over `blocks` blocks from `first_block` in every KV cache group; group `g`'s blocks lie `g x region`
/// further on (each group has its own blocks, as the scheduler hands them out).
fn tiny_folder(g: &Value) -> PathBuf {
    let folder = g["model"]["folder"].as_str().unwrap();
    rserve_tests::model_file(&format!("{folder}/model.safetensors"));
    rserve_tests::models_dir().join(folder)
}

/// The tiny Gemma 3 as Gemma 3's 4B-27B checkpoints are published: a `Gemma3ForConditionalGeneration` config with
/// the text model in `text_config` (without `max_position_embeddings`, as there) and its tensors under
/// `language_model.` (as transformers 4 saves them).
fn gemma3_as_multimodal(dir: &std::path::Path) -> PathBuf {
    let g: Value =
        serde_json::from_str(&std::fs::read_to_string(rserve_tests::fixture("golden/tiny/gemma3.json")).unwrap())
            .unwrap();
    let src = tiny_folder(&g);
    let mut text: Value = serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    text.as_object_mut().unwrap().remove("max_position_embeddings");
    let eos = text.get("eos_token_id").cloned().unwrap_or(Value::Null);
    let config = serde_json::json!({
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "eos_token_id": eos,
        "text_config": text,
        "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 16},
    });
    let out = dir.join("gemma3_mm");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("config.json"), serde_json::to_string_pretty(&config).unwrap()).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), out.join(f)).unwrap();
    }
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let renamed: Vec<(String, safetensors::tensor::TensorView<'_>)> =
        st.tensors().into_iter().map(|(name, view)| (format!("language_model.{name}"), view)).collect();
    safetensors::serialize_to_file(renamed, None, &out.join("model.safetensors")).unwrap();
    out
}

fn seq(tokens: &[u32], start: usize, first_block: u32, blocks: usize, bs: usize, g: &Golden) -> ScheduledSeq {
    let region = g.region(bs) as u32;
    let tables = (0..g.groups as u32).map(|i| BlockId::run(first_block + i * region, blocks)).collect();
    ScheduledSeq::with_groups(tokens.iter().copied().map(TokenId).collect(), start, tables, bs)
}

impl Golden {
    /// Blocks one group needs for every prompt of the golden at once.
    fn region(&self, bs: usize) -> usize {
        self.prompts.len() * longest(self).div_ceil(bs)
    }

    /// Blocks of a cache that holds every prompt at once in every group.
    fn num_blocks(&self, bs: usize) -> usize {
        self.groups * self.region(bs)
    }
}

/// Greedy tokens must equal transformers' up to the first step where its top two are a near-tie (float noise may
/// pick either there); everything after such a step is not compared.
fn check_tokens(what: &str, p: &Prompt, got: &[u32]) {
    for (step, (g, w)) in got.iter().zip(&p.greedy).enumerate() {
        if p.margins[step] < p.near_tie {
            return;
        }
        assert_eq!(
            g, w,
            "{what} {}: step {step} picks {g}, transformers {w} (got {got:?}, want {:?})",
            p.name, p.greedy
        );
    }
}

fn check_first_logprobs(what: &str, p: &Prompt, logits: &[f32]) {
    let lp = logprobs::log_softmax(logits);
    for &(id, want) in &p.top20 {
        assert!(
            (lp[id] - want).abs() < LOGPROB_TOL,
            "{what} {}: logprob of {id} is {}, transformers {want}",
            p.name,
            lp[id]
        );
    }
}

/// Each prompt alone: prefill in one step, then one token per step.
fn check_alone(what: &str, r: &mut dyn StepRunner, g: &Golden, bs: usize) {
    for p in &g.prompts {
        let blocks = (p.ids.len() + STEPS).div_ceil(bs);
        let mut logits = r.execute(&[seq(&p.ids, 0, 0, blocks, bs, g)]).unwrap();
        check_first_logprobs(what, p, &logits);
        let mut got = Vec::new();
        for step in 0..STEPS {
            let t = argmax(&logits);
            got.push(t);
            if step + 1 < STEPS {
                logits = r.execute(&[seq(&[t], p.ids.len() + step, 0, blocks, bs, g)]).unwrap();
            }
        }
        check_tokens(what, p, &got);
    }
}

/// All prompts in one ragged batch: every prefill in one step (chunks longer than the window next to each other),
/// then batched decode.
fn check_batched(what: &str, r: &mut dyn StepRunner, g: &Golden, bs: usize, blocks_per_seq: usize) {
    let block0 = |i: usize| (i * blocks_per_seq) as u32;
    let batch: Vec<ScheduledSeq> =
        g.prompts.iter().enumerate().map(|(i, p)| seq(&p.ids, 0, block0(i), blocks_per_seq, bs, g)).collect();
    let mut logits = r.execute(&batch).unwrap();
    let vocab = r.vocab_size();
    let mut out = vec![Vec::new(); g.prompts.len()];
    for step in 0..STEPS {
        let next: Vec<u32> = (0..g.prompts.len()).map(|i| argmax(&logits[i * vocab..(i + 1) * vocab])).collect();
        out.iter_mut().zip(&next).for_each(|(o, t)| o.push(*t));
        if step + 1 < STEPS {
            let seqs: Vec<ScheduledSeq> = g
                .prompts
                .iter()
                .enumerate()
                .map(|(i, p)| seq(&[next[i]], p.ids.len() + step, block0(i), blocks_per_seq, bs, g))
                .collect();
            logits = r.execute(&seqs).unwrap();
        }
    }
    for (p, got) in g.prompts.iter().zip(&out) {
        check_tokens(what, p, got);
    }
}

fn longest(g: &Golden) -> usize {
    g.prompts.iter().map(|p| p.ids.len()).max().unwrap() + STEPS
}

fn on_cpu(name: &str) {
    let g = golden(name);
    assert!(g.prompts.iter().all(|p| p.ids.len() > 16), "{}: prompts must be longer than the window", g.name);
    let mut cpu = ModelRunner::new(CpuBackend::new(), &g.params, &g.weights, g.num_blocks(16), 16).unwrap();
    check_alone("cpu", &mut cpu, &g, 16);
}

fn on_opencl(name: &str) {
    let Some(cl) = backends::opencl() else { return };
    let g = golden(name);
    let what = format!("opencl ({})", cl.device_name());
    let mut gpu = ModelRunner::new(cl, &g.params, &g.weights, g.num_blocks(16), 16).unwrap();
    check_alone(&what, &mut gpu, &g, 16);
    drop(gpu);
    let blocks_per_seq = longest(&g).div_ceil(32);
    let cl = backends::opencl().unwrap();
    let mut gpu = ModelRunner::new(cl, &g.params, &g.weights, g.num_blocks(32), 32).unwrap();
    check_batched(&what, &mut gpu, &g, 32, blocks_per_seq);
}

/// Greedy steps of `r` over one prompt: (tokens, the margin between the best and second logit at each step, the
/// first step's log-probs).
fn greedy_run(r: &mut dyn StepRunner, g: &Golden, p: &Prompt, bs: usize) -> (Vec<u32>, Vec<f32>, Vec<f32>) {
    let blocks = (p.ids.len() + STEPS).div_ceil(bs);
    let mut logits = r.execute(&[seq(&p.ids, 0, 0, blocks, bs, g)]).unwrap();
    let first = logprobs::log_softmax(&logits);
    let (mut tokens, mut margins) = (Vec::new(), Vec::new());
    for step in 0..STEPS {
        let lp = logprobs::log_softmax(&logits);
        let t = argmax(&logits);
        let second = lp.iter().enumerate().filter(|(i, _)| *i != t as usize).map(|(_, v)| *v).fold(f32::MIN, f32::max);
        margins.push(lp[t as usize] - second);
        tokens.push(t);
        if step + 1 < STEPS {
            logits = r.execute(&[seq(&[t], p.ids.len() + step, 0, blocks, bs, g)]).unwrap();
        }
    }
    (tokens, margins, first)
}

/// A bf16 checkpoint on OpenCL keeps a bf16 KV cache (`--kv-cache-dtype auto`, as vLLM and the CUDA backend) and
/// passes bf16 activations between its ops (`alloc_matmul_input`, the `_x16` matmuls): the tiny Qwen3 and Gemma 3
/// (sliding-window and global layers, so both cache groups) loaded in bf16 give the CPU backend's bf16-weight run
/// (f32 cache and activations) greedy tokens up to its first step whose top two are within 1 nat, and first-token
/// log-probs within 1 nat: these tiny models' large logits make the 16-bit rounding move log-probs by up to ~0.6
/// (measured; a cache or activation of garbage moves them by tens, and a token flips only below a 0.5 margin). (The
/// CPU's bf16 run keeps a bf16 cache too since its `auto` became the compute dtype, issue #27.)
#[test]
fn opencl_bf16_cache_and_activations_match_the_cpu_bf16_run() {
    use rserve_engine::backend::WeightDType;
    let Some(cl) = backends::opencl() else { return };
    assert_eq!(cl.kv_cache_dtype(WeightDType::BF16), WeightDType::BF16);
    drop(cl);
    for name in ["qwen3", "gemma3"] {
        let f32_golden = golden(name);
        let folder = tiny_folder(
            &serde_json::from_str::<Value>(
                &std::fs::read_to_string(rserve_tests::fixture(&format!("golden/tiny/{name}.json"))).unwrap(),
            )
            .unwrap(),
        );
        let resolved =
            resolve_model(folder.to_str().unwrap(), &ResolveOptions::with_cache_dir(std::env::temp_dir())).unwrap();
        let weights = rserve_engine::weights::load(&resolved, &f32_golden.params, DType::BF16).unwrap();
        let g = Golden { weights, ..f32_golden };
        let mut cpu = ModelRunner::new(CpuBackend::new(), &g.params, &g.weights, g.num_blocks(16), 16).unwrap();
        let mut gpu =
            ModelRunner::new(backends::opencl().unwrap(), &g.params, &g.weights, g.num_blocks(16), 16).unwrap();
        let mut compared = 0;
        for p in &g.prompts {
            let (want, margins, want_lp) = greedy_run(&mut cpu, &g, p, 16);
            let (got, _, got_lp) = greedy_run(&mut gpu, &g, p, 16);
            for &(id, _) in &p.top20 {
                let d = (got_lp[id] - want_lp[id]).abs();
                assert!(d < 1.0, "{name} {}: first-token logprob of {id} differs by {d}", p.name);
            }
            for step in 0..STEPS {
                if margins[step] < 1.0 {
                    break;
                }
                assert_eq!(got[step], want[step], "{name} {}: step {step} (got {got:?}, want {want:?})", p.name);
                compared += 1;
            }
        }
        assert!(compared >= 2 * g.prompts.len(), "{name}: only {compared} confident steps compared");
    }
}

/// `--dtype bfloat16` on the CPU: bf16 weights multiplied as bf16 (`matmul16`) and the KV cache in bf16 (`auto`, the
/// compute dtype), or in f16 (`--kv-cache-dtype float16`), against the CPU's f32 run (transformers' precision): the
/// tiny Qwen3 and Gemma 3 (both KV cache groups) give its greedy tokens up to the first step whose top two are within
/// 1 nat, and first-token log-probs within 1 nat. Rounding the weights to bf16 moves these large-logit tiny models'
/// log-probs by up to ~0.6 (the reasoning and measurement of the OpenCL bf16 test above); a garbage cache or weight
/// moves them by tens.
#[test]
fn cpu_bf16_weights_and_16_bit_cache_match_the_cpu_f32_run() {
    use rserve_engine::backend::WeightDType;
    for name in ["qwen3", "gemma3"] {
        let f32_golden = golden(name);
        let bf16 = golden(name);
        let folder = tiny_folder(
            &serde_json::from_str::<Value>(
                &std::fs::read_to_string(rserve_tests::fixture(&format!("golden/tiny/{name}.json"))).unwrap(),
            )
            .unwrap(),
        );
        let resolved =
            resolve_model(folder.to_str().unwrap(), &ResolveOptions::with_cache_dir(std::env::temp_dir())).unwrap();
        let weights = rserve_engine::weights::load(&resolved, &bf16.params, DType::BF16).unwrap();
        let g = Golden { weights, ..bf16 };
        let blocks = g.num_blocks(16);
        let mut reference =
            ModelRunner::new(CpuBackend::new(), &f32_golden.params, &f32_golden.weights, blocks, 16).unwrap();
        for kv in [None, Some(WeightDType::F16)] {
            let backend = CpuBackend::new().with_kv_cache_dtype(kv);
            assert_eq!(backend.kv_cache_dtype(WeightDType::BF16), kv.unwrap_or(WeightDType::BF16));
            let mut half = ModelRunner::new(backend, &g.params, &g.weights, blocks, 16).unwrap();
            let mut compared = 0;
            for p in &g.prompts {
                let (want, margins, want_lp) = greedy_run(&mut reference, &f32_golden, p, 16);
                let (got, _, got_lp) = greedy_run(&mut half, &g, p, 16);
                for &(id, _) in &p.top20 {
                    let d = (got_lp[id] - want_lp[id]).abs();
                    assert!(d < 1.0, "{name} {} (KV {kv:?}): first-token logprob of {id} differs by {d}", p.name);
                }
                for step in 0..STEPS {
                    if margins[step] < 1.0 {
                        break;
                    }
                    assert_eq!(got[step], want[step], "{name} {} (KV {kv:?}): step {step}", p.name);
                    compared += 1;
                }
            }
            assert!(compared >= 2 * g.prompts.len(), "{name}: only {compared} confident steps compared");
        }
    }
}

#[test]
fn qwen3_from_a_gguf_file_matches_transformers() {
    // The tiny Qwen3 written as llama.cpp names it (`qwen3` metadata, `attn_q_norm` / `attn_k_norm`), in f32.
    let safetensors = golden("qwen3");
    let hf: std::collections::HashMap<String, candle_core::Tensor> =
        rserve_engine::weights::expected_tensors(&safetensors.params)
            .into_iter()
            .map(|spec| (spec.name.clone(), safetensors.weights.get(&spec.name).unwrap().clone()))
            .collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("qwen3-tiny-f32.gguf");
    weights_support::write_gguf(&path, "qwen3", &safetensors.params, &hf, |_| candle_core::quantized::GgmlDType::F32);
    let resolved =
        resolve_model(path.to_str().unwrap(), &ResolveOptions::with_cache_dir(std::env::temp_dir())).unwrap();
    let params = resolved.load_params().unwrap();
    assert!(params.qk_norm && params.head_dim == safetensors.params.head_dim);
    let weights = rserve_engine::weights::load(&resolved, &params, DType::F32).unwrap();
    let g = Golden { params, weights, ..safetensors };
    let mut cpu = ModelRunner::new(CpuBackend::new(), &g.params, &g.weights, g.num_blocks(16), 16).unwrap();
    check_alone("cpu (GGUF)", &mut cpu, &g, 16);
}

#[test]
fn gemma3_published_as_a_multimodal_checkpoint_serves_its_text_model() {
    let dir = tempfile::tempdir().unwrap();
    let g = golden_from("gemma3", Some(gemma3_as_multimodal(dir.path())));
    assert_eq!(g.params.max_position_embeddings, 131_072, "Gemma3TextConfig's default context");
    let mut cpu = ModelRunner::new(CpuBackend::new(), &g.params, &g.weights, g.num_blocks(16), 16).unwrap();
    check_alone("cpu (multimodal checkpoint)", &mut cpu, &g, 16);
}

macro_rules! shelf {
    ($($name:ident),*) => {
        mod cpu {
            $(#[test] fn $name() { super::on_cpu(stringify!($name)) })*
        }
        mod opencl {
            $(#[test] fn $name() { super::on_opencl(stringify!($name)) })*
        }
    };
}

shelf!(qwen3, gemma2, gemma3, phi3, mistral, mixtral, qwen3moe, gptoss);
