//! ARCHITECTURE.md stays true about the tree: every repository path it names exists, and its decision index links
//! exactly the records under docs/decisions/.
//!
//! A path is a code span (or a word of the fenced flow diagram) made of path characters that contains a `/` or ends
//! with a known extension; flags (`--x`), absolute paths (HTTP routes), URLs and Rust paths (`a::b`) are not paths. A
//! path resolves against the repository root, or else against the folder its code-map row names in its first column
//! (the folder itself, or the file's folder), so a row for `engine/src/sampling/` may say `draw.rs`. `*` matches
//! within one path component; a path ending in `/` must be a folder. Markdown link targets must exist, and prose may
//! name only `.md` files of the repository (no file outside it).

use std::fs;
use std::path::{Path, PathBuf};

use rserve_tests::repo_root;

/// Extensions that make a code span a file path even without a `/`.
const EXTENSIONS: &[&str] = &["rs", "md", "sh", "py", "cl", "h", "cu", "json", "toml", "yaml", "yml"];

/// Names of files a model folder holds (not files of this repository), which the text may name as kinds of file.
const MODEL_FILES: &[&str] = &["config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"];

const DECISIONS: &str = "docs/decisions";

fn architecture() -> String {
    let path = repo_root().join("ARCHITECTURE.md");
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// One path the document names: where, the text, and the folders it may be relative to besides the root.
struct Mention {
    line: usize,
    text: String,
    bases: Vec<PathBuf>,
}

fn looks_like_path(t: &str) -> bool {
    if t.is_empty() || t.starts_with('-') || t.starts_with('/') || t.contains("::") {
        return false;
    }
    if !t.chars().all(|c| c.is_ascii_alphanumeric() || "_-./*".contains(c)) {
        return false;
    }
    if MODEL_FILES.contains(&t) {
        return false;
    }
    let ext = t.rsplit_once('.').map(|(stem, ext)| (!stem.is_empty() && !stem.ends_with('/'), ext));
    t.contains('/') || matches!(ext, Some((true, ext)) if EXTENSIONS.contains(&ext))
}

/// `*` matches any run of characters within one name.
fn wildcard(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, rest)) => {
            name.starts_with(head)
                && (0..=name.len() - head.len())
                    .any(|skip| name.is_char_boundary(head.len() + skip) && wildcard(rest, &name[head.len() + skip..]))
        }
    }
}

/// Whether `components` name something under `dir` (the last one a folder when `want_dir`).
fn exists(dir: &Path, components: &[&str], want_dir: bool) -> bool {
    let Some((first, rest)) = components.split_first() else {
        return if want_dir { dir.is_dir() } else { dir.exists() };
    };
    if *first == ".." {
        return false; // nothing outside the repository
    }
    if !first.contains('*') {
        return exists(&dir.join(first), rest, want_dir);
    }
    let Ok(entries) = fs::read_dir(dir) else { return false };
    entries.flatten().any(|e| wildcard(first, &e.file_name().to_string_lossy()) && exists(&e.path(), rest, want_dir))
}

fn resolves(base: &Path, path: &str) -> bool {
    let components: Vec<&str> = path.split('/').filter(|c| !c.is_empty() && *c != ".").collect();
    !components.is_empty() && exists(base, &components, path.ends_with('/'))
}

/// The folder a code-map row's first-column path names: the folder itself, or the file's folder.
fn row_base(root: &Path, path: &str) -> PathBuf {
    let full = root.join(path);
    match full.is_dir() {
        true => full,
        false => full.parent().map(Path::to_path_buf).unwrap_or(full),
    }
}

/// Every path the document names, every markdown link target, and the problems found while reading.
fn mentions(doc: &str, root: &Path) -> (Vec<Mention>, Vec<(usize, String)>, Vec<String>) {
    let (mut paths, mut links, mut problems) = (Vec::new(), Vec::new(), Vec::new());
    let (mut fenced, mut section) = (false, String::new());
    for (i, line) in doc.lines().enumerate() {
        let n = i + 1;
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            for word in line.split_whitespace() {
                let word = word.trim_matches(|c: char| "(),;:".contains(c));
                if word.contains('/') && looks_like_path(word) {
                    paths.push(Mention { line: n, text: word.to_string(), bases: Vec::new() });
                }
            }
            continue;
        }
        if let Some(title) = line.strip_prefix("## ") {
            section = title.trim().to_string();
        }
        let spans: Vec<&str> = line.split('`').collect();
        if spans.len().is_multiple_of(2) {
            problems.push(format!("ARCHITECTURE.md:{n}: unbalanced backticks (keep each code span on one line)"));
            continue;
        }
        // A code-map row: paths in its other columns may be relative to the folder its first column names.
        let mut bases = Vec::new();
        if section == "Code map" && line.starts_with('|') {
            let first_cell = line.split('|').nth(1).unwrap_or("");
            bases = first_cell
                .split('`')
                .skip(1)
                .step_by(2)
                .filter(|t| looks_like_path(t))
                .map(|t| row_base(root, t))
                .collect();
            if bases.is_empty() && !first_cell.trim().starts_with("path") && !first_cell.trim().starts_with("---") {
                problems.push(format!("ARCHITECTURE.md:{n}: code-map row without a path in its first column"));
            }
        }
        for (k, span) in spans.iter().enumerate() {
            if k % 2 == 1 {
                if looks_like_path(span) {
                    paths.push(Mention { line: n, text: span.to_string(), bases: bases.clone() });
                }
                continue;
            }
            // Prose: markdown link targets, and `.md` files named without backticks.
            let mut rest = *span;
            while let Some(at) = rest.find("](") {
                let after = &rest[at + 2..];
                let end = after.find(')').unwrap_or(after.len());
                links.push((n, after[..end].to_string()));
                rest = &after[end..];
            }
            for word in span.split_whitespace() {
                let word = word.trim_matches(|c: char| !(c.is_ascii_alphanumeric() || "_-./".contains(c)));
                let word = word.trim_end_matches('.');
                if word.ends_with(".md") && !word.contains("](") {
                    paths.push(Mention { line: n, text: word.to_string(), bases: Vec::new() });
                }
            }
        }
    }
    (paths, links, problems)
}

