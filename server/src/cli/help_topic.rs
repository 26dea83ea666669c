//! vLLM's `--help=TOPIC` for `serve` and `run-batch`: `all` (every flag), `listgroup` (the groups' names), a group
//! (`--help=ModelConfig`: its flags), a flag (`--help=max-num-seqs`: that flag), else a keyword (every flag whose
//! name contains it). The groups are the clap help headings, which carry vLLM's config-group names.

use std::ffi::OsString;

use clap::{Arg, Command};

/// The group of flags without a heading, as vLLM's parser names it.
const NO_GROUP: &str = "options";

/// The topic of a `--help=TOPIC` argument of `serve` or `run-batch` (argv as `normalize_args` leaves it).
pub fn requested(args: &[OsString]) -> Option<String> {
    let sub = args.get(1)?.to_str()?;
    if !matches!(sub, "serve" | "run-batch") {
        return None;
    }
    args[2..].iter().find_map(|a| a.to_str()?.strip_prefix("--help=").map(str::to_owned))
}

/// The text `--help=topic` prints for `cmd`, or the line that says nothing matches.
pub fn render(cmd: &Command, topic: &str) -> Result<String, String> {
    let args: Vec<&Arg> = cmd.get_arguments().filter(|a| !a.is_hide_set() && a.get_long().is_some()).collect();
    let group = |a: &Arg| a.get_help_heading().unwrap_or(NO_GROUP).to_owned();
    let mut groups: Vec<String> = args.iter().map(|a| group(a)).collect();
    groups.sort();
    groups.dedup();
    let listing = |title: &str, of: &[&Arg]| {
        let mut out = format!("{title}:\n");
        for a in of {
            out.push_str(&describe(a));
        }
        out
    };
    if topic == "all" {
        return Ok(groups
            .iter()
            .map(|g| listing(g, &args.iter().copied().filter(|a| group(a) == *g).collect::<Vec<_>>()))
            .collect::<Vec<_>>()
            .join("\n"));
    }
    if topic == "listgroup" {
        return Ok(format!("Groups of flags (show one with --help=GROUP):\n{}\n", groups.join("\n")));
    }
    if let Some(g) = groups.iter().find(|g| g.eq_ignore_ascii_case(topic)) {
        return Ok(listing(g, &args.iter().copied().filter(|a| group(a) == *g).collect::<Vec<_>>()));
    }
    let name = topic.trim_start_matches('-').replace('_', "-");
    if let Some(a) = args.iter().find(|a| a.get_long() == Some(name.as_str())) {
        return Ok(describe(a));
    }
    let found: Vec<&Arg> = args.iter().copied().filter(|a| a.get_long().is_some_and(|l| l.contains(&name))).collect();
    if found.is_empty() {
        return Err(format!(
            "no group or flag matches '{topic}' (see --help=listgroup for the groups, --help=all for every flag)"
        ));
    }
    Ok(listing(&format!("Flags matching '{name}'"), &found))
}

/// One flag: its name and value, its help and its default.
fn describe(a: &Arg) -> String {
    let mut head = format!("  --{}", a.get_long().unwrap_or_default());
    if a.get_action().takes_values() {
        let value = a
            .get_value_names()
            .and_then(|v| v.first())
            .map_or_else(|| a.get_id().as_str().to_uppercase(), |v| v.as_str().to_owned());
        head.push_str(&format!(" <{value}>"));
    }
    let mut out = format!("{head}\n");
    if let Some(help) = a.get_long_help().or_else(|| a.get_help()) {
        for line in help.to_string().lines() {
            out.push_str(&format!("      {line}\n"));
        }
    }
    let defaults: Vec<String> = a.get_default_values().iter().map(|d| d.to_string_lossy().into_owned()).collect();
    if !defaults.is_empty() && a.get_action().takes_values() {
        out.push_str(&format!("      [default: {}]\n", defaults.join(", ")));
    }
    out
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    fn serve() -> Command {
        let mut cli = crate::cli::Cli::command();
        cli.build();
        cli.find_subcommand("serve").expect("serve").clone()
    }

    fn argv(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn the_topic_is_read_from_serve_and_run_batch_only() {
        assert_eq!(requested(&argv(&["rserve", "serve", "m", "--help=all"])).as_deref(), Some("all"));
        assert_eq!(requested(&argv(&["rserve", "run-batch", "--help=max"])).as_deref(), Some("max"));
        assert_eq!(requested(&argv(&["rserve", "plan", "--help=all"])), None);
        assert_eq!(requested(&argv(&["rserve", "serve", "--help"])), None);
    }

    #[test]
    fn groups_flags_and_keywords() {
        let cmd = serve();
        let groups = render(&cmd, "listgroup").unwrap();
        for g in ["ModelConfig", "CacheConfig", "ParallelConfig", "SchedulerConfig", "Frontend"] {
            assert!(groups.lines().any(|l| l == g), "{groups}");
        }
        let model = render(&cmd, "ModelConfig").unwrap();
        assert!(model.starts_with("ModelConfig:\n") && model.contains("--max-model-len"), "{model}");
        assert!(!model.contains("--port"), "{model}");
        assert_eq!(render(&cmd, "modelconfig").unwrap(), model);
        let one = render(&cmd, "max-num-seqs").unwrap();
        assert!(one.starts_with("  --max-num-seqs <") && one.lines().filter(|l| l.starts_with("  --")).count() == 1);
        assert_eq!(render(&cmd, "--max-num-seqs").unwrap(), one);
        let search = render(&cmd, "max").unwrap();
        assert!(search.contains("--max-model-len") && search.contains("--max-num-seqs"), "{search}");
        assert!(search.lines().filter(|l| l.starts_with("  --")).all(|l| l.contains("max")), "{search}");
        let all = render(&cmd, "all").unwrap();
        assert!(all.contains("--port") && all.contains("--max-model-len") && all.len() > model.len());
        assert!(render(&cmd, "no-such-thing").unwrap_err().contains("no-such-thing"));
    }
}
