//! Tests of the command line: argv normalisation, vLLM's flag spellings, human-readable numbers, and every flag
//! value that must be refused at start-up.

use super::*;

fn args(line: &str) -> Vec<OsString> {
    line.split_whitespace().map(OsString::from).collect()
}

fn parse_line(line: &str) -> Result<Cli, clap::Error> {
    Cli::try_parse_from(normalize_args(args(line)))
}

fn serve(line: &str) -> ServeArgs {
    match parse_line(line).expect("parses").command {
        Command::Serve(s) => s,
        other => panic!("not serve: {other:?}"),
    }
}

#[test]
fn bare_model_means_serve() {
    let s = serve("rserve /m/x.gguf --port 9000");
    assert_eq!(s.model_tag.as_deref(), Some("/m/x.gguf"));
    assert_eq!(s.frontend.port, 9000);
    let s = serve("rserve serve Org/Model --host 127.0.0.1");
    assert_eq!(s.model_tag.as_deref(), Some("Org/Model"));
    assert_eq!(s.frontend.host, "127.0.0.1");
    let s = serve("rserve --model Org/M");
    assert_eq!(s.engine.resolve_model(s.model_tag.as_deref()).as_deref(), Ok("Org/M"));
    let s = serve("rserve --port 1");
    assert_eq!(s.engine.resolve_model(s.model_tag.as_deref()), Err(CliError::NoModel));
    assert!(matches!(parse_line("rserve generate m --prompt hi").expect("parses").command, Command::Generate(_)));
    assert!(matches!(parse_line("rserve convert a.gguf out").expect("parses").command, Command::Convert(_)));
}

#[test]
fn vllm_defaults() {
    let s = serve("rserve m");
    assert_eq!(s.frontend.port, 8000);
    assert_eq!(s.frontend.host, "0.0.0.0");
    assert_eq!(s.engine.cache.gpu_memory_utilization, 0.9);
    assert_eq!(s.engine.cache.block_size, 16);
    assert_eq!(s.engine.scheduler.max_num_seqs, 256);
    let cfg = s.engine.engine_config("m", 7).expect("valid");
    assert!(cfg.enable_prefix_caching);
    assert_eq!(cfg.max_waiting, 7);
    assert_eq!(cfg.dtype, DTypeArg::Auto);
    assert_eq!(s.served_model_names("m").expect("names"), vec!["m".to_string()]);
}

#[test]
fn flags_reach_the_engine_config() {
    let s = serve(
        "rserve m --dtype half --max-model-len 2k --kv-cache-memory-bytes 1G --max-num-seqs 4 \
         --max-num-batched-tokens 512 --block-size 32 --no-enable-prefix-caching --seed 7 --revision r \
         --generation-config vllm --chat-template t.jinja --device cpu --served-model-name a b \
         --enforce-eager --trust-remote-code --distributed-executor-backend mp -tp 1 -pp=1",
    );
    let cfg = s.engine.engine_config("m", 1).expect("valid");
    assert_eq!(cfg.dtype, DTypeArg::Float16);
    assert_eq!(cfg.max_model_len, Some(2000));
    assert_eq!(cfg.kv_cache_memory_bytes, Some(1 << 30));
    assert_eq!(cfg.max_num_seqs, 4);
    assert_eq!(cfg.max_num_batched_tokens, Some(512));
    assert_eq!(cfg.block_size, 32);
    assert!(!cfg.enable_prefix_caching);
    assert_eq!(cfg.seed, 7);
    assert_eq!(cfg.revision.as_deref(), Some("r"));
    assert_eq!(cfg.generation_config, "vllm");
    assert_eq!(cfg.chat_template.as_deref(), Some("t.jinja"));
    assert_eq!(cfg.device, "cpu");
    assert_eq!(s.served_model_names("m").expect("names"), vec!["a".to_string(), "b".to_string()]);
    let s = serve("rserve m --no-enable-prefix-caching --enable-prefix-caching");
    assert!(s.engine.engine_config("m", 1).expect("valid").enable_prefix_caching);
}

#[test]
fn cpu_weights_are_packed_unless_the_reference_is_asked_for() {
    let packed = |line: &str| serve(line).engine.engine_config("m", 1).expect("valid").cpu_packed_weights;
    assert!(packed("rserve m"), "packed GGUF weights are the CPU's default");
    assert!(packed("rserve m --cpu-packed-weights"), "the old opt-in flag is still accepted");
    assert!(!packed("rserve m --cpu-dequantize-weights"));
    // The later of the two wins, so a wrapper's default can be overridden by a flag added after it.
    assert!(packed("rserve m --cpu-dequantize-weights --cpu-packed-weights"));
    assert!(!packed("rserve m --cpu-packed-weights --cpu-dequantize-weights"));
}

