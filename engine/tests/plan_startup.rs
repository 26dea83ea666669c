//! `rserve plan` and the server's start-up KV sizing (`engine::budget::plan`, what start.rs logs) give the same
//! numbers for the same inputs: the plan's weights memory equals the bytes the engine actually loads, and the KV
//! budget, blocks and concurrency agree for a device of given memory and for an exact `--kv-cache-memory-bytes`.

use candle_core::DType;
use rserve_engine::config::gguf_meta::params_from_gguf_file;
use rserve_engine::engine::budget;
use rserve_engine::plan::{self, DTypeChoice, DeviceChoice, PlanOptions, Precision};
use rserve_engine::source::{resolve_model, ResolveOptions};

fn f32_plan(spec: &str, device: DeviceChoice, kv: Option<u64>, len: usize) -> plan::Plan {
    plan_with(spec, Precision::Float32, device, kv, len)
}

fn plan_with(spec: &str, dtype: Precision, device: DeviceChoice, kv: Option<u64>, len: usize) -> plan::Plan {
    let opts = PlanOptions {
        dtype: DTypeChoice::Fixed(dtype),
        kv_cache_dtype: DTypeChoice::Fixed(Precision::Float32),
        device,
        kv_cache_memory_bytes: kv,
        max_model_len: Some(len),
        ..PlanOptions::default()
    };
    plan::plan_model(spec, &opts, &ResolveOptions::with_cache_dir("/nonexistent")).unwrap()
}

#[test]
fn plan_weights_equal_the_loaded_weights() {
    let gguf = rserve_tests::smollm2_gguf();
    let spec = gguf.to_str().unwrap();
    let resolved = resolve_model(spec, &ResolveOptions::with_cache_dir("/nonexistent")).unwrap();
    let params = resolved.load_params().unwrap();
    let weights = rserve_engine::weights::load(&resolved, &params, DType::F32).unwrap();
    let p = f32_plan(spec, DeviceChoice::Profile("cpu".into()), None, 8192);
    assert_eq!(p.weights_bytes, weights.total_bytes() as u64, "planned vs loaded weights");
    assert_eq!(p.parameters, weights.param_count() as u64);
}

#[test]
fn plan_and_startup_budget_agree() {
    let gguf = rserve_tests::smollm2_gguf();
    let spec = gguf.to_str().unwrap();
    let params = params_from_gguf_file(&gguf).unwrap();
    // The 800 MB device's 10 % headroom is smaller than one step's activations, so part of them comes out of the KV
    // budget; in bf16 too, whose activations are f32 at start-up like every model's.
    for (dtype, device_memory, kv_exact, len) in [
        (Precision::Float32, Some(2_000_000_000u64), None, 8192usize),
        (Precision::Float32, Some(800_000_000), None, 2048),
        (Precision::BFloat16, Some(800_000_000), None, 2048),
        (Precision::Float32, None, Some(1u64 << 30), 8192),
        (Precision::Float32, None, Some(300_000_000), 4096),
    ] {
        let device = DeviceChoice::Memory(device_memory.unwrap_or(64 << 30));
        let p = plan_with(spec, dtype, device, kv_exact, len);
        let l = p.layout.as_ref().expect("one device holds SmolLM2");
        assert_eq!((l.tp, l.pp), (1, 1));
        let chunk = rserve_scheduler::DEFAULT_MAX_NUM_BATCHED_TOKENS;
        let b = budget::plan(&params, 4, 16, Some(len), kv_exact, 0.9, p.weights_bytes, device_memory, chunk).unwrap();
        assert_eq!(b.kv_bytes, l.kv_bytes_per_device, "KV bytes ({device_memory:?}, {kv_exact:?})");
        assert_eq!(b.num_blocks as u64, l.num_blocks_per_device);
        assert_eq!(b.bytes_per_token as u64, p.kv_bytes_per_token);
        assert_eq!(b.num_tokens(16) as u64, l.kv_tokens);
        assert_eq!(b.max_concurrency(16), l.max_concurrency);
    }
}

#[test]
fn cpu_profile_follows_the_servers_cpu_rule() {
    let gguf = rserve_tests::smollm2_gguf();
    let p = f32_plan(gguf.to_str().unwrap(), DeviceChoice::Profile("cpu".into()), None, 8192);
    assert!(p.device.host);
    let l = p.layout.as_ref().unwrap();
    assert!(l.kv_bytes_per_device <= 4 << 30, "at most 4 GiB without --kv-cache-memory-bytes");
    // Auto dtypes on the CPU profile are the CPU backend's: f32 weights and cache.
    let opts = PlanOptions { device: DeviceChoice::Profile("cpu".into()), ..PlanOptions::default() };
    let auto =
        plan::plan_model(gguf.to_str().unwrap(), &opts, &ResolveOptions::with_cache_dir("/nonexistent")).unwrap();
    assert_eq!((auto.dtype, auto.kv_cache_dtype), (Precision::Float32, Precision::Float32));
}
