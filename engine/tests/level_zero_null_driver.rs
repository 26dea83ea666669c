//! The Level Zero host path through the real loader, on the loader's null driver (it accepts every call and runs
//! nothing) with the validation layer and parameter validation on: device discovery, the model's weights uploaded,
//! every SPIR-V module built, and one full forward step (a tiled-matmul prefill chunk, a decode token and a
//! split-KV decode over a long context) appended without a single failed call; at shutdown every handle the wrapper
//! created is destroyed. Decode steps of one batch at growing contexts build the attention work split once, not once
//! a step. A sampled decode step reads back one id per row. Decode steps of one batch shape replay one recorded
//! command list: over 100 steps, launched and then collected as the engine does, no command list is created and no
//! device memory allocated, and a step costs the same few appends on a 30-layer and a 4-layer model. With the null driver nothing executes, so the logits are not
//! checked.
//!
//! Modules: the forward step creates every module from its PVC native binary (`ZE_MODULE_FORMAT_NATIVE`), through
//! `RSERVE_ZE_MODULE_FORMAT=native`, since the null driver's device (vendor 0, device 0, no IP version) is no PVC;
//! opening the device with the default policy takes the SPIR-V fallback for every module.
//!
//! Each test body runs in a child process (the loader reads ZE_* variables once, at initialisation).

mod level_zero_support;

use candle_core::DType;
use level_zero_support as lz;
use rserve_engine::backend::level_zero::{handle_counts, loader_components, module_builds, HandleKind};
use rserve_engine::backend::Backend;
use rserve_engine::engine::device::Device;
use rserve_engine::model::{BlockId, ScheduledSeq, TokenId};
use rserve_engine::runner::{Launch, ModelRunner, StepRunner};
use rserve_engine::sampling::adjust::Edit;
use rserve_engine::sampling::{RowParams, StepSampling};
use rserve_engine::source::{resolve_model, ResolveOptions};

const BS: usize = 16;

fn seq(tokens: Vec<u32>, start: usize, first_block: u32) -> ScheduledSeq {
    let blocks = (start + tokens.len()).div_ceil(BS);
    ScheduledSeq::new(tokens.into_iter().map(TokenId).collect(), start, BlockId::run(first_block, blocks), BS)
}

fn forward_step_in_child() {
    let resolved = resolve_model(
        rserve_tests::smollm2_gguf().to_str().unwrap(),
        &ResolveOptions::with_cache_dir(std::env::temp_dir()),
    )
    .unwrap();
    let params = resolved.load_params().unwrap();
    let weights = rserve_engine::weights::load(&resolved, &params, DType::F32).unwrap();
    let device = Device::select("level-zero").unwrap();
    let name = device.name();
    println!("LZ-DEVICE: {name}");
    println!("LZ-MEMORY: {:?}", device.memory_bytes());
    let mut runner = device.build_runner(&params, &weights, 64, BS).unwrap();
    // 20 prompt tokens (tiled matmul, prefill attention), one decode token at position 40, and one at position 700
    // (two key partitions: the decode kernel's split-KV path and the reduce kernel).
    let batch = [seq((1..=20).collect(), 0, 0), seq(vec![42], 40, 2), seq(vec![7], 700, 5)];
    let logits = runner.execute(&batch).unwrap();
    assert_eq!(logits.len(), 3 * params.vocab_size);
    // A decode-only step as well (row-streaming matmul everywhere).
    let logits = runner.execute(&[seq(vec![9], 20, 0)]).unwrap();
    assert_eq!(logits.len(), params.vocab_size);
    drop(runner);
    // Ten decode steps of a batch of three, contexts growing by one token a step: one attention plan for them all.
    let backend = rserve_engine::backend::level_zero::open("level-zero").unwrap();
    let mut runner = ModelRunner::new(backend, &params, &weights, 64, BS).unwrap();
    let before = runner.backend().attention_plan_builds();
    for step in 0..10 {
        let batch = [seq(vec![5], 30 + step, 0), seq(vec![6], 50 + step, 8), seq(vec![7], 90 + step, 16)];
        runner.execute(&batch).unwrap();
    }
    println!("LZ-PLANS: {}", runner.backend().attention_plan_builds() - before);
    // A sampled decode step (top-p, a penalised row, a greedy row) chooses its tokens on the device: it reads back
    // one id per row, never the logits.
    let rows = [
        RowParams { temperature: 0.8, top_p: 0.9, seed: 1, ..RowParams::GREEDY },
        RowParams { temperature: 1.0, top_k: 40, seed: 2, ..RowParams::GREEDY },
        RowParams::GREEDY,
    ];
    let mut sampling = StepSampling { params: rows.iter().flat_map(|r| r.pack()).collect(), ..Default::default() };
    sampling.edits.push(Edit { row: 1, token: 7, mul: 1.2, add: -0.5 });
    let batch = [seq(vec![5], 40, 0), seq(vec![6], 60, 8), seq(vec![7], 100, 16)];
    let read = runner.backend().bytes_read_back();
    runner.execute_sampled(&batch, &sampling, None).unwrap();
    println!("LZ-READBACK: {}", runner.backend().bytes_read_back() - read);
    drop(runner);
    drop(weights);
    println!("LZ-COMPONENTS: {}", loader_components().unwrap().join(", "));
    println!("LZ-COUNTS: {}", handle_counts());
    print_module_builds();
}

