//! The table against vLLM's flags (the fixture generated from vLLM's parser) and against clap: every vLLM flag is
//! classified, every row is a vLLM flag or marked as legacy / rserve-only, implemented rows are clap arguments and
//! clap has no argument the table does not list. Then every spelling of every vLLM flag, with a harmless value, goes
//! through the real command-line parser: none may end in a clap usage error (exit code 2).

use super::*;
use crate::cli::{clap_knows, compat, normalize_args, serve_clap_names, Cli, CliError};
use clap::Parser;
use serde_json::Value;
use std::collections::HashSet;
use std::ffi::OsString;

fn fixture() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/vllm/serve_flags.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("fixture JSON")
}

fn fixture_flags(v: &Value) -> Vec<&Value> {
    v["flags"].as_array().expect("flags").iter().collect()
}

fn names(flag: &Value) -> Vec<&str> {
    flag["names"].as_array().expect("names").iter().map(|n| n.as_str().expect("name")).collect()
}

fn arity(flag: &Value) -> Arity {
    if !flag["takes_value"].as_bool().expect("takes_value") {
        return Arity::Switch;
    }
    match (flag["nargs"].as_str(), flag["action"].as_str()) {
        (Some("+" | "*"), _) | (_, Some("_AppendAction")) => Arity::Many,
        (Some("?"), _) => Arity::Optional,
        _ => Arity::One,
    }
}

#[test]
fn every_vllm_flag_is_classified_with_its_spellings() {
    let fx = fixture();
    let mut missing = Vec::new();
    for flag in fixture_flags(&fx) {
        let names = names(flag);
        match FLAGS.iter().find(|f| f.names[0] == names[0]) {
            None => missing.push(names[0].to_owned()),
            Some(row) => {
                assert_eq!(row.names, names.as_slice(), "spellings of {}", names[0]);
                assert_eq!(row.arity, arity(flag), "arity of {}", names[0]);
                assert_eq!(row.origin, Origin::Vllm, "{} is a flag of vLLM {}", names[0], fx["vllm_version"]);
            }
        }
    }
    assert!(missing.is_empty(), "vLLM {} flags missing from vllm_flags::FLAGS: {missing:?}", fx["vllm_version"]);
}

#[test]
fn every_row_is_a_vllm_flag_or_marked() {
    let fx = fixture();
    let vllm: HashSet<&str> = fixture_flags(&fx).iter().flat_map(|f| names(f)).collect();
    let mut seen = HashSet::new();
    for row in FLAGS {
        for name in row.names {
            assert!(seen.insert(*name), "{name} appears twice in the table");
            let in_vllm = vllm.contains(name);
            match row.origin {
                Origin::Vllm => assert!(in_vllm, "{name} is marked as vLLM's but vLLM {} lacks it", fx["vllm_version"]),
                Origin::VllmLegacy | Origin::Rserve => {
                    assert!(!in_vllm, "{name} is a current vLLM flag: mark it Origin::Vllm")
                }
            }
        }
        if let Support::Only(values, _) = row.support {
            assert!(!values.is_empty() && row.arity == Arity::One, "{}: Only needs one value", row.names[0]);
        }
    }
}

#[test]
fn implemented_rows_are_exactly_the_clap_arguments() {
    for row in FLAGS.iter().filter(|f| f.support == Support::Implemented) {
        assert!(clap_knows(row.names[0]), "{} is marked implemented but `serve` has no such argument", row.names[0]);
    }
    for name in serve_clap_names() {
        let row = lookup(name).unwrap_or_else(|| panic!("clap's {name} is not in vllm_flags::FLAGS"));
        assert_eq!(row.support, Support::Implemented, "clap implements {name}: mark it Implemented");
    }
}

/// A value each flag accepts: its first choice, its default, else "1".
fn sample(flag: &Value) -> Vec<String> {
    if let Some(choice) =
        flag["choices"].as_array().and_then(|c| c.iter().filter_map(Value::as_str).find(|c| *c != "None"))
    {
        return vec![choice.to_owned()];
    }
    let many = arity(flag) == Arity::Many;
    match &flag["default"] {
        Value::String(s) if !s.is_empty() => vec![s.clone()],
        Value::Number(n) => vec![n.to_string()],
        Value::Array(items) if many && !items.is_empty() => {
            items.iter().map(|i| i.as_str().map(str::to_owned).unwrap_or_else(|| i.to_string())).collect()
        }
        v @ (Value::Array(_) | Value::Object(_)) if !many => vec![v.to_string()],
        _ => vec!["1".to_owned()],
    }
}

/// Values rserve restricts where vLLM takes any string (a registry name).
fn rserve_sample(name: &str) -> Option<String> {
    match name {
        "--tool-call-parser" => Some("hermes".into()),
        "--reasoning-parser" => Some("qwen3".into()),
        "--default-chat-template-kwargs" => Some("{}".into()),
        "--config" => {
            let path = std::env::temp_dir().join(format!("rserve-sample-{}.yaml", std::process::id()));
            std::fs::write(&path, "port: 8001\n").expect("sample config");
            Some(path.display().to_string())
        }
        _ => None,
    }
}

#[test]
fn every_vllm_spelling_parses_without_a_usage_error() {
    let fx = fixture();
    let mut failures = Vec::new();
    let mut refused = 0;
    for flag in fixture_flags(&fx) {
        for name in names(flag) {
            let mut line = vec!["rserve".to_owned(), "serve".to_owned(), "m".to_owned(), name.to_owned()];
            let switch = arity(flag) == Arity::Switch;
            if !switch {
                match rserve_sample(name) {
                    Some(v) => line.push(v),
                    None => line.extend(sample(flag)),
                }
            }
            let args: Vec<OsString> = line.iter().map(OsString::from).collect();
            match compat::prepare(normalize_args(args)) {
                Err(CliError::Refused { .. } | CliError::RefusedValue { .. }) => refused += 1,
                Err(e) => failures.push(format!("{}: {e}", line.join(" "))),
                Ok(p) => {
                    if let Err(e) = Cli::try_parse_from(p.args) {
                        failures.push(format!("{}: {}", line.join(" "), e.kind()));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} spellings fail to parse:\n{}", failures.len(), failures.join("\n"));
    assert!(refused > 0);
}
