//! Table-driven checks of `rserve plan`'s layout numbers on the fixture configs (tests/fixtures/configs/).
//!
//! The Llama-3.1-405B row is the worked example of issue 7 (the hand-sizing guide Aurora users follow): bf16,
//! 131072 tokens, PVC tiles (64 GiB = 68.7 GB), utilization 0.9 -> ~406 B parameters, 812 GB of weights, 67.6 GB
//! of KV per full-context sequence, at least 15 tiles, TP=8 x PP=2, ~177 GB left for KV, 2 full-context requests.
//! The TP rows follow the rule "TP divides the attention heads, inside a node (PVC: 1, 2, 4, 8)", with the
//! 70B example of the issue (64 heads / 8 KV heads -> 1, 2, 4, 8).

use rserve_engine::plan::{self, DTypeChoice, DeviceChoice, Plan, PlanOptions, Precision};
use rserve_engine::source::ResolveOptions;

const GB: f64 = 1e9;

fn plan_of(name: &str, opts: &PlanOptions) -> Plan {
    let path = rserve_tests::fixture(&format!("configs/{name}.json"));
    plan::plan_model(path.to_str().unwrap(), opts, &ResolveOptions::with_cache_dir("/nonexistent"))
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn pvc() -> PlanOptions {
    PlanOptions { device: DeviceChoice::Profile("intel-max-1550-tile".into()), ..PlanOptions::default() }
}

#[test]
fn llama_405b_on_pvc_tiles_matches_the_worked_example() {
    let p = plan_of("llama31_405b", &PlanOptions { max_model_len: Some(131072), ..pvc() });
    assert_eq!(p.dtype, Precision::BFloat16);
    assert_eq!((p.parameters as f64 / 1e9).round(), 406.0, "~406 B parameters");
    assert_eq!((p.weights_bytes as f64 / GB).round(), 812.0, "812 GB of weights");
    assert_eq!((p.kv_bytes_per_sequence as f64 / GB * 10.0).round() / 10.0, 67.6, "67.6 GB per sequence");
    assert_eq!((p.device.memory_bytes as f64 / GB * 10.0).round() / 10.0, 68.7, "a tile is 68.7 GB");
    assert_eq!(p.devices_needed, 15, "at least 15 tiles");
    let l = p.layout.as_ref().expect("a layout");
    assert_eq!((l.tp, l.pp, l.devices), (8, 2, 16), "TP=8 x PP=2");
    let left = l.kv_bytes_total as f64 / GB;
    assert!((177.0..178.0).contains(&left), "about 177 GB left for KV, got {left}");
    assert_eq!(l.activation_reserve_per_device, 0, "activations fit the 10% headroom");
    assert_eq!(l.full_context_requests, 2, "2 concurrent full-context requests");
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);
    assert_eq!(p.valid_tp, vec![1, 2, 4, 8]);
    assert_eq!(p.valid_pp, vec![1, 2, 3, 6, 7, 9, 14, 18, 21, 42, 63, 126]);
}

#[test]
fn the_405b_what_ifs_buy_more_requests() {
    let p = plan_of("llama31_405b", &pvc());
    let chosen = p.layout.as_ref().unwrap();
    let half = &p.shorter_context[0];
    assert_eq!(half.max_model_len, 65536);
    assert_eq!(half.kv_bytes_per_sequence * 2, p.kv_bytes_per_sequence);
    assert!(half.requests_on_chosen_layout.unwrap() >= 2 * chosen.full_context_requests);
    let pp3 = &p.larger_pp[0];
    assert_eq!((pp3.tp, pp3.pp, pp3.devices), (8, 3, 24));
    // 8 more tiles add 8 x 61.8 GB of usable memory, all of it for KV (the weights are already placed).
    let gained = (pp3.kv_bytes_total - chosen.kv_bytes_total) as f64 / GB;
    assert!((8.0 * 61.0..8.0 * 62.0).contains(&gained), "gained {gained} GB");
    assert!(pp3.full_context_requests > chosen.full_context_requests);
}

