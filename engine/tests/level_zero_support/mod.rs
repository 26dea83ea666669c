//! Helpers of the Level Zero tests: running one test again in a child process with its own Level Zero environment
//! (the loader reads its variables once, when it is first used), and finding the loader's null driver.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

/// Set in the child process: the test body runs instead of spawning.
pub const CHILD: &str = "RSERVE_LZ_TEST_CHILD";

/// Variables that change what Level Zero does; cleared in every child unless the test sets them.
const ZE_VARS: &[&str] = &[
    "ZE_ENABLE_NULL_DRIVER",
    "ZE_ENABLE_VALIDATION_LAYER",
    "ZE_ENABLE_PARAMETER_VALIDATION",
    "ZE_AFFINITY_MASK",
    "ZE_FLAT_DEVICE_HIERARCHY",
    "RSERVE_ZE_LOADER",
    "RSERVE_ZE_MODULE_FORMAT",
];

pub fn in_child() -> bool {
    std::env::var_os(CHILD).is_some()
}

/// The folder holding `libze_null.so` (`$RSERVE_ZE_NULL_DRIVER_DIR`, else `<repo>/.level-zero/build/lib`); panics
/// with the setup command when it is missing.
pub fn null_driver_dir() -> PathBuf {
    let dir = std::env::var_os("RSERVE_ZE_NULL_DRIVER_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.level-zero/build/lib"));
    assert!(
        dir.join("libze_null.so").exists(),
        "the Level Zero null driver is missing from {}: run `bash scripts/setup.d/30-level-zero.sh` (or set RSERVE_ZE_NULL_DRIVER_DIR)",
        dir.display()
    );
    dir
}

/// The environment of a run on the null driver with the validation layer and parameter validation on.
pub fn null_driver_env() -> Vec<(String, String)> {
    let dir = null_driver_dir();
    let ld = match std::env::var("LD_LIBRARY_PATH") {
        Ok(old) if !old.is_empty() => format!("{}:{old}", dir.display()),
        _ => dir.display().to_string(),
    };
    vec![
        ("ZE_ENABLE_NULL_DRIVER".into(), "1".into()),
        ("ZE_ENABLE_VALIDATION_LAYER".into(), "1".into()),
        ("ZE_ENABLE_PARAMETER_VALIDATION".into(), "1".into()),
        ("LD_LIBRARY_PATH".into(), ld),
    ]
}

/// Runs test `name` of this test binary again in a child process with `env` (and no other Level Zero variables).
pub fn run_child(name: &str, env: &[(String, String)]) -> Output {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", name, "--nocapture", "--test-threads=1"]).env(CHILD, "1");
    for v in ZE_VARS {
        cmd.env_remove(v);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("the test binary runs")
}

/// stdout + stderr of a child.
pub fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// The value the child printed as `PREFIX: value` (the test harness may print its own text before it on the line).
pub fn reported<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    let marker = format!("{prefix}: ");
    text.lines().find_map(|l| l.find(&marker).map(|i| l[i + marker.len()..].trim()))
}

/// The op matrix's Level Zero case: when the null driver is set up, reruns test `name` in a child on it and checks
/// that every call succeeded and the child reported `LZ-OPS: ok`.
pub fn null_driver_case(name: &str) {
    if std::env::var_os("RSERVE_ZE_NULL_DRIVER_DIR").is_none() {
        return;
    }
    let out = run_child(name, &null_driver_env());
    let text = text(&out);
    assert!(out.status.success(), "level zero (null driver) failed:\n{text}");
    assert!(!text.contains("ZE_RESULT_ERROR"), "a Level Zero call failed:\n{text}");
    assert_eq!(reported(&text, "LZ-OPS"), Some("ok"), "{text}");
}

/// The number the child printed as `PREFIX: value`; panics with the child's output when it is missing.
pub fn number(text: &str, prefix: &str) -> f64 {
    reported(text, prefix).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no number {prefix} in:\n{text}"))
}

/// Checks the child's `LZ-COUNTS` line (`Kind created/destroyed` pairs, then `failed_calls N`): no failed call and
/// every kind balanced; with `all_used`, every kind but build logs was created at least once.
pub fn assert_counts_balanced(text: &str, all_used: bool) {
    use rserve_engine::backend::level_zero::HandleKind;
    let counts = reported(text, "LZ-COUNTS").unwrap_or_else(|| panic!("no counts in:\n{text}"));
    let words: Vec<&str> = counts.split_whitespace().collect();
    assert_eq!(words.last(), Some(&"0"), "failed calls: {counts}");
    for kind in HandleKind::ALL {
        let name = format!("{kind:?}");
        let i = words.iter().position(|w| *w == name).unwrap_or_else(|| panic!("{name} missing from {counts}"));
        let (c, d) = words[i + 1].split_once('/').unwrap();
        assert_eq!(c, d, "{name}: created/destroyed {c}/{d} ({counts})");
        if all_used && kind != HandleKind::BuildLog {
            assert_ne!(c, "0", "{name}: nothing was created ({counts})");
        }
    }
}
