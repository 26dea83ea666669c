//! Recorded decode steps on OpenCL (Intel's CPU runtime has `cl_khr_command_buffer`): three prompts are prefilled,
//! then decoded together for 102 steps, launched and collected as the engine does, each step feeding back the tokens
//! of the one before. After two steps of warm-up (the first runs op by op and is recorded, the second replays), the
//! 100 counted steps replay one command-buffer: none is created while they run, and each enqueues the same few
//! commands on SmolLM2-135M (30 layers) and on a 4-layer Qwen3: one write per step input, the replay and the ids'
//! read-back, whatever the depth of the model. Every token equals the one of the same steps run op by op
//! (`set_enforce_eager(true)`).

mod backends;

use candle_core::DType;
use rserve_engine::backend::opencl::{OpenClBackend, QueueStats};
use rserve_engine::backend::Backend;
use rserve_engine::model::{BlockId, ScheduledSeq, TokenId};
use rserve_engine::runner::{Launch, ModelRunner, StepRunner};
use rserve_engine::sampling::{RowParams, StepSampling};
use rserve_engine::source::{resolve_model, ResolveOptions};

const BS: usize = 16;
/// Blocks of each sequence (its prompt and every decoded token fit).
const BLOCKS: usize = 8;
const WARM_UP: usize = 2;
const COUNTED: usize = 100;
/// Short enough that the longest context stays in one attention partition: one recording.
const PROMPTS: [&[u32]; 3] = [&[1, 504, 3458, 282], &[1, 2683, 314, 260, 1345], &[1, 28, 29, 30, 31, 32]];

fn seq(tokens: &[u32], start: usize, i: usize) -> ScheduledSeq {
    let first = (i * BLOCKS) as u32;
    let blocks = (start + tokens.len()).div_ceil(BS);
    ScheduledSeq::new(tokens.iter().copied().map(TokenId).collect(), start, BlockId::run(first, blocks), BS)
}

/// What one run of the decode steps gave.
struct Run {
    layers: usize,
    /// Each step's tokens (prefill, warm-up and counted steps).
    tokens: Vec<Vec<u32>>,
    /// Over the counted steps.
    stats: QueueStats,
    recordings: usize,
}

fn run(cl: OpenClBackend, model: &std::path::Path, eager: bool) -> Run {
    let resolved =
        resolve_model(model.to_str().unwrap(), &ResolveOptions::with_cache_dir(std::env::temp_dir())).unwrap();
    let params = resolved.load_params().unwrap();
    let weights = rserve_engine::weights::load(&resolved, &params, DType::F32).unwrap();
    assert!(cl.records(), "{}: Intel's CPU runtime has cl_khr_command_buffer", cl.device_name());
    let mut runner = ModelRunner::new(cl, &params, &weights, PROMPTS.len() * BLOCKS, BS).unwrap();
    runner.set_enforce_eager(eager);
    let prefill: Vec<ScheduledSeq> = PROMPTS.iter().enumerate().map(|(i, p)| seq(p, 0, i)).collect();
    let mut tokens = vec![runner.execute_greedy(&prefill).unwrap().unwrap()];
    let greedy = StepSampling {
        params: [RowParams::GREEDY; PROMPTS.len()].iter().flat_map(|r| r.pack()).collect(),
        ..Default::default()
    };
    let mut before = runner.backend().queue_stats();
    for step in 0..WARM_UP + COUNTED {
        if step == WARM_UP {
            before = runner.backend().queue_stats();
        }
        let last = tokens.last().unwrap();
        let batch: Vec<ScheduledSeq> =
            PROMPTS.iter().enumerate().map(|(i, p)| seq(&[last[i]], p.len() + step, i)).collect();
        let ids = match runner.launch(&batch, &greedy).unwrap() {
            Launch::Running => runner.collect(&greedy).unwrap().ids,
            // The first sight of a shape runs op by op and records, its result read already.
            Launch::Done(rows) if step == 0 && !eager => rows.ids,
            Launch::Done(_) => panic!("decode step {step} was run to its end, not queued"),
        };
        tokens.push(ids);
    }
    let after = runner.backend().queue_stats();
    let stats = QueueStats {
        enqueued: after.enqueued - before.enqueued,
        command_buffers: after.command_buffers - before.command_buffers,
        replays: after.replays - before.replays,
    };
    Run { layers: params.num_layers, tokens, stats, recordings: runner.num_recordings() }
}

#[test]
fn decode_steps_replay_one_command_buffer_with_the_tokens_of_op_by_op_steps() {
    let Some(first) = backends::opencl() else { return };
    // Each run opens its own device (a runner owns its backend); the first reuses the one opened here.
    let mut spare = Some(first);
    let mut open = || spare.take().unwrap_or_else(|| backends::opencl().unwrap());
    let models = [("SmolLM2", rserve_tests::smollm2_gguf()), ("Qwen3", rserve_tests::models_dir().join("tiny/qwen3"))];
    let mut per_step = Vec::new();
    for (name, path) in &models {
        let recorded = run(open(), path, false);
        let eager = run(open(), path, true);
        let s = recorded.stats;
        let enqueued = s.enqueued as f64 / COUNTED as f64;
        println!(
            "OPENCL-{name}: layers {}, recordings {}, command-buffers created {}, replays {}, enqueued per step {enqueued} \
             (op by op: {} per step)",
            recorded.layers,
            recorded.recordings,
            s.command_buffers,
            s.replays,
            eager.stats.enqueued as f64 / COUNTED as f64
        );
        // One recording (one batch shape, one partition count), replayed by every counted step, and no
        // command-buffer created while they ran ...
        assert_eq!(recorded.recordings, 1, "{name}");
        assert_eq!(s.replays, COUNTED as u64, "{name}");
        assert_eq!(s.command_buffers, 0, "{name}");
        assert_eq!(eager.stats.replays + eager.stats.command_buffers + eager.recordings as u64, 0, "{name}");
        // ... the same tokens as op by op ...
        assert_eq!(recorded.tokens.len(), 1 + WARM_UP + COUNTED);
        for (step, (r, e)) in recorded.tokens.iter().zip(&eager.tokens).enumerate() {
            assert_eq!(r, e, "{name}: step {step} of the recorded run differs from op by op");
        }
        // ... and a constant number of enqueues per step.
        assert_eq!(s.enqueued % COUNTED as u64, 0, "{name}: {} enqueues over {COUNTED} steps", s.enqueued);
        per_step.push((recorded.layers, enqueued, eager.stats.enqueued as f64 / COUNTED as f64));
    }
    let [(deep, deep_enqueued, deep_eager), (shallow, shallow_enqueued, _)] = per_step[..] else { unreachable!() };
    assert!(deep > 4 * shallow, "SmolLM2 has {deep} layers, Qwen3 {shallow}");
    // One write per step input (ids, positions, query starts, context lengths, last rows, the one KV cache group's
    // slots and block tables), the replay and the ids' read-back.
    assert_eq!(deep_enqueued, 9.0);
    assert_eq!(shallow_enqueued, 9.0);
    assert!(deep_eager > 10.0 * deep_enqueued, "op by op enqueues a step's every launch: {deep_eager} per step");
}
