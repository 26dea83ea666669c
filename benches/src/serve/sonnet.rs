//! The `sonnet` dataset as vLLM built it (`SonnetDataset`, vLLM <= 0.10): the lines of a text file (vLLM's
//! `benchmarks/sonnet.txt`), a base instruction, the file's first lines as a prefix shared by every prompt, then
//! lines picked at random (seeded) up to `--sonnet-input-len` tokens. Line counts come from the average tokens per
//! line; a prompt is kept only when it fits `input_len`. With the completions API the prompt is rendered with the
//! model's chat template (as vLLM does); with the chat API the server renders it.

use std::path::Path;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::dataset::SampleRequest;
use super::error::BenchError;
use super::tokenize::BenchTokenizer;

/// vLLM's instruction at the head of every sonnet prompt.
pub const BASE_PROMPT: &str = "Pick as many lines as you can from these poem lines:\n";

/// Prompts drawn in a row that do not fit before giving up (vLLM loops forever).
const MAX_MISSES: usize = 10_000;

/// `sonnet` settings.
#[derive(Debug, Clone)]
pub struct SonnetSpec {
    pub input_len: usize,
    pub output_len: usize,
    pub prefix_len: usize,
    pub num_prompts: usize,
    pub seed: u64,
}

/// Renders a prompt the way it is sent (chat template or not) and counts its tokens.
pub type Formatter<'a> = dyn Fn(&str) -> Result<String, BenchError> + 'a;

/// The file's lines, each with its line ending (Python's `readlines()`).
pub fn read_lines(path: &Path) -> Result<Vec<String>, BenchError> {
    let text = std::fs::read_to_string(path).map_err(|source| BenchError::Io { path: path.to_path_buf(), source })?;
    let lines: Vec<String> = text.split_inclusive('\n').map(str::to_owned).collect();
    if lines.is_empty() {
        return Err(BenchError::Dataset { path: path.to_path_buf(), message: "the file is empty".into() });
    }
    Ok(lines)
}

/// Builds `spec.num_prompts` sonnet prompts from `lines`; `format` turns the plain prompt into what is sent.
pub async fn sonnet_requests(
    lines: &[String],
    spec: &SonnetSpec,
    tok: &BenchTokenizer,
    format: &Formatter<'_>,
) -> Result<Vec<SampleRequest>, BenchError> {
    let mut total = 0usize;
    for line in lines {
        total += tok.encode(line).await?.len();
    }
    let avg_len = total as f64 / lines.len() as f64;
    if avg_len <= 0.0 {
        return Err(BenchError::arg("--dataset-path", "the sonnet lines hold no tokens"));
    }
    let base_offset = tok.encode(&format(BASE_PROMPT)?).await?.len();
    if spec.input_len <= base_offset {
        return Err(BenchError::arg(
            "--sonnet-input-len",
            format!("must be higher than the base prompt length ({base_offset})"),
        ));
    }
    let num_input_lines = ((spec.input_len - base_offset) as f64 / avg_len).round() as usize;
    let num_prefix_lines = ((spec.prefix_len as f64 - base_offset as f64) / avg_len).round().max(0.0) as usize;
    let prefix: String = lines.iter().take(num_prefix_lines).map(String::as_str).collect();
    let extra = num_input_lines.saturating_sub(num_prefix_lines);
    let mut rng = StdRng::seed_from_u64(spec.seed);
    let mut out = Vec::with_capacity(spec.num_prompts);
    let mut misses = 0;
    while out.len() < spec.num_prompts {
        let picked: String = (0..extra).map(|_| lines[rng.gen_range(0..lines.len())].as_str()).collect();
        let prompt = format(&format!("{BASE_PROMPT}{prefix}{picked}"))?;
        let prompt_len = tok.encode(&prompt).await?.len();
        if prompt_len <= spec.input_len {
            out.push(SampleRequest { prompt, prompt_len, expected_output_len: spec.output_len });
            misses = 0;
        } else {
            misses += 1;
            if misses == MAX_MISSES {
                return Err(BenchError::arg(
                    "--sonnet-input-len",
                    format!("no prompt of {extra} random lines fits in {} tokens", spec.input_len),
                ));
            }
        }
    }
    Ok(out)
}
