//! `--config FILE.yaml`, read as vLLM's `FlexibleArgumentParser` reads it: a YAML mapping whose keys are flag names
//! without `--` (dashes or underscores). Each key becomes command-line tokens: `true` the bare switch, `false` the
//! switch's negation when it has one (else nothing), a list the flag followed by each item, a mapping the flag with
//! the mapping as JSON, anything else the flag and the value as Python's `str()` writes it. The tokens go right
//! after `serve MODEL` (or after `serve` when the model is not on the command line), so that flags on the command
//! line, which come later, win over the file.

use std::ffi::OsString;
use std::path::Path;

use serde_yaml::Value;

use super::vllm_flags;
use super::CliError;

/// Replaces `--config FILE` / `--config=FILE` in `rserve serve ...` by the file's flags.
pub fn expand(args: Vec<OsString>) -> Result<Vec<OsString>, CliError> {
    let is = |a: &OsString, s: &str| a.to_str() == Some(s);
    let found = args.iter().enumerate().find_map(|(i, a)| {
        let s = a.to_str()?;
        if s == "--config" {
            Some((i, 2, args.get(i + 1).map(|p| p.to_string_lossy().into_owned())))
        } else {
            s.strip_prefix("--config=").map(|p| (i, 1, Some(p.to_owned())))
        }
    });
    let Some((index, width, path)) = found else { return Ok(args) };
    let path = path.ok_or(CliError::ConfigFile("--config needs a file name".into()))?;
    if args.iter().skip(index + width).any(|a| is(a, "--config") || a.to_string_lossy().starts_with("--config=")) {
        return Err(CliError::ConfigFile("--config may be given once".into()));
    }
    let from_file = read(Path::new(&path))?;
    // args: [rserve, serve, MODEL?, ...]; the file's flags go after the model positional when there is one.
    let model_in_cli = args.get(2).is_some_and(|a| index != 2 && !a.to_string_lossy().starts_with('-'));
    let at = if model_in_cli { 3 } else { 2 };
    let mut out = Vec::with_capacity(args.len() + from_file.len());
    for (i, a) in args.into_iter().enumerate() {
        if i == at {
            out.extend(from_file.iter().map(OsString::from));
        }
        if i < index || i >= index + width {
            out.push(a);
        }
    }
    if out.len() < at + from_file.len() {
        // Nothing followed the insertion point (the `--config` pair was last): append.
        out.extend(from_file.iter().map(OsString::from));
    }
    Ok(out)
}

/// Reads the file into command-line tokens.
pub fn read(path: &Path) -> Result<Vec<String>, CliError> {
    let shown = path.display();
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    if !matches!(ext, "yaml" | "yml") {
        return Err(CliError::ConfigFile(format!("{shown}: the config file must be .yaml or .yml (vLLM's format)")));
    }
    let text = std::fs::read_to_string(path).map_err(|e| CliError::ConfigFile(format!("cannot read {shown}: {e}")))?;
    let value: Value =
        serde_yaml::from_str(&text).map_err(|e| CliError::ConfigFile(format!("{shown} is not valid YAML: {e}")))?;
    let map = match value {
        Value::Mapping(m) => m,
        Value::Null => return Ok(Vec::new()),
        _ => return Err(CliError::ConfigFile(format!("{shown}: expected a mapping of flag names to values"))),
    };
    let mut tokens = Vec::new();
    for (key, value) in map {
        let key = match key {
            Value::String(s) => s,
            other => python_str(&other),
        };
        let flag = format!("--{key}");
        match value {
            Value::Bool(true) => tokens.push(flag),
            Value::Bool(false) => tokens.extend(negation(&flag)),
            Value::Sequence(items) if items.is_empty() => {}
            Value::Sequence(items) => {
                tokens.push(flag);
                tokens.extend(items.iter().map(python_str));
            }
            Value::Mapping(_) => {
                tokens.push(flag);
                tokens.push(to_json(&value));
            }
            other => {
                tokens.push(flag);
                tokens.push(python_str(&other));
            }
        }
    }
    Ok(tokens)
}

/// `false` for a switch: its negation when it has one (vLLM looks for `--no-KEY`; rserve also knows vLLM's
/// `--disable-x` spellings from the table).
fn negation(flag: &str) -> Option<String> {
    let dashed = flag.replace('_', "-");
    let no = format!("--no-{}", &dashed[2..]);
    if super::clap_knows(&no) || vllm_flags::lookup(&no).is_some() {
        return Some(no);
    }
    let row = vllm_flags::lookup(&dashed)?;
    row.names.iter().find(|n| row.is_negation(n)).map(|n| n.to_string())
}

/// A scalar as Python's `str()` writes it (what vLLM puts on the command line).
fn python_str(v: &Value) -> String {
    match v {
        Value::Null => "None".into(),
        Value::Bool(b) => if *b { "True" } else { "False" }.into(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        other => to_json(other),
    }
}

fn to_json(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(line: &str) -> Vec<OsString> {
        line.split_whitespace().map(OsString::from).collect()
    }

    fn file(name: &str, text: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("rserve-config-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join(name);
        std::fs::write(&path, text).expect("write");
        path
    }

    #[test]
    fn values_become_tokens_like_vllm() {
        let p = file(
            "a.yaml",
            "port: 8001\ngpu_memory_utilization: 0.5\nenforce-eager: true\nenable-prefix-caching: false\n\
             trust-remote-code: false\nserved-model-name: [a, b]\nallowed-origins: []\n\
             compilation-config: {mode: 3}\n",
        );
        let t = read(&p).expect("reads");
        assert_eq!(
            t,
            [
                "--port",
                "8001",
                "--gpu_memory_utilization",
                "0.5",
                "--enforce-eager",
                "--no-enable-prefix-caching",
                "--no-trust-remote-code",
                "--served-model-name",
                "a",
                "b",
                "--compilation-config",
                r#"{"mode":3}"#
            ]
        );
    }

    #[test]
    fn file_flags_go_after_the_model_so_the_command_line_wins() {
        let p = file("b.yml", "port: 1\n");
        let line = format!("rserve serve m --config {} --port 2", p.display());
        let out: Vec<String> =
            expand(os(&line)).expect("expands").into_iter().map(|a| a.into_string().unwrap()).collect();
        assert_eq!(out, ["rserve", "serve", "m", "--port", "1", "--port", "2"]);
        let line = format!("rserve serve --config={} --host h", p.display());
        let out: Vec<String> =
            expand(os(&line)).expect("expands").into_iter().map(|a| a.into_string().unwrap()).collect();
        assert_eq!(out, ["rserve", "serve", "--port", "1", "--host", "h"]);
        let line = format!("rserve serve m --config {}", p.display());
        let out: Vec<String> =
            expand(os(&line)).expect("expands").into_iter().map(|a| a.into_string().unwrap()).collect();
        assert_eq!(out, ["rserve", "serve", "m", "--port", "1"]);
    }

    #[test]
    fn bad_files_are_errors_naming_the_file() {
        let p = file("c.json", "{}");
        assert!(matches!(read(&p), Err(CliError::ConfigFile(m)) if m.contains(".yaml")));
        let p = file("d.yaml", "port: [1\n");
        assert!(matches!(read(&p), Err(CliError::ConfigFile(m)) if m.contains("not valid YAML")));
        assert!(
            matches!(read(Path::new("/nonexistent/x.yaml")), Err(CliError::ConfigFile(m)) if m.contains("cannot read"))
        );
    }
}