/// (fixture, attention heads, KV heads, valid TP on a PVC node, TP sizes that split the KV heads)
type TpRow = (&'static str, usize, usize, &'static [usize], &'static [usize]);
const TP_TABLE: &[TpRow] = &[
    ("llama31_70b", 64, 8, &[1, 2, 4, 8], &[1, 2, 4, 8]),
    ("llama31_405b", 128, 8, &[1, 2, 4, 8], &[1, 2, 4, 8]),
    ("llama31_8b_instruct", 32, 8, &[1, 2, 4, 8], &[1, 2, 4, 8]),
    // GQA 7:1 with 28 heads: 8 does not divide 28.
    ("qwen2_7b", 28, 4, &[1, 2, 4], &[1, 2, 4]),
    // 9 heads / 3 KV heads: only TP=1 divides 9 among 1, 2, 4, 8.
    ("smollm2_135m_instruct", 9, 3, &[1], &[1]),
    // MHA: every head is a KV head.
    ("llama2_7b", 32, 32, &[1, 2, 4, 8], &[1, 2, 4, 8]),
    // Gemma-2-9B: 8 KV heads, 16 heads.
    ("gemma2_9b", 16, 8, &[1, 2, 4, 8], &[1, 2, 4, 8]),
];

#[test]
fn valid_tp_sizes_divide_the_heads_inside_a_node() {
    for (name, heads, kv, valid, preferred) in TP_TABLE {
        let p = plan_of(name, &pvc());
        assert_eq!((p.shape.num_heads, p.shape.num_kv_heads), (*heads, *kv), "{name}");
        assert_eq!(p.valid_tp, *valid, "{name}: valid TP");
        assert_eq!(p.preferred_tp, *preferred, "{name}: TP without KV replication");
        assert!(!p.valid_tp.contains(&12), "{name}: never TP=12");
        let layers = p.shape.num_layers;
        assert!(p.valid_pp.iter().all(|pp| layers.is_multiple_of(*pp)), "{name}: PP divides {layers} layers");
    }
}

#[test]
fn kv_per_token_of_gqa_and_mha_models() {
    // GQA shares each KV head among heads / KV heads query heads; MHA keeps one per head.
    let gqa = plan_of("llama31_8b_instruct", &pvc());
    let mha = plan_of("llama2_7b", &pvc());
    assert_eq!(mha.dtype, Precision::Float16, "Llama-2's config dtype");
    // Both have 32 layers x 128 head dim in 2-byte types; 32 vs 8 KV heads.
    assert_eq!(mha.kv_bytes_per_token, 4 * gqa.kv_bytes_per_token);
    assert_eq!(mha.kv_bytes_per_token, 32 * 2 * 32 * 128 * 2, "Llama-2-7B: 0.5 MiB per token");
    assert_eq!(mha.max_model_len, 4096);
}

#[test]
fn seventy_b_fits_four_tiles_at_full_context() {
    // 141.1 GB of weights + 42.9 GB of KV = 184 GB > 3 x 61.8 GB usable? No: 2.98 tiles -> 3 -> TP=4.
    let p = plan_of("llama31_70b", &pvc());
    assert_eq!(p.devices_needed, 3);
    let l = p.layout.unwrap();
    assert_eq!((l.tp, l.pp), (4, 1), "3 tiles round up to TP=4");
    assert!(l.full_context_requests >= 1);
}

#[test]
fn a_given_layout_is_evaluated_and_checked() {
    let p = plan_of("llama31_405b", &PlanOptions { tp: Some(8), pp: Some(3), ..pvc() });
    let l = p.layout.as_ref().unwrap();
    assert_eq!((l.tp, l.pp), (8, 3));
    let p = plan_of("llama31_405b", &PlanOptions { tp: Some(8), pp: Some(1), ..pvc() });
    assert!(!p.layout.as_ref().unwrap().fits());
    assert!(p.warnings.iter().any(|w| w.contains("cannot hold")), "{:?}", p.warnings);

    let path = rserve_tests::fixture("configs/llama31_70b.json");
    let opts = ResolveOptions::with_cache_dir("/nonexistent");
    let err = |o: PlanOptions| plan::plan_model(path.to_str().unwrap(), &o, &opts).unwrap_err().to_string();
    assert!(err(PlanOptions { tp: Some(12), ..pvc() }).contains("inside a node"));
    let e = err(PlanOptions { tp: Some(3), device: DeviceChoice::Memory(80_000_000_000), ..pvc() });
    assert!(e.contains("TP stays inside a node"), "{e}");
    assert!(err(PlanOptions { pp: Some(3), ..pvc() }).contains("does not divide the 80 layers"));
    let qwen = rserve_tests::fixture("configs/qwen2_7b.json");
    let e =
        plan::plan_model(qwen.to_str().unwrap(), &PlanOptions { tp: Some(8), ..pvc() }, &opts).unwrap_err().to_string();
    assert!(e.contains("does not split 28 attention heads"), "{e}");
    assert!(err(PlanOptions { max_model_len: Some(200_000), ..pvc() }).contains("max_position_embeddings"));
    assert!(err(PlanOptions { gpu_memory_utilization: 1.5, ..pvc() }).contains("utilization"));
    assert!(err(PlanOptions { device: DeviceChoice::Profile("tpu".into()), ..pvc() }).contains("unknown"));
}

#[test]
fn latent_attention_warns_and_uses_the_latent_formula() {
    let p = plan_of("deepseek_v2_lite", &pvc());
    assert!(p.warnings.iter().any(|w| w.contains("multi-head latent attention")), "{:?}", p.warnings);
    // 27 layers x (512 + 64) x 2 B: not 27 x 2 x 16 KV heads x head dim.
    assert_eq!(p.kv_bytes_per_token, 27 * (512 + 64) * 2);
    let line = p.lines.iter().find(|l| l.name == "KV bytes per token").unwrap();
    assert!(line.formula.contains("kv_lora_rank"), "{}", line.formula);
    // The latent is replicated on every TP rank: TP does not shrink the per-device KV of a token.
    let l1 = plan_of("deepseek_v2_lite", &PlanOptions { tp: Some(1), pp: Some(1), ..pvc() }).layout.unwrap();
    let l4 = plan_of("deepseek_v2_lite", &PlanOptions { tp: Some(4), pp: Some(1), ..pvc() }).layout.unwrap();
    assert_eq!(l1.kv_bytes_per_token_per_device, l4.kv_bytes_per_token_per_device);
}

#[test]
fn interleaved_sliding_window_warns_with_the_window_aware_size() {
    let p = plan_of("gemma2_9b", &pvc());
    assert_eq!(p.dtype, Precision::BFloat16, "a float32 config is served in bfloat16");
    let w = p.warnings.iter().find(|w| w.contains("sliding-window")).expect("a sliding-window warning");
    assert!(w.contains("interleaved") && w.contains("21 of 42"), "{w}");
    // The plan counts what the cache holds (sliding layers at their window), less than the per-token formula.
    assert_eq!(p.kv_bytes_per_sequence_windowed, Some(p.kv_bytes_per_sequence));
    assert!(p.kv_bytes_per_sequence < p.kv_bytes_per_token * p.max_model_len as u64);
    // Below the window the formula is exact again: no window figure.
    let p = plan_of("gemma2_9b", &PlanOptions { max_model_len: Some(4096), ..pvc() });
    assert_eq!(p.kv_bytes_per_sequence_windowed, None);
}

#[test]
fn standard_models_plan_without_warnings() {
    for name in ["llama31_8b_instruct", "llama31_70b", "llama2_7b", "qwen2_7b", "smollm2_135m_instruct"] {
        let p = plan_of(name, &pvc());
        assert!(p.warnings.is_empty(), "{name}: {:?}", p.warnings);
        let l = p.layout.as_ref().expect("a layout");
        assert!(l.devices >= p.devices_needed && l.fits(), "{name}");
        assert!(p.lines.iter().all(|l| !l.formula.is_empty()), "{name}: every line has its formula");
    }
}

#[test]
fn kv_dtype_and_device_memory_flags() {
    let bf16 = plan_of("llama31_8b_instruct", &pvc());
    let fp8 =
        plan_of("llama31_8b_instruct", &PlanOptions { kv_cache_dtype: DTypeChoice::Fixed(Precision::Fp8), ..pvc() });
    assert_eq!(fp8.kv_bytes_per_token * 2, bf16.kv_bytes_per_token);
    assert_eq!(fp8.weights_bytes, bf16.weights_bytes);
    let h200 =
        plan_of("llama31_8b_instruct", &PlanOptions { device: DeviceChoice::Profile("nvidia-h200".into()), ..pvc() });
    assert_eq!(h200.device.memory_bytes, 143_156 << 20);
    assert_eq!(h200.layout.as_ref().map(|l| (l.tp, l.pp)), Some((1, 1)));
    let custom = plan_of("llama31_8b_instruct", &PlanOptions { device: DeviceChoice::Memory(24_000_000_000), ..pvc() });
    assert_eq!(custom.device.memory_bytes, 24_000_000_000);
    // 16.06 GB weights + 17.18 GB KV = 33.2 GB over 21.6 GB usable devices -> 2.
    assert_eq!(custom.devices_needed, 2);
}

#[test]
fn json_output_round_trips() {
    let p = plan_of("llama31_405b", &pvc());
    let v: serde_json::Value = serde_json::from_str(&p.to_json()).expect("valid JSON");
    assert_eq!(v["layout"]["tp"], 8);
    assert_eq!(v["layout"]["pp"], 2);
    assert_eq!(v["devices_needed"], 15);
    assert_eq!(v["parameters"], p.parameters);
    let text = p.to_text();
    assert!(
        text.contains("TP=8 x PP=2") && text.contains("Maximum concurrency for 131072 tokens per request"),
        "{text}"
    );
}
