//! vLLM's command line, made rserve's before clap parses `serve`: `--config FILE.yaml` expanded in place (as vLLM's
//! `FlexibleArgumentParser` does), flag names with underscores accepted (`--max_model_len`), short aliases (`-tp`,
//! `-dp`, `-q`, `-O3`) spelled out, and every flag of the `vllm_flags` table applied: implemented flags go on to
//! clap, ignored ones are dropped with their values and noted (one warning each at start-up), refused ones stop here
//! with their reason. Flags the table does not know go on to clap, which rejects what nobody knows.

use std::ffi::OsString;

use super::config_file;
use super::vllm_flags::{self, Arity, Support, VllmFlag};
use super::CliError;

/// A flag accepted but without effect, and why (logged once at start-up).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// The spelling given (`--swap-space`).
    pub flag: String,
    pub why: &'static str,
}

impl std::fmt::Display for Notice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Ignoring {}: {}", self.flag, self.why)
    }
}

/// The command line clap will parse, and the notices of the flags dropped from it.
#[derive(Debug, Default)]
pub struct Prepared {
    pub args: Vec<OsString>,
    pub notices: Vec<Notice>,
}

/// Rewrites the flag name of `--some_flag=value` / `--some_flag.key` as vLLM does: underscores become dashes between
/// the `--` and the first `.` or `=`.
fn dashes(token: &str) -> String {
    let Some(rest) = token.strip_prefix("--") else { return token.to_owned() };
    let end = rest.find(['=', '.']).unwrap_or(rest.len());
    format!("--{}{}", rest[..end].replace('_', "-"), &rest[end..])
}

/// Whether a token is a flag (and not a value such as `-1` or `-0.5`).
fn is_flag(token: &str) -> bool {
    token.starts_with('-') && token.len() > 1 && token.parse::<f64>().is_err()
}

/// Applies `--config`, spellings and the table to a normalized `rserve serve ...` command line; other commands pass
/// through unchanged.
pub fn prepare(args: Vec<OsString>) -> Result<Prepared, CliError> {
    if args.get(1).and_then(|a| a.to_str()) != Some("serve") {
        return Ok(Prepared { args, notices: Vec::new() });
    }
    let tokens = config_file::expand(args)?;
    let mut out: Vec<OsString> = Vec::with_capacity(tokens.len());
    let mut notices: Vec<Notice> = Vec::new();
    let mut it = tokens.into_iter().peekable();
    while let Some(token) = it.next() {
        let Some(text) = token.to_str().map(str::to_owned) else {
            out.push(token);
            continue;
        };
        if text == "--" {
            out.push(token);
            out.extend(it.by_ref());
            break;
        }
        if !is_flag(&text) {
            out.push(token);
            continue;
        }
        let text = optimization_level(&dashes(&text));
        let (name, inline) = match text.split_once('=') {
            Some((n, v)) => (n.to_owned(), Some(v.to_owned())),
            None => (text.clone(), None),
        };
        // `--compilation-config.mode 3`: a dotted key sets one field of a JSON-valued flag.
        let base = match name.split_once('.') {
            Some((b, _)) if b.starts_with("--") => b.to_owned(),
            _ => name.clone(),
        };
        let Some(flag) = vllm_flags::lookup(&base) else {
            out.push(OsString::from(text));
            continue;
        };
        let arity = if base != name { Arity::One } else { flag.arity };
        match flag.support {
            Support::Implemented => implemented(flag, &name, inline, &mut it, &mut out),
            Support::Ignored(why) => {
                drop_values(arity, inline.is_some(), &mut it);
                note(&mut notices, &name, why);
            }
            Support::Refused(why) if flag.is_negation(&name) => note(&mut notices, &name, why),
            Support::Refused(why) => return Err(CliError::Refused { flag: name, why }),
            Support::Only(values, why) => {
                let value = match inline {
                    Some(v) => v,
                    None => it.next().and_then(|v| v.into_string().ok()).unwrap_or_default(),
                };
                if !values.contains(&value.as_str()) {
                    return Err(CliError::RefusedValue { flag: name, value, why });
                }
            }
        }
    }
    Ok(Prepared { args: out, notices })
}

/// `-O3`, `-O 3`, `-O=3` are vLLM's `--optimization-level 3`.
fn optimization_level(token: &str) -> String {
    match token.strip_prefix("-O") {
        Some("") => "--optimization-level".to_owned(),
        Some(rest) => format!("--optimization-level={}", rest.strip_prefix('=').unwrap_or(rest)),
        None => token.to_owned(),
    }
}

fn note(notices: &mut Vec<Notice>, flag: &str, why: &'static str) {
    if !notices.iter().any(|n| n.flag == flag) {
        notices.push(Notice { flag: flag.to_owned(), why });
    }
}

/// An implemented flag goes to clap under its canonical name; the negation of a switch clap does not know removes
/// the switch given before it (the last one wins, as in argparse).
fn implemented(
    flag: &VllmFlag,
    name: &str,
    inline: Option<String>,
    it: &mut std::iter::Peekable<impl Iterator<Item = OsString>>,
    out: &mut Vec<OsString>,
) {
    let canonical = flag.names[0];
    if flag.is_negation(name) && !super::clap_knows(name) {
        out.retain(|t| t.to_str() != Some(canonical));
        return;
    }
    let spelled = if super::clap_knows(name) { name } else { canonical };
    match inline {
        Some(v) => out.push(OsString::from(format!("{spelled}={v}"))),
        None => {
            out.push(OsString::from(spelled));
            // Values are copied as they are, so that a value starting with '-' is not taken for a flag.
            match flag.arity {
                Arity::One => out.extend(it.next()),
                Arity::Optional | Arity::Many => {
                    while let Some(v) = it.next_if(|v| v.to_str().is_some_and(|s| !is_flag(s))) {
                        out.push(v);
                    }
                }
                Arity::Switch => {}
            }
        }
    }
}

/// Skips the values of an ignored flag.
fn drop_values(arity: Arity, inline: bool, it: &mut std::iter::Peekable<impl Iterator<Item = OsString>>) {
    if inline {
        return;
    }
    match arity {
        Arity::Switch => {}
        Arity::One => {
            it.next();
        }
        Arity::Optional => {
            it.next_if(|v| v.to_str().is_some_and(|s| !is_flag(s)));
        }
        Arity::Many => while it.next_if(|v| v.to_str().is_some_and(|s| !is_flag(s))).is_some() {},
    }
}

#[cfg(test)]
#[path = "compat_tests.rs"]
mod tests;
