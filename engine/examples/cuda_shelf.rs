//! The model shelf on an NVIDIA GPU (run where one is; `benches/gpu/shelf.sh` prints the speed side): each tiny
//! random-weight checkpoint (`scripts/reference/tiny_models.py`: Qwen3, Gemma 2, Gemma 3, Phi-3, Mistral, Mixtral,
//! Qwen3-MoE) through the CUDA backend against transformers' goldens (`tests/fixtures/golden/tiny/*.json`), as the
//! CPU and OpenCL backends are checked in CI (`engine/tests/model_shelf.rs`):
//! 1. `ModelRunner<CudaBackend>` op by op (`enforce_eager`), f32 weights: every prompt alone, first-token top-20 log-probs within 1e-3 and the 32
//!    greedy tokens equal; bf16 weights: the same tokens reported (not required);
//! 2. `ModelRunner<CudaBackend>` as the server runs it (decode steps replayed from CUDA graphs, ids picked on the device),
//!    f32: every prompt alone and all prompts in one batch give the 32 golden tokens.
//!
//! Every model keeps its KV cache groups (sliding-window and global layers in separate block tables).
//! Usage: cuda_shelf [MODELS_DIR]   (default `$RSERVE_TEST_MODELS`, else `models/x`; the checkpoints under `tiny/`).
//! Prints one line per check and exits non-zero if any fails.

use std::path::{Path, PathBuf};

use rserve_engine::backend::cuda::CudaBackend;
use rserve_engine::model::{BlockId, KvLayout, ScheduledSeq, TokenId};
use rserve_engine::runner::{ModelRunner, RunnerOptions, StepRunner};
use rserve_engine::sampling::{argmax, logprobs};
use rserve_engine::source::{resolve_model, ResolveOptions};

type R<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const BS: usize = 16;
const NAMES: [&str; 8] = ["qwen3", "gemma2", "gemma3", "phi3", "mistral", "mixtral", "qwen3moe", "gptoss"];

struct Prompt {
    ids: Vec<u32>,
    want: Vec<u32>,
    top20: Vec<(usize, f32)>,
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().map(|a| a.iter().filter_map(|x| x.as_u64().map(|x| x as u32)).collect()).unwrap_or_default()
}

fn prompts(golden: &Path) -> R<Vec<Prompt>> {
    let g: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(golden)?)?;
    Ok(g["prompts"]
        .as_array()
        .ok_or("no prompts")?
        .iter()
        .map(|p| Prompt {
            ids: ids(&p["prompt_token_ids"]),
            want: ids(&p["greedy_token_ids"]),
            top20: p["first_step_top20"]
                .as_array()
                .map(|a| a.iter().filter_map(|x| Some((x[0].as_u64()? as usize, x[1].as_f64()? as f32))).collect())
                .unwrap_or_default(),
        })
        .collect())
}

/// One sequence per prompt slot `i`: group `g`'s blocks lie in its own region of `region` blocks per group.
struct Tables {
    groups: usize,
    per_seq: usize,
    slots: usize,
}

impl Tables {
    fn num_blocks(&self) -> usize {
        self.groups * self.per_seq * self.slots
    }

    fn seq(&self, slot: usize, tokens: &[u32], start: usize) -> ScheduledSeq {
        let region = self.per_seq * self.slots;
        let tables =
            (0..self.groups).map(|g| BlockId::run((g * region + slot * self.per_seq) as u32, self.per_seq)).collect();
        ScheduledSeq::with_groups(tokens.iter().copied().map(TokenId).collect(), start, tables, BS)
    }
}

/// Greedy tokens of one prompt alone, and the first step's logits.
fn greedy<S: StepRunner + ?Sized>(r: &mut S, t: &Tables, p: &Prompt) -> R<(Vec<u32>, Vec<f32>)> {
    let mut logits = r.execute(&[t.seq(0, &p.ids, 0)])?;
    let first = logits.clone();
    let mut out = Vec::new();
    for step in 0..p.want.len() {
        let next = argmax(&logits);
        out.push(next);
        if step + 1 < p.want.len() {
            logits = r.execute(&[t.seq(0, &[next], p.ids.len() + step)])?;
        }
    }
    Ok((out, first))
}

