//! SmolLM2-135M-Instruct (real GGUF weights) greedy decoding against the ids our CPU backend produces
//! (`tests/fixtures/golden/smollm2_greedy.json`), token by token: through `ModelRunner` op by op in f32 and bf16, then through
//! the server's `ModelRunner<CudaBackend>` (decode graphs, tokens picked on the device), each prompt alone and all in one batch.

use rserve_engine::backend::cuda::CudaBackend;
use rserve_engine::model::{BlockId, ScheduledSeq, TokenId};
use rserve_engine::runner::{ModelRunner, RunnerOptions, StepRunner};

use crate::common::R;

/// Greedy decoding of one prompt through `execute` (logits read back, the argmax taken on the host).
fn greedy<S: StepRunner + ?Sized>(r: &mut S, prompt: &[u32], steps: usize, bs: usize) -> R<Vec<u32>> {
    let total = prompt.len() + steps;
    let table = BlockId::run(0, total.div_ceil(bs));
    let mut out = Vec::new();
    let mut seq = ScheduledSeq::new(prompt.iter().copied().map(TokenId).collect(), 0, table.clone(), bs);
    for _ in 0..steps {
        let logits = r.execute(std::slice::from_ref(&seq))?;
        let next = rserve_engine::sampling::argmax(&logits);
        out.push(next);
        let pos = seq.start_position + seq.token_ids.len();
        seq = ScheduledSeq::new(vec![TokenId(next)], pos, table.clone(), bs);
    }
    Ok(out)
}

/// Prints one line per prompt and a summary per path; returns the number of failures.
pub fn check(golden: &str, gguf: &str) -> R<usize> {
    use rserve_engine::source::{resolve_model, ResolveOptions};
    let g: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(golden)?)?;
    let resolved = resolve_model(gguf, &ResolveOptions::from_env())?;
    let params = resolved.load_params()?;
    let mut fails = 0;
    for dtype in [candle_core::DType::F32, candle_core::DType::BF16] {
        let weights = rserve_engine::weights::load(&resolved, &params, dtype)?;
        let eager = RunnerOptions { enforce_eager: true, ..Default::default() };
        let mut runner = ModelRunner::with_options(CudaBackend::new(0)?, &params, &weights, 64, 16, eager)?;
        let (mut seqs_equal, mut n) = (0, 0);
        for p in g["prompts"].as_array().ok_or("no prompts")? {
            let ids: Vec<u32> = p["prompt_token_ids"]
                .as_array()
                .ok_or("ids")?
                .iter()
                .filter_map(|v| v.as_u64().map(|x| x as u32))
                .collect();
            let want: Vec<u32> = p["greedy_token_ids"]
                .as_array()
                .ok_or("greedy")?
                .iter()
                .filter_map(|v| v.as_u64().map(|x| x as u32))
                .collect();
            let got = greedy(&mut runner, &ids, want.len(), 16)?;
            let same = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
            n += 1;
            if same == want.len() {
                seqs_equal += 1;
            }
            println!(
                "golden {:?} prompt {:<2} {:<24} {} first_diff={}",
                dtype,
                p["index"],
                p["name"].as_str().unwrap_or(""),
                if same == want.len() { "MATCH" } else { "DIFF " },
                if same == want.len() { "-".to_string() } else { same.to_string() }
            );
        }
        println!("golden {:?}: {seqs_equal}/{n} prompts give the same 32 greedy tokens as the CPU backend", dtype);
        if dtype == candle_core::DType::F32 && seqs_equal < 8 {
            fails += 1;
        }
    }
    // The server's runner: decode steps replayed from CUDA graphs, tokens picked on the device; every prompt alone
    // (bucket 1) and all prompts in one ragged batch (padded to a bucket).
    let weights = rserve_engine::weights::load(&resolved, &params, candle_core::DType::F32)?;
    let opts = RunnerOptions { max_model_len: 2048, max_num_seqs: 256, enforce_eager: false, ..Default::default() };
    let mut runner = ModelRunner::with_options(CudaBackend::new(0)?, &params, &weights, 1024, 16, opts)?;
    let prompts: Vec<(Vec<u32>, Vec<u32>)> = g["prompts"]
        .as_array()
        .ok_or("no prompts")?
        .iter()
        .map(|p| {
            let ids = p["prompt_token_ids"]
                .as_array()
                .map(|a| a.iter().filter_map(|v| v.as_u64().map(|x| x as u32)).collect())
                .unwrap_or_default();
            let want = p["greedy_token_ids"]
                .as_array()
                .map(|a| a.iter().filter_map(|v| v.as_u64().map(|x| x as u32)).collect())
                .unwrap_or_default();
            (ids, want)
        })
        .collect();
    let mut alone = 0;
    for (ids, want) in &prompts {
        let got = greedy_device(&mut runner, std::slice::from_ref(ids), want.len(), 16)?;
        alone += (&got[0] == want) as usize;
    }
    let batched = greedy_device(&mut runner, &prompts.iter().map(|p| p.0.clone()).collect::<Vec<_>>(), 32, 16)?;
    let together = batched.iter().zip(&prompts).filter(|(g, p)| *g == &p.1).count();
    println!("golden graphs: {alone}/{} prompts alone and {together}/{} in one batch give the same 32 greedy tokens as the CPU backend ({} graphs captured)", prompts.len(), prompts.len(), runner.num_recordings());
    if alone < 8 || together < 8 || runner.num_recordings() == 0 {
        fails += 1;
    }
    Ok(fails)
}

/// Greedy decoding of several prompts at once through `execute_greedy` (ids picked on the device).
fn greedy_device(r: &mut ModelRunner<CudaBackend>, prompts: &[Vec<u32>], steps: usize, bs: usize) -> R<Vec<Vec<u32>>> {
    let per_seq = (prompts.iter().map(|p| p.len()).max().unwrap_or(0) + steps).div_ceil(bs);
    let tables: Vec<Vec<BlockId>> = (0..prompts.len()).map(|i| BlockId::run((i * per_seq) as u32, per_seq)).collect();
    let mut seqs: Vec<ScheduledSeq> = prompts
        .iter()
        .zip(&tables)
        .map(|(p, t)| ScheduledSeq::new(p.iter().copied().map(TokenId).collect(), 0, t.clone(), bs))
        .collect();
    let mut out = vec![Vec::new(); prompts.len()];
    for _ in 0..steps {
        let ids = r.execute_greedy(&seqs)?.ok_or("no device greedy")?;
        for (i, s) in seqs.iter_mut().enumerate() {
            out[i].push(ids[i]);
            let pos = s.start_position + s.token_ids.len();
            *s = ScheduledSeq::new(vec![TokenId(ids[i])], pos, tables[i].clone(), bs);
        }
    }
    Ok(out)
}
