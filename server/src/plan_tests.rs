//! `rserve plan` through the command line: flags parse (with vLLM's -tp / -pp spellings), the 405B worked example
//! of issue 7 comes out of the rendered table and of `--json`, and bad flags are errors, not panics.

use std::ffi::OsString;

use crate::cli::{normalize_args, Cli, Command};

use super::PlanArgs;

fn fixture(name: &str) -> String {
    format!("{}/../tests/fixtures/configs/{name}.json", env!("CARGO_MANIFEST_DIR"))
}

fn parse(line: &str) -> PlanArgs {
    let argv: Vec<OsString> = line.split_whitespace().map(OsString::from).collect();
    match <Cli as clap::Parser>::try_parse_from(normalize_args(argv)).expect("parses").command {
        Command::Plan(p) => p,
        other => panic!("not plan: {other:?}"),
    }
}

#[test]
fn plan_is_a_subcommand_with_its_flags() {
    let p = parse(&format!("rserve plan {} --max-model-len 128K -tp 8 -pp 2 --json", fixture("llama31_405b")));
    assert_eq!(p.max_model_len, Some(131072));
    assert_eq!((p.tp, p.pp), (Some(8), Some(2)));
    assert!(p.json);
    let p = parse("rserve plan m --device-memory 80g --kv-cache-dtype fp8");
    assert_eq!(p.device_memory, Some(80_000_000_000));
    assert_eq!(p.kv_cache_dtype, "fp8");
    let argv: Vec<OsString> =
        "rserve plan m --device-profile cpu --device-memory 1g".split_whitespace().map(OsString::from).collect();
    assert!(<Cli as clap::Parser>::try_parse_from(normalize_args(argv)).is_err(), "profile and memory conflict");
}

#[test]
fn the_405b_table_shows_the_worked_example() {
    let text = parse(&format!("rserve plan {} --max-model-len 131072", fixture("llama31_405b"))).render().unwrap();
    for needle in [
        "405.85 B",
        "811.7 GB",
        "67.6 GB",
        "ceil(879.4 GB / 61.8 GB)",
        "TP=8 x PP=2",
        "177.9 GB",
        "Maximum concurrency for 131072 tokens per request: 2.63x",
    ] {
        assert!(text.contains(needle), "missing `{needle}` in:\n{text}");
    }
    let requests = text.lines().find(|l| l.trim_start().starts_with("full-context requests")).expect("requests line");
    assert!(requests.split_whitespace().nth(2) == Some("2"), "{requests}");
}

#[test]
fn json_output_is_machine_readable() {
    let out = parse(&format!("rserve plan {} --json", fixture("llama31_70b"))).render().unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["valid_tp"], serde_json::json!([1, 2, 4, 8]));
    assert_eq!(v["shape"]["num_heads"], 64);
    assert_eq!(v["shape"]["num_kv_heads"], 8);
    assert!(v["lines"].as_array().unwrap().iter().all(|l| l["formula"].as_str().is_some_and(|f| !f.is_empty())));
}

#[test]
fn bad_flags_are_errors() {
    let err = |line: String| parse(&line).render().unwrap_err().to_string();
    let f = fixture("llama31_70b");
    assert!(format!("{:#}", parse(&format!("rserve plan {f} --dtype int3")).render().unwrap_err()).contains("--dtype"));
    assert!(format!("{:#}", parse(&format!("rserve plan {f} -tp 12")).render().unwrap_err()).contains("inside a node"));
    assert!(err("rserve plan /no/such/model/dir".into()).contains("/no/such/model/dir"));
}

#[test]
fn the_table_shows_the_data_parallel_layout_of_a_node() {
    // 8B on a 12-tile Aurora node: one tile per replica, twelve replicas.
    let text = parse(&format!("rserve plan {} --max-model-len 8192", fixture("llama31_8b_instruct"))).render().unwrap();
    assert!(text.contains("data parallel on one node (12 devices): 12 replicas of TP=1 x PP=1"), "{text}");
    assert!(text.contains("-dp 12"), "{text}");
    // 405B: a replica spans two nodes.
    let text = parse(&format!("rserve plan {} -tp 8 -pp 2", fixture("llama31_405b"))).render().unwrap();
    assert!(text.contains("takes 16 devices (2 nodes); -dp N runs N of them as one job of N x 16 MPI ranks"), "{text}");
}

#[test]
fn dp_with_tp_lays_out_each_replicas_mpi_ranks() {
    // -dp 2 -tp 2: one job of 4 ranks on one node, replica-major.
    let text = parse(&format!("rserve plan {} -dp 2 -tp 2", fixture("llama31_8b_instruct"))).render().unwrap();
    assert!(text.contains("data parallel: 2 replicas of TP=2 x PP=1, 4 devices on 1 node(s)"), "{text}");
    assert!(text.contains("mpiexec -n 4 "), "{text}");
    assert!(text.contains("-dp 2 -tp 2\n"), "{text}");
    assert!(
        text.contains("replica 0: ranks 0-1 on node 0") && text.contains("replica 1: ranks 2-3 on node 0"),
        "{text}"
    );
    // Without -dp, a node of 12 tiles holds 6 replicas of TP=2, started the same way.
    let text = parse(&format!("rserve plan {} -tp 2", fixture("llama31_8b_instruct"))).render().unwrap();
    assert!(text.contains("data parallel on one node (12 devices): 6 replicas of TP=2 x PP=1"), "{text}");
    assert!(text.contains("mpiexec -n 12 ") && text.contains("replica 5: ranks 10-11 on node 0"), "{text}");
    // TP groups never straddle nodes: TP=8 on 12-tile nodes places 8 ranks per node.
    let text = parse(&format!("rserve plan {} -tp 8 -pp 2 -dp 2", fixture("llama31_405b"))).render().unwrap();
    assert!(text.contains("32 devices on 4 node(s) (8 ranks of 12 devices each)"), "{text}");
    assert!(text.contains("mpiexec -n 32 --ppn 8 "), "{text}");
    assert!(
        text.contains("replica 1: ranks 16-31 on nodes 2-3 (stage 0: ranks 16-23, stage 1: ranks 24-31)"),
        "{text}"
    );
    assert!(format!(
        "{:#}",
        parse(&format!("rserve plan {} -dp 0", fixture("llama31_8b_instruct"))).render().unwrap_err()
    )
    .contains("--dp"));
}