/// Greedy tokens of several prompts at once through `execute_greedy` (ids picked on the device).
fn greedy_device(r: &mut ModelRunner<CudaBackend>, t: &Tables, prompts: &[&Prompt]) -> R<Vec<Vec<u32>>> {
    let steps = prompts.iter().map(|p| p.want.len()).max().unwrap_or(0);
    let mut seqs: Vec<ScheduledSeq> = prompts.iter().enumerate().map(|(i, p)| t.seq(i, &p.ids, 0)).collect();
    let mut out = vec![Vec::new(); prompts.len()];
    for _ in 0..steps {
        let next = r.execute_greedy(&seqs)?.ok_or("no device greedy")?;
        for (i, s) in seqs.iter_mut().enumerate() {
            out[i].push(next[i]);
            let pos = s.start_position + s.token_ids.len();
            *s = t.seq(i, &[next[i]], pos);
        }
    }
    Ok(out)
}

fn check(models: &Path, name: &str) -> R<usize> {
    let folder = models.join("tiny").join(name);
    let prompts = prompts(&PathBuf::from(format!("tests/fixtures/golden/tiny/{name}.json")))?;
    let resolved = resolve_model(folder.to_str().ok_or("path")?, &ResolveOptions::from_env())?;
    let params = resolved.load_params()?;
    let longest = prompts.iter().map(|p| p.ids.len() + p.want.len()).max().unwrap_or(0);
    let t = Tables { groups: KvLayout::of(&params).groups.len(), per_seq: longest.div_ceil(BS), slots: prompts.len() };
    let mut fails = 0;
    for dtype in [candle_core::DType::F32, candle_core::DType::BF16] {
        let weights = rserve_engine::weights::load(&resolved, &params, dtype)?;
        let eager = RunnerOptions { enforce_eager: true, ..Default::default() };
        let mut r = ModelRunner::with_options(CudaBackend::new(0)?, &params, &weights, t.num_blocks(), BS, eager)?;
        let mut equal = 0;
        for (i, p) in prompts.iter().enumerate() {
            let (got, first) = greedy(&mut r, &t, p)?;
            let lp = logprobs::log_softmax(&first);
            let worst = p.top20.iter().map(|&(id, want)| (lp[id] - want).abs()).fold(0f32, f32::max);
            let same = got.iter().zip(&p.want).take_while(|(a, b)| a == b).count();
            let ok = same == p.want.len() && (dtype == candle_core::DType::BF16 || worst < 1e-3);
            equal += ok as usize;
            println!(
                "shelf {name:<8} {dtype:?} prompt {i}: {} first_diff={same} max|dlogprob|={worst:.2e}",
                if ok { "MATCH" } else { "DIFF " }
            );
        }
        if dtype == candle_core::DType::F32 && equal < prompts.len() {
            fails += 1;
        }
    }
    let weights = rserve_engine::weights::load(&resolved, &params, candle_core::DType::F32)?;
    let opts = RunnerOptions { max_model_len: 1024, max_num_seqs: 16, enforce_eager: false, ..Default::default() };
    let mut r = ModelRunner::with_options(CudaBackend::new(0)?, &params, &weights, t.num_blocks(), BS, opts)?;
    let mut alone = 0;
    for p in &prompts {
        alone += (greedy_device(&mut r, &t, &[p])?[0] == p.want) as usize;
    }
    let all: Vec<&Prompt> = prompts.iter().collect();
    let together = greedy_device(&mut r, &t, &all)?.iter().zip(&prompts).filter(|(g, p)| **g == p.want).count();
    println!(
        "shelf {name:<8} graphs: {alone}/{n} alone, {together}/{n} in one batch equal transformers ({} graphs)",
        r.num_recordings(),
        n = prompts.len()
    );
    if alone < prompts.len() || together < prompts.len() || r.num_recordings() == 0 {
        fails += 1;
    }
    Ok(fails)
}

fn main() -> R<()> {
    let models = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("RSERVE_TEST_MODELS").ok())
        .unwrap_or_else(|| "models/x".into());
    let mut fails = 0;
    for name in NAMES {
        fails += check(Path::new(&models), name)?;
    }
    println!("cuda_shelf: {fails} failures");
    if fails > 0 {
        std::process::exit(1);
    }
    Ok(())
}
