//! What `prepare` makes of vLLM command lines: ignored flags dropped with their values and noted once, refused ones
//! stopped with their reason, `Only` values, negations, underscores, short aliases, `-O3`, dotted keys.

use super::*;

fn run(line: &str) -> Result<Prepared, CliError> {
    prepare(crate::cli::normalize_args(line.split_whitespace().map(OsString::from).collect()))
}

fn args(p: &Prepared) -> String {
    p.args.iter().map(|a| a.to_string_lossy().into_owned()).collect::<Vec<_>>().join(" ")
}

#[test]
fn ignored_flags_are_dropped_with_their_values_and_noted_once() {
    let p = run("rserve m --swap-space 4 --port 1 --enable-chunked-prefill --disable-fastapi-docs --swap-space=8 \
                 --ignore-patterns a b --num-scheduler-steps 2")
    .expect("accepted");
    assert_eq!(args(&p), "rserve serve m --port 1");
    let flags: Vec<&str> = p.notices.iter().map(|n| n.flag.as_str()).collect();
    assert_eq!(
        flags,
        [
            "--swap-space",
            "--enable-chunked-prefill",
            "--disable-fastapi-docs",
            "--ignore-patterns",
            "--num-scheduler-steps"
        ]
    );
    assert!(p.notices[0].to_string().starts_with("Ignoring --swap-space: no CPU swap space"));
}

#[test]
fn refused_flags_stop_with_their_reason() {
    let e = run("rserve m --lora-modules a=b").expect_err("refused");
    assert_eq!(e.to_string(), "--lora-modules is not supported by rserve: LoRA adapters are not supported yet");
    // The negation asks for what rserve does anyway.
    let p = run("rserve m --disable-lora").expect("accepted");
    assert_eq!(p.notices[0].flag, "--disable-lora");
}

#[test]
fn only_values_pass_silently_and_others_are_refused() {
    let p = run("rserve m --decode-context-parallel-size 1 -dcp=1 --scheduling-policy fcfs").expect("accepted");
    assert_eq!(args(&p), "rserve serve m");
    assert!(p.notices.is_empty());
    let e = run("rserve m -dcp 2").expect_err("refused");
    assert!(matches!(&e, CliError::RefusedValue { flag, value, .. } if flag == "-dcp" && value == "2"), "{e}");
    assert!(e.to_string().starts_with("-dcp 2 is not supported by rserve: context parallelism"));
}

#[test]
fn data_parallel_size_is_a_flag_with_its_short_spelling() {
    let p = run("rserve m -dp 2").expect("accepted");
    assert_eq!(args(&p), "rserve serve m --data-parallel-size 2");
    let p = run("rserve m -dp=4").expect("accepted");
    assert_eq!(args(&p), "rserve serve m --data-parallel-size=4");
}

#[test]
fn spellings_become_claps() {
    let p = run("rserve m --max_model_len 2k -q gguf --device-memory-utilization=0.5 -O3 --compilation-config.mode 3")
        .expect("accepted");
    assert_eq!(args(&p), "rserve serve m --max-model-len 2k --quantization gguf --gpu-memory-utilization=0.5");
    let flags: Vec<&str> = p.notices.iter().map(|n| n.flag.as_str()).collect();
    assert_eq!(flags, ["--optimization-level", "--compilation-config.mode"]);
}

#[test]
fn negations_clap_lacks_cancel_the_switch() {
    let p = run("rserve m --enforce-eager --no-enforce-eager --disable-log-requests").expect("accepted");
    assert_eq!(args(&p), "rserve serve m");
    let p = run("rserve m --disable-uvicorn-access-log --enable-uvicorn-access-log --disable-prefix-caching")
        .expect("accepted");
    assert_eq!(args(&p), "rserve serve m --disable-prefix-caching");
}

#[test]
fn values_of_implemented_flags_are_not_taken_for_flags() {
    let p = run("rserve m --api-key -secret --served-model-name a b --swap-space 1").expect("accepted");
    assert_eq!(args(&p), "rserve serve m --api-key -secret --served-model-name a b");
}

#[test]
fn other_commands_pass_through() {
    let p = run("rserve generate m --prompt hi --swap-space 4").expect("unchanged");
    assert_eq!(args(&p), "rserve generate m --prompt hi --swap-space 4");
}