#[test]
fn api_key_from_flag() {
    let s = serve("rserve m --api-key sk-1");
    assert_eq!(s.frontend.api_key, ["sk-1"]);
    // vLLM takes several keys; a request may carry any of them.
    let s = serve("rserve m --api-key sk-1 sk-2 --port 1");
    assert_eq!(s.frontend.api_key, ["sk-1", "sk-2"]);
}

#[test]
fn cpu_threads_and_a_16_bit_kv_cache_reach_the_engine_config() {
    let s = serve("rserve m --cpu-threads 1 --kv-cache-dtype bfloat16");
    let cfg = s.engine.engine_config("m", 1).expect("valid");
    assert_eq!((cfg.cpu_threads, cfg.kv_cache_dtype.as_str()), (Some(1), "bfloat16"));
    let cfg = serve("rserve m").engine.engine_config("m", 1).expect("valid");
    assert_eq!((cfg.cpu_threads, cfg.kv_cache_dtype.as_str()), (None, "auto"));
}

#[test]
fn unsupported_values_are_start_up_errors() {
    let cases: &[(&str, CliError)] = &[
        ("rserve m -tp 0", CliError::ZeroParallel("tensor-parallel-size")),
        ("rserve m --kv-cache-dtype fp8", CliError::KvCacheDtype("fp8".into())),
        ("rserve m --kv-cache-dtype int8", CliError::KvCacheDtype("int8".into())),
        ("rserve m --cpu-threads 0", CliError::ZeroParallel("cpu-threads")),
        ("rserve m --device tpu", CliError::Device("tpu".into())),
        ("rserve m --gpu-memory-utilization 1.5", CliError::MemoryUtilization(1.5)),
        ("rserve m --gpu-memory-utilization 0", CliError::MemoryUtilization(0.0)),
        ("rserve m --block-size 24", CliError::BlockSize(24)),
        ("rserve m --max-num-seqs 0", CliError::MaxNumSeqs),
        ("rserve m --max-model-len 0", CliError::ZeroLength("max-model-len")),
        ("rserve m --max-num-batched-tokens 0", CliError::ZeroLength("max-num-batched-tokens")),
        ("rserve m --load-format pt", CliError::LoadFormat("pt".into())),
        ("rserve m --quantization awq", CliError::Quantization { value: "awq".into() }),
        ("rserve m --quantization gguf", CliError::Quantization { value: "gguf".into() }),
        ("rserve m --max-logprobs -2", CliError::MaxLogprobs(-2)),
    ];
    for (line, want) in cases {
        let s = serve(line);
        assert_eq!(s.engine.engine_config("m", 1).unwrap_err(), *want, "{line}");
    }
    // -tp/-pp reach the engine, which checks them against the MPI launch; ray is refused with the mpiexec line.
    let cfg = serve("rserve m -tp 3 -pp 2").engine.engine_config("m", 1).unwrap();
    assert_eq!((cfg.tensor_parallel_size, cfg.pipeline_parallel_size), (3, 2));
    let e = serve("rserve m -tp 2 --distributed-executor-backend ray").engine.engine_config("m", 1).unwrap_err();
    assert!(matches!(&e, CliError::ExecutorBackend(b, line) if b == "ray" && line.starts_with("mpiexec -n 2 ")), "{e}");
    assert!(serve("rserve m --shutdown-timeout=-1").shutdown_timeout().is_err());
    assert!(parse_line("rserve m --dtype int3").is_err());
    assert!(parse_line("rserve m --uvicorn-log-level loud").is_err());
}

#[test]
fn human_readable_ints() {
    assert_eq!(parse_human_int("4096"), Ok(4096));
    assert_eq!(parse_human_int("1k"), Ok(1000));
    assert_eq!(parse_human_int("1K"), Ok(1024));
    assert_eq!(parse_human_int("25.6k"), Ok(25600));
    assert_eq!(parse_human_int("2G"), Ok(2 << 30));
    assert_eq!(parse_human_int("1.5m"), Ok(1_500_000));
    assert!(parse_human_int("1.5K").is_err());
    assert!(parse_human_int("k").is_err());
    assert!(parse_human_int("-1").is_err());
    assert!(parse_human_int("").is_err());
}

#[test]
fn help_groups_flags_like_vllm() {
    let mut cmd = <Cli as clap::CommandFactory>::command();
    let serve = cmd.find_subcommand_mut("serve").expect("serve");
    let help = serve.render_help().to_string();
    for heading in ["ModelConfig:", "CacheConfig:", "ParallelConfig:", "SchedulerConfig:", "DeviceConfig:", "Frontend:"]
    {
        assert!(help.contains(heading), "missing {heading} in\n{help}");
    }
    let model_section = help.split("ModelConfig:").nth(1).expect("section");
    assert!(model_section.split("CacheConfig:").next().expect("section").contains("--max-model-len"));
}

