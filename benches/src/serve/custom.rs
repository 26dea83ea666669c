//! The `custom` dataset (vLLM's `CustomDataset`): a JSONL file, one object per line with a string "prompt" and,
//! optionally, an integer "output_tokens" (used when `--custom-output-len` is -1). Lines are shuffled with the seed
//! unless `--disable-shuffle`; prompts are rendered with the model's chat template unless the chat API is used or
//! `--skip-chat-template` is given. A malformed line is an error naming its line number.

use std::path::Path;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde_json::Value;

use super::dataset::SampleRequest;
use super::error::BenchError;
use super::sonnet::Formatter;
use super::tokenize::BenchTokenizer;

/// One line of the file.
#[derive(Debug, Clone, PartialEq)]
pub struct CustomLine {
    pub prompt: String,
    pub output_tokens: Option<usize>,
}

/// Reads and checks every line (blank lines are skipped); the file must end in `.jsonl`, as vLLM requires.
pub fn read_jsonl(path: &Path) -> Result<Vec<CustomLine>, BenchError> {
    let bad = |message: String| BenchError::Dataset { path: path.to_path_buf(), message };
    if path.extension().is_none_or(|e| e != "jsonl") {
        return Err(bad("only JSONL files (.jsonl) are supported for --dataset-name custom".into()));
    }
    let text = std::fs::read_to_string(path).map_err(|source| BenchError::Io { path: path.to_path_buf(), source })?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let n = i + 1;
        let v: Value = serde_json::from_str(line).map_err(|e| bad(format!("line {n} is not JSON: {e}")))?;
        let prompt = match v.get("prompt") {
            Some(Value::String(p)) => p.clone(),
            Some(other) => return Err(bad(format!("line {n}: \"prompt\" must be a string, not {other}"))),
            None => return Err(bad(format!("line {n} has no \"prompt\""))),
        };
        let output_tokens = match v.get("output_tokens") {
            None | Some(Value::Null) => None,
            Some(o) => Some(
                o.as_u64()
                    .map(|x| x as usize)
                    .ok_or_else(|| bad(format!("line {n}: \"output_tokens\" must be an integer, not {o}")))?,
            ),
        };
        out.push(CustomLine { prompt, output_tokens });
    }
    if out.is_empty() {
        return Err(bad("the file holds no prompts".into()));
    }
    Ok(out)
}

/// The first `num_prompts` lines (after shuffling with `seed` when `shuffle`), rendered by `format`, with
/// `output_len` tokens each, or each line's "output_tokens" when `output_len` is `None`.
pub async fn custom_requests(
    path: &Path,
    lines: &[CustomLine],
    num_prompts: usize,
    output_len: Option<usize>,
    (seed, shuffle): (u64, bool),
    tok: &BenchTokenizer,
    format: &Formatter<'_>,
) -> Result<Vec<SampleRequest>, BenchError> {
    let mut lines = lines.to_vec();
    if shuffle {
        lines.shuffle(&mut StdRng::seed_from_u64(seed));
    }
    let mut out = Vec::with_capacity(num_prompts.min(lines.len()));
    for line in lines.iter().take(num_prompts) {
        let expected_output_len = match output_len.or(line.output_tokens) {
            Some(n) => n,
            None => {
                return Err(BenchError::Dataset {
                    path: path.to_path_buf(),
                    message: "with --custom-output-len -1 every line needs \"output_tokens\"".into(),
                })
            }
        };
        let prompt = format(&line.prompt)?;
        let prompt_len = tok.encode(&prompt).await?.len();
        out.push(SampleRequest { prompt, prompt_len, expected_output_len });
    }
    Ok(out)
}
