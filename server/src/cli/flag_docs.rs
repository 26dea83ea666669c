//! README's flag section, written from the code: the implemented flags from clap (`serve`'s arguments, their help and
//! defaults, with vLLM's other spellings from the table), then the vLLM flags rserve accepts with a warning, limits to
//! some values, or refuses (from `vllm_flags`, grouped by reason), then the environment variables (`env`). A test
//! compares README.md's section between the markers with this text (`UPDATE_README=1` rewrites it).

use std::collections::BTreeMap;
use std::fmt::Write;

use clap::CommandFactory;

use super::env::ENV_VARS;
use super::vllm_flags::{Origin, Support, FLAGS};
use super::Cli;

fn code_list(names: &[&str]) -> String {
    names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
}

/// A table cell: one line, no bar.
fn cell(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ").replace('|', "\\|")
}

/// The implemented flags: one row per clap argument of `serve`.
fn implemented(out: &mut String) {
    let cmd = Cli::command();
    let serve = cmd.find_subcommand("serve").expect("serve is a subcommand");
    out.push_str("| flag | default | meaning |\n| --- | --- | --- |\n");
    for arg in serve.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if arg.is_hide_set() {
            continue;
        }
        let name = format!("--{long}");
        let mut names = vec![name.clone()];
        for alias in arg.get_all_aliases().unwrap_or_default() {
            names.push(format!("--{alias}"));
        }
        if let Some(row) = FLAGS.iter().find(|f| f.names[0] == name) {
            names.extend(row.names.iter().skip(1).map(|n| n.to_string()));
        }
        names.dedup();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let default: Vec<String> = arg.get_default_values().iter().map(|v| v.to_string_lossy().into_owned()).collect();
        let help = arg.get_long_help().or(arg.get_help()).map(|h| h.to_string()).unwrap_or_default();
        let origin = match FLAGS.iter().find(|f| f.names[0] == name).map(|f| f.origin) {
            Some(Origin::Rserve) => " (rserve only)",
            _ => "",
        };
        let _ = writeln!(out, "| {} | {} | {}{} |", code_list(&names), cell(&default.join(" ")), cell(&help), origin);
    }
}

/// The other vLLM flags, grouped by reason.
fn classified(out: &mut String) {
    let mut ignored: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut refused: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut only: Vec<(String, String, &str)> = Vec::new();
    for f in FLAGS {
        match f.support {
            Support::Implemented => {}
            Support::Ignored(why) => ignored.entry(why).or_default().extend(f.names.iter().copied()),
            Support::Refused(why) => refused.entry(why).or_default().push(f.names[0]),
            Support::Only(values, why) => only.push((code_list(f.names), code_list(values), why)),
        }
    }
    out.push_str(
        "\nAccepted with one warning at start-up (`Ignoring FLAG: reason`), because they change nothing in rserve:\n\n\
         | flags | why |\n| --- | --- |\n",
    );
    for (why, names) in &ignored {
        let _ = writeln!(out, "| {} | {} |", code_list(names), cell(why));
    }
    out.push_str("\nAccepted only with the value rserve has anyway (any other value is refused with the reason):\n\n");
    out.push_str("| flag | accepted | otherwise |\n| --- | --- | --- |\n");
    for (names, values, why) in &only {
        let _ = writeln!(out, "| {names} | {values} | {} |", cell(why));
    }
    out.push_str(
        "\nRefused: start-up stops with `Error: FLAG is not supported by rserve: reason` (exit code 1); their \
         negations (`--disable-lora`, ...) ask for what rserve does anyway and are accepted with a warning:\n\n\
         | flags | why |\n| --- | --- |\n",
    );
    for (why, names) in &refused {
        let _ = writeln!(out, "| {} | {} |", code_list(names), cell(why));
    }
}

fn environment(out: &mut String) {
    out.push_str("\nEnvironment variables:\n\n| variable | read | meaning |\n| --- | --- | --- |\n");
    for v in ENV_VARS {
        let read = if v.read { "yes" } else { "no" };
        let _ = writeln!(out, "| `{}` | {read} | {} |", v.name, cell(v.what));
    }
}

/// The generated section (without the markers).
pub fn markdown() -> String {
    let mut out = String::new();
    implemented(&mut out);
    classified(&mut out);
    environment(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The line before the generated section.
    const BEGIN: &str =
        "<!-- BEGIN generated flag tables: `UPDATE_README=1 cargo test -p rserve-server readme_flag_tables` -->";
    /// The line after it.
    const END: &str = "<!-- END generated flag tables -->";

    /// README.md's generated section equals the code's; `UPDATE_README=1` rewrites it.
    #[test]
    fn readme_flag_tables() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
        let readme = std::fs::read_to_string(&path).expect("README.md");
        let (Some(start), Some(end)) = (readme.find(BEGIN), readme.find(END)) else {
            panic!("README.md lacks the markers {BEGIN} / {END}")
        };
        let body_start = start + BEGIN.len() + 1;
        let current = &readme[body_start..end];
        let wanted = markdown();
        if current != wanted {
            if std::env::var_os("UPDATE_README").is_some() {
                let updated = format!("{}{}{}", &readme[..body_start], wanted, &readme[end..]);
                std::fs::write(&path, updated).expect("writing README.md");
            } else {
                panic!("README.md's flag tables differ from the code: run UPDATE_README=1 cargo test -p rserve-server readme_flag_tables");
            }
        }
    }
}