fn print_module_builds() {
    let b = module_builds();
    println!("LZ-MODULES: native {} spirv {} refused {}", b.native, b.spirv, b.native_refused);
}

/// The `LZ-MODULES` line a child prints for `opens` device openings: with the PVC binaries every module (the
/// matrix engine's included) is native; otherwise every module but the matrix engine's (the null device is no PVC)
/// is SPIR-V.
fn modules_line(opens: usize, native: bool) -> String {
    use rserve_kernels::{target, Target, KERNELS};
    let built = KERNELS.iter().filter(|(m, _)| native || target(m) != Target::MatrixEngine).count();
    let (native, spirv) = if native { (opens * built, 0) } else { (0, opens * built) };
    format!("native {native} spirv {spirv} refused 0")
}

#[test]
fn forward_step_on_the_null_driver_with_validation() {
    if lz::in_child() {
        return forward_step_in_child();
    }
    let mut env = lz::null_driver_env();
    env.push(("RSERVE_ZE_MODULE_FORMAT".into(), "native".into()));
    let out = lz::run_child("forward_step_on_the_null_driver_with_validation", &env);
    let text = lz::text(&out);
    assert!(out.status.success(), "the child failed:\n{text}");
    assert!(lz::reported(&text, "LZ-DEVICE").is_some_and(|d| d.contains("Null Device")), "{text}");
    // Two device openings (the runner's, then the plan test's), every module from its PVC binary.
    assert_eq!(lz::reported(&text, "LZ-MODULES"), Some(modules_line(2, true).as_str()), "{text}");
    // The validation layer is loaded (so the calls below were checked) ...
    let components = lz::reported(&text, "LZ-COMPONENTS").unwrap_or_else(|| panic!("{text}"));
    assert!(components.contains("validation layer"), "the validation layer is not loaded: {components}");
    // ... and what it rejects comes back as an error result: none may appear.
    assert!(!text.contains("ZE_RESULT_ERROR"), "a Level Zero call failed:\n{text}");
    assert_eq!(lz::reported(&text, "LZ-PLANS"), Some("1"), "attention plans of 10 decode steps:\n{text}");
    // Three sampled rows: three u32 ids, nothing else.
    assert_eq!(lz::reported(&text, "LZ-READBACK"), Some("12"), "bytes read back by a sampled step:\n{text}");
    lz::assert_counts_balanced(&text, true);
}

/// Decode steps of one batch shape on `model` (a GGUF file or a checkpoint folder): two steps of warm-up (the
/// first runs op by op and is recorded, the second replays), then 100 steps at growing contexts, counted.
fn recorded_steps_of(model: &std::path::Path, tag: &str) {
    let resolved =
        resolve_model(model.to_str().unwrap(), &ResolveOptions::with_cache_dir(std::env::temp_dir())).unwrap();
    let params = resolved.load_params().unwrap();
    let weights = rserve_engine::weights::load(&resolved, &params, DType::F32).unwrap();
    let backend = rserve_engine::backend::level_zero::open("level-zero").unwrap();
    let mut runner = ModelRunner::new(backend, &params, &weights, 64, BS).unwrap();
    let batch = |step: usize| [seq(vec![5], 30 + step, 0), seq(vec![6], 50 + step, 12), seq(vec![7], 90 + step, 24)];
    for step in 0..2 {
        runner.execute_greedy(&batch(step)).unwrap().unwrap();
    }
    let (lists, memory) = (created(HandleKind::CommandList), created(HandleKind::DeviceMemory));
    let before = runner.backend().stream_stats().unwrap();
    let pool = runner.backend().memory_usage();
    // As the engine runs them: launched (the replay queued, nothing waited for), then collected.
    let greedy =
        StepSampling { params: [RowParams::GREEDY; 3].iter().flat_map(|r| r.pack()).collect(), ..Default::default() };
    for step in 2..102 {
        let launched = runner.launch(&batch(step), &greedy).unwrap();
        assert!(matches!(launched, Launch::Running), "a recorded decode step is queued, not run to its end");
        let ids = runner.collect(&greedy).unwrap().ids;
        assert_eq!(ids.len(), 3);
    }
    let after = runner.backend().stream_stats().unwrap();
    println!("LZ-{tag}-LAYERS: {}", params.num_layers);
    println!("LZ-{tag}-RECORDINGS: {}", runner.num_recordings());
    println!("LZ-{tag}-REPLAYS: {}", after.replays - before.replays);
    println!("LZ-{tag}-LISTS-CREATED: {}", created(HandleKind::CommandList) - lists);
    println!("LZ-{tag}-ALLOCATIONS: {}", created(HandleKind::DeviceMemory) - memory);
    println!("LZ-{tag}-POOL-PEAK-GROWTH: {}", runner.backend().memory_usage().2 - pool.2);
    let appends = after.appended - before.appended;
    println!("LZ-{tag}-APPENDS-PER-STEP: {}", appends as f64 / 100.0);
}