#[test]
fn convert_dtypes() {
    let c = |d: &str| ConvertArgs { gguf: "a".into(), out_dir: "b".into(), dtype: d.into() }.candle_dtype();
    assert_eq!(c("float32"), Ok(candle_core::DType::F32));
    assert_eq!(c("bf16"), Ok(candle_core::DType::BF16));
    assert_eq!(c("half"), Ok(candle_core::DType::F16));
    assert!(c("q4").is_err());
}

#[test]
fn front_flags_as_vllm_takes_them() {
    let s = serve("rserve m");
    assert_eq!(s.frontend.allowed_origins, JsonList(vec![]), "vLLM: cross-origin access is off by default");
    assert_eq!(s.frontend.allowed_methods, JsonList(vec!["*".into()]));
    assert_eq!(s.frontend.allowed_headers, JsonList(vec!["*".into()]));
    assert_eq!((s.frontend.ssl_cert_reqs, s.root_path()), (0, Ok(None)));
    assert_eq!(s.engine.testing_fail_engine_after_requests, None);
    let s =
        serve(r#"rserve m --allowed-origins ["https://a.example","http://b"] --allow-credentials --root-path /api"#);
    assert_eq!(s.frontend.allowed_origins.0, ["https://a.example", "http://b"]);
    assert!(s.frontend.allow_credentials);
    assert_eq!(s.root_path(), Ok(Some("/api".into())));
    assert_eq!(serve("rserve m --root-path /").root_path(), Ok(None));
    assert!(matches!(serve("rserve m --root-path api").root_path(), Err(CliError::RootPath(_))));
    assert!(matches!(serve("rserve m --root-path /api/").root_path(), Err(CliError::RootPath(_))));
    assert!(parse_line("rserve m --allowed-origins http://a").is_err(), "not a JSON list");
    assert!(parse_line("rserve m --ssl-cert-reqs 3").is_err());
    let s = serve("rserve m --testing-fail-engine-after-requests 2");
    let cfg = s.engine.engine_config("m", 8).expect("config");
    assert_eq!(cfg.testing_fail_after_requests, Some(2));
}

#[test]
fn a_flag_given_twice_takes_its_last_value_like_argparse() {
    let s = serve("rserve m --port 1 --load-format dummy --served-model-name a b --port 2 --load-format auto --served-model-name c");
    assert_eq!(s.frontend.port, 2);
    assert_eq!(s.engine.device.load_format, "auto");
    assert_eq!(s.engine.model.served_model_name, ["c"]);
}

#[test]
fn load_download_and_logprob_flags_reach_the_engine_config() {
    let s = serve(
        "rserve m.gguf --load-format safetensors --quantization gguf --download-dir /cache --hf-token hf_x \
         --tokenizer org/tok --tokenizer-revision v1 --max-logprobs -1",
    );
    let cfg = s.engine.engine_config("m.gguf", 1).expect("valid");
    assert_eq!(cfg.load_format, "auto", "the checkpoint's own formats all mean auto");
    assert_eq!(cfg.download_dir.as_deref(), Some(std::path::Path::new("/cache")));
    assert_eq!(cfg.resolve_options().cache_dir, std::path::Path::new("/cache"));
    assert_eq!(cfg.resolve_options().token.as_deref(), Some("hf_x"));
    assert_eq!((cfg.tokenizer.as_deref(), cfg.tokenizer_revision.as_deref()), (Some("org/tok"), Some("v1")));
    assert_eq!(cfg.max_logprobs, None, "-1: the vocabulary");
    let cfg = serve("rserve m --load-format dummy --hf-token").engine.engine_config("m", 1).expect("valid");
    assert_eq!((cfg.load_format.as_str(), cfg.hf_token.as_deref(), cfg.max_logprobs), ("dummy", Some(""), Some(20)));
}

#[test]
fn partial_prefill_flags_reach_the_engine_config() {
    let s =
        serve("rserve m --max-num-partial-prefills 4 --max-long-partial-prefills 2 --long-prefill-token-threshold 1k");
    let cfg = s.engine.engine_config("m", 1).expect("valid");
    assert_eq!(
        (cfg.max_num_partial_prefills, cfg.max_long_partial_prefills, cfg.long_prefill_token_threshold),
        (Some(4), Some(2), Some(1000))
    );
    let cfg = serve("rserve m").engine.engine_config("m", 1).expect("valid");
    assert_eq!(
        (cfg.max_num_partial_prefills, cfg.max_long_partial_prefills, cfg.long_prefill_token_threshold),
        (None, None, None)
    );
}

#[test]
fn api_keys_come_from_the_flag_and_the_key_file() {
    let dir = std::env::temp_dir().join(format!("rserve-api-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("keys");
    std::fs::write(&file, "# ops keys\nsk-file-1\n\n  sk-file-2  \n").unwrap();
    let s = serve(&format!("rserve m --api-key sk-flag --api-key-file {}", file.display()));
    assert_eq!(s.frontend.api_keys().unwrap(), ["sk-flag", "sk-file-1", "sk-file-2"]);
    // An empty or missing file is an error that names the file, not a server without keys.
    std::fs::write(&file, "# nothing\n\n").unwrap();
    let e = serve(&format!("rserve m --api-key-file {}", file.display())).frontend.api_keys().unwrap_err();
    assert!(e.to_string().contains("holds no key"), "{e}");
    let missing = dir.join("missing");
    let e = serve(&format!("rserve m --api-key-file {}", missing.display())).frontend.api_keys().unwrap_err();
    assert!(e.to_string().contains("cannot read") && e.to_string().contains("missing"), "{e}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn pooling_flags_reach_the_engine_config() {
    use rserve_engine::engine::{ConvertChoice, RunnerChoice};
    let choice = |line: &str| {
        let cfg = serve(line).engine.engine_config("m", 1).expect("valid");
        (cfg.runner, cfg.convert)
    };
    assert_eq!(choice("rserve m"), (RunnerChoice::Auto, ConvertChoice::Auto));
    assert_eq!(choice("rserve m --runner pooling --convert embed"), (RunnerChoice::Pooling, ConvertChoice::Embed));
    assert_eq!(choice("rserve m --runner generate --convert none"), (RunnerChoice::Generate, ConvertChoice::None));
    assert_eq!(choice("rserve m --convert classify"), (RunnerChoice::Auto, ConvertChoice::Classify));
    // The legacy --task, for whichever of the two is left at auto.
    assert_eq!(choice("rserve m --task generate"), (RunnerChoice::Generate, ConvertChoice::Auto));
    assert_eq!(choice("rserve m --task embed"), (RunnerChoice::Pooling, ConvertChoice::Embed));
    assert_eq!(choice("rserve m --task embedding"), (RunnerChoice::Pooling, ConvertChoice::Embed));
    assert_eq!(choice("rserve m --task classify"), (RunnerChoice::Pooling, ConvertChoice::Classify));
    assert_eq!(choice("rserve m --task score"), (RunnerChoice::Pooling, ConvertChoice::Auto));
    assert_eq!(choice("rserve m --task auto"), (RunnerChoice::Auto, ConvertChoice::Auto));
    assert_eq!(choice("rserve m --task embed --convert none"), (RunnerChoice::Pooling, ConvertChoice::None));
    let cfg = serve(r#"rserve m --pooler-config {"pooling_type":"MEAN","normalize":false}"#)
        .engine
        .engine_config("m", 1)
        .expect("valid");
    assert_eq!(cfg.pooler_config.normalize, Some(false));
    assert_eq!(cfg.pooler_config.pooling_type.map(|p| p.as_str()), Some("MEAN"));
    assert_eq!(serve("rserve m").engine.engine_config("m", 1).expect("valid").pooler_config, Default::default());
}

#[test]
fn pooling_flag_values_rserve_does_not_serve_are_refused() {
    let err = |line: &str| serve(line).engine.engine_config("m", 1).unwrap_err();
    assert_eq!(err("rserve m --convert reward"), CliError::Convert("reward".into()));
    assert!(err("rserve m --convert reward").to_string().contains("use auto, none, embed or classify"));
    assert_eq!(err("rserve m --runner draft"), CliError::Runner("draft".into()));
    assert_eq!(err("rserve m --task reward"), CliError::Task("reward".into()));
    assert_eq!(err("rserve m --task transcription"), CliError::Task("transcription".into()));
    let e = err(r#"rserve m --pooler-config {"pooling_type":"FIRST"}"#);
    assert!(matches!(&e, CliError::PoolerConfig(m) if m.contains("pooling_type")), "{e}");
    assert!(matches!(err("rserve m --pooler-config [1]"), CliError::PoolerConfig(_)));
}

#[test]
fn pooling_flags_pass_the_vllm_compatibility_layer() {
    for line in ["rserve m --task embed", "rserve m --runner pooling --convert classify", "rserve m --pooler-config {}"]
    {
        assert!(parse_from(args(line)).is_ok(), "{line}");
    }
}