#[test]
fn every_path_architecture_md_names_exists() {
    let root = repo_root();
    let doc = architecture();
    let (paths, links, mut problems) = mentions(&doc, &root);
    assert!(paths.len() > 100, "found only {} paths in ARCHITECTURE.md: is the parser broken?", paths.len());
    for m in &paths {
        if !resolves(&root, &m.text) && !m.bases.iter().any(|b| resolves(b, &m.text)) {
            let tried: Vec<String> =
                m.bases.iter().map(|b| b.strip_prefix(&root).unwrap_or(b).display().to_string()).collect();
            let tried = if tried.is_empty() { String::new() } else { format!(" (nor under {})", tried.join(", ")) };
            problems.push(format!("ARCHITECTURE.md:{}: `{}` does not exist{tried}", m.line, m.text));
        }
    }
    for (line, target) in &links {
        if target.contains("://") || target.starts_with('#') || target.starts_with("mailto:") {
            continue;
        }
        let path = target.split('#').next().unwrap_or(target);
        if !resolves(&root, path) {
            problems.push(format!("ARCHITECTURE.md:{line}: link target {target} does not exist"));
        }
    }
    assert!(problems.is_empty(), "ARCHITECTURE.md names what is not in the repository:\n{}", problems.join("\n"));
}

#[test]
fn the_decision_index_links_every_record() {
    let root = repo_root();
    let doc = architecture();
    let (_, links, _) = mentions(&doc, &root);
    let mut linked: Vec<String> =
        links.iter().filter_map(|(_, t)| t.strip_prefix(&format!("{DECISIONS}/")).map(str::to_string)).collect();
    linked.sort();
    let mut records: Vec<String> = fs::read_dir(root.join(DECISIONS))
        .expect("docs/decisions exists")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".md"))
        .collect();
    records.sort();
    let missing: Vec<&String> = records.iter().filter(|r| !linked.contains(r)).collect();
    let stale: Vec<&String> = linked.iter().filter(|l| !records.contains(l)).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "ARCHITECTURE.md's decision index is out of step with {DECISIONS}/: not linked {missing:?}, no such record {stale:?}"
    );
    for name in &records {
        let text = fs::read_to_string(root.join(DECISIONS).join(name)).expect("a decision record is readable");
        let date = name.get(..10).unwrap_or("");
        assert!(
            text.starts_with("# ") && text.contains(&format!("\nDate: {date}\n")),
            "{DECISIONS}/{name}: a record opens with its title and a Date: line equal to its file name's date"
        );
    }
}

#[test]
fn the_path_rules_catch_what_they_should() {
    assert!(looks_like_path("engine/src/runner.rs") && looks_like_path("draw.rs") && looks_like_path("spirv/"));
    assert!(looks_like_path("engine/tests/hostile_*.rs") && looks_like_path("DESIGN.md"));
    for not_a_path in ["--features regenerate", "/metrics", "Op::SampleRows", "config.json", ".gguf", "0.0.4", "VLLM_*"]
    {
        assert!(!looks_like_path(not_a_path), "{not_a_path}");
    }
    assert!(wildcard("hostile_*.rs", "hostile_files.rs") && !wildcard("hostile_*.rs", "hostile.rs"));
    let root = repo_root();
    assert!(resolves(&root, "tests/tests/architecture_paths.rs") && resolves(&root, "engine/tests/hostile_*.rs"));
    assert!(!resolves(&root, "tests/tests/no_such_file.rs") && !resolves(&root, "tests/Cargo.toml/"));
    assert!(!resolves(&root.join("tests"), "../ARCHITECTURE.md"), "nothing outside the repository");
}