fn created(kind: HandleKind) -> u64 {
    handle_counts().kinds.iter().find(|(k, _, _)| *k == kind).map_or(0, |(_, c, _)| *c)
}

fn recorded_steps_in_child() {
    recorded_steps_of(&rserve_tests::smollm2_gguf(), "SMOLLM2");
    recorded_steps_of(&rserve_tests::models_dir().join("tiny/qwen3"), "QWEN3");
    println!("LZ-COMPONENTS: {}", loader_components().unwrap().join(", "));
    println!("LZ-COUNTS: {}", handle_counts());
}

#[test]
fn decode_steps_replay_a_recorded_command_list() {
    if lz::in_child() {
        return recorded_steps_in_child();
    }
    let mut env = lz::null_driver_env();
    env.push(("RSERVE_ZE_MODULE_FORMAT".into(), "native".into()));
    let out = lz::run_child("decode_steps_replay_a_recorded_command_list", &env);
    let text = lz::text(&out);
    assert!(out.status.success(), "the child failed:\n{text}");
    let components = lz::reported(&text, "LZ-COMPONENTS").unwrap_or_else(|| panic!("{text}"));
    assert!(components.contains("validation layer"), "the validation layer is not loaded: {components}");
    assert!(!text.contains("ZE_RESULT_ERROR"), "a Level Zero call failed:\n{text}");
    let number = |key: &str| lz::number(&text, key);
    for tag in ["SMOLLM2", "QWEN3"] {
        // One recording (one batch shape, one partition count), replayed by every one of the 100 steps ...
        assert_eq!(number(&format!("LZ-{tag}-RECORDINGS")), 1.0, "{text}");
        assert_eq!(number(&format!("LZ-{tag}-REPLAYS")), 100.0, "{text}");
        // ... with no command list created, no device memory allocated and no pool growth while they ran ...
        assert_eq!(number(&format!("LZ-{tag}-LISTS-CREATED")), 0.0, "{text}");
        assert_eq!(number(&format!("LZ-{tag}-ALLOCATIONS")), 0.0, "{text}");
        assert_eq!(number(&format!("LZ-{tag}-POOL-PEAK-GROWTH")), 0.0, "{text}");
    }
    // ... and the same few appends a step whatever the depth of the model: one copy per step input (ids, positions,
    // query starts, context lengths, last rows, slots and block tables of the model's one KV cache group), the
    // replay's barrier and the ids' read-back.
    assert!(number("LZ-SMOLLM2-LAYERS") > 4.0 * number("LZ-QWEN3-LAYERS"), "{text}");
    assert_eq!(number("LZ-SMOLLM2-APPENDS-PER-STEP"), 9.0, "{text}");
    assert_eq!(number("LZ-QWEN3-APPENDS-PER-STEP"), 9.0, "{text}");
    lz::assert_counts_balanced(&text, false);
}

fn counters_in_child() {
    // The counters of this process start at zero and balance with nothing created.
    let c = handle_counts();
    assert!(c.balanced() && c.total_created() == 0 && c.failed_calls == 0, "{c}");
    let device = Device::select("level-zero").unwrap();
    let live = handle_counts();
    println!("LZ-LIVE: {}", live.live());
    drop(device);
    let after = handle_counts();
    assert!(after.balanced(), "{after}");
    println!("LZ-COUNTS: {after}");
    print_module_builds();
}

#[test]
fn opening_and_closing_the_device_destroys_every_handle() {
    if lz::in_child() {
        return counters_in_child();
    }
    let out = lz::run_child("opening_and_closing_the_device_destroys_every_handle", &lz::null_driver_env());
    let text = lz::text(&out);
    assert!(out.status.success(), "the child failed:\n{text}");
    // Context, command list, event pool, events, modules and kernels were alive while the device was open.
    let live: u64 = lz::reported(&text, "LZ-LIVE").and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{text}"));
    assert!(live > 10, "{text}");
    // The default policy on a device that is no PVC: every module from SPIR-V, no native binary tried.
    assert_eq!(lz::reported(&text, "LZ-MODULES"), Some(modules_line(1, false).as_str()), "{text}");
}

fn auto_in_child() {
    let device = Device::select("auto").unwrap();
    println!("LZ-AUTO: {}", device.name());
}

#[test]
fn auto_keeps_the_cpu_when_the_only_gpu_is_not_intel() {
    if lz::in_child() {
        return auto_in_child();
    }
    // The null driver's device reports vendor id 0, not Intel's 0x8086.
    let out = lz::run_child("auto_keeps_the_cpu_when_the_only_gpu_is_not_intel", &lz::null_driver_env());
    let text = lz::text(&out);
    assert!(out.status.success(), "the child failed:\n{text}");
    let name = lz::reported(&text, "LZ-AUTO").unwrap_or_else(|| panic!("{text}"));
    assert!(name.starts_with("cpu"), "{text}");
}
