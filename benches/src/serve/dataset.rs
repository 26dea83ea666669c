//! The prompts of a run: `random` (an optional shared random prefix, then random token ids of lengths drawn around
//! `--random-input-len`, turned into text and re-tokenized until the text has exactly the drawn length) or
//! `sharegpt` (the first human turn of each conversation of a ShareGPT-format JSON file, with vLLM's length
//! filters); vLLM's oversampling of short files. `sonnet` and `custom` are in their own files.

use std::path::Path;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Deserialize;

use super::args_dataset::RangeRatio;
use super::error::BenchError;
use super::tokenize::BenchTokenizer;

/// One prompt to send.
#[derive(Debug, Clone, PartialEq)]
pub struct SampleRequest {
    pub prompt: String,
    /// Prompt length in tokens (as the benchmark's tokenizer counts it).
    pub prompt_len: usize,
    /// `max_tokens` to request.
    pub expected_output_len: usize,
}

/// `random` dataset settings.
#[derive(Debug, Clone)]
pub struct RandomSpec {
    pub input_len: usize,
    pub output_len: usize,
    /// Lengths are drawn uniformly from `[len * (1 - r), len * (1 + r)]`, `0 <= r < 1`.
    pub range_ratio: RangeRatio,
    /// Tokens of one random prefix every prompt starts with (`--random-prefix-len`).
    pub prefix_len: usize,
    pub num_prompts: usize,
    pub seed: u64,
    /// Upper end of the ids drawn (see [`BenchTokenizer::random_id_pool`]).
    pub vocab_size: Option<usize>,
}

/// The `[low, high]` range a length is drawn from (`low >= 1`).
pub fn length_range(len: usize, ratio: f64) -> (usize, usize) {
    let low = ((len as f64) * (1.0 - ratio)).floor().max(1.0) as usize;
    let high = ((len as f64) * (1.0 + ratio)).floor() as usize;
    (low, high.max(low))
}

/// Tries this many decode/encode rounds to hit an exact prompt length before taking the closest text found.
const MAX_LENGTH_ROUNDS: usize = 10;

fn draw(rng: &mut StdRng, pool: &[u32], n: usize) -> Vec<u32> {
    (0..n).map(|_| pool[rng.gen_range(0..pool.len())]).collect()
}

/// Decodes `ids` and re-encodes the text, trimming or topping up with random ids, until the text is exactly
/// `target` tokens long (or the closest found after [`MAX_LENGTH_ROUNDS`]): the text and its ids.
async fn fit_length(
    tok: &BenchTokenizer,
    mut ids: Vec<u32>,
    target: usize,
    rng: &mut StdRng,
    pool: &[u32],
) -> Result<(String, Vec<u32>), BenchError> {
    let mut best: Option<(String, Vec<u32>)> = None;
    for _ in 0..MAX_LENGTH_ROUNDS {
        let text = tok.decode(&ids).await?;
        let enc = tok.encode(&text).await?;
        let off = enc.len().abs_diff(target);
        if best.as_ref().is_none_or(|(_, b)| off < b.len().abs_diff(target)) {
            best = Some((text, enc.clone()));
        }
        if off == 0 {
            break;
        }
        ids = if enc.len() > target {
            enc[..target].to_vec()
        } else {
            let mut v = enc;
            v.extend(draw(rng, pool, target - v.len()));
            v
        };
    }
    Ok(best.unwrap_or_default())
}

/// Builds `spec.num_prompts` random prompts: the shared prefix (when `prefix_len > 0`, drawn once) followed by a
/// random part of a drawn length, the whole fitted to exactly `prefix_len + drawn` tokens.
pub async fn random_requests(spec: &RandomSpec, tok: &BenchTokenizer) -> Result<Vec<SampleRequest>, BenchError> {
    for r in [spec.range_ratio.input, spec.range_ratio.output] {
        if !(0.0..1.0).contains(&r) {
            return Err(BenchError::arg("--random-range-ratio", "must be in [0, 1)"));
        }
    }
    let pool = tok.random_id_pool(spec.vocab_size);
    if pool.is_empty() {
        return Err(BenchError::arg("--random-vocab-size", "leaves no token ids to draw from"));
    }
    let mut rng = StdRng::seed_from_u64(spec.seed);
    let (in_lo, in_hi) = length_range(spec.input_len, spec.range_ratio.input);
    let (out_lo, out_hi) = length_range(spec.output_len, spec.range_ratio.output);
    let prefix = if spec.prefix_len > 0 {
        let ids = draw(&mut rng, &pool, spec.prefix_len);
        fit_length(tok, ids, spec.prefix_len, &mut rng, &pool).await?.1
    } else {
        Vec::new()
    };
    let mut out = Vec::with_capacity(spec.num_prompts);
    for _ in 0..spec.num_prompts {
        let target = rng.gen_range(in_lo..=in_hi);
        let output_len = rng.gen_range(out_lo..=out_hi);
        let mut ids = prefix.clone();
        ids.extend(draw(&mut rng, &pool, target));
        let (prompt, enc) = fit_length(tok, ids, prefix.len() + target, &mut rng, &pool).await?;
        out.push(SampleRequest { prompt, prompt_len: enc.len(), expected_output_len: output_len });
    }
    Ok(out)
}

/// vLLM's oversampling: when a file gave fewer than `num_prompts` requests, copies of randomly chosen ones (seeded)
/// are appended until there are `num_prompts`.
pub fn oversample(requests: &mut Vec<SampleRequest>, num_prompts: usize, seed: u64) {
    if requests.is_empty() || requests.len() >= num_prompts {
        return;
    }
    let mut rng = StdRng::seed_from_u64(seed);
    let have = requests.len();
    for _ in have..num_prompts {
        let copy = requests[rng.gen_range(0..have)].clone();
        requests.push(copy);
    }
    eprintln!("Oversampled requests to reach {num_prompts} total samples.");
}

#[derive(Debug, Deserialize)]
struct Turn {
    #[serde(default)]
    value: String,
}

#[derive(Debug, Deserialize)]
struct Conversation {
    #[serde(default, alias = "conversation")]
    conversations: Vec<Turn>,
}

/// vLLM's ShareGPT filters: prompts and outputs of at least 4 tokens (output unchecked when fixed), prompts of at
/// most 1024 tokens and at most 2048 tokens in all.
pub fn sharegpt_keeps(prompt_len: usize, output_len: usize, fixed_output: bool) -> bool {
    prompt_len >= 4 && (fixed_output || output_len >= 4) && prompt_len <= 1024 && prompt_len + output_len <= 2048
}

/// Reads a ShareGPT JSON file (`[{"conversations": [{"from": "human", "value": ..}, {"from": "gpt", ..}]}]`),
/// shuffles the conversations with `seed` (unless `shuffle` is false) and keeps the first `num_prompts` that pass [`sharegpt_keeps`]; the
/// output length is the reply's token count unless `fixed_output_len` is given.
pub async fn sharegpt_requests(
    path: &Path,
    num_prompts: usize,
    fixed_output_len: Option<usize>,
    seed: u64,
    shuffle: bool,
    tok: &BenchTokenizer,
) -> Result<Vec<SampleRequest>, BenchError> {
    let text = std::fs::read_to_string(path).map_err(|source| BenchError::Io { path: path.to_path_buf(), source })?;
    let mut convs: Vec<Conversation> = serde_json::from_str(&text)
        .map_err(|e| BenchError::Dataset { path: path.to_path_buf(), message: format!("not ShareGPT JSON: {e}") })?;
    convs.retain(|c| c.conversations.len() >= 2);
    if shuffle {
        convs.shuffle(&mut StdRng::seed_from_u64(seed));
    }
    let mut out = Vec::with_capacity(num_prompts);
    for c in &convs {
        if out.len() == num_prompts {
            break;
        }
        let prompt = &c.conversations[0].value;
        let prompt_len = tok.encode(prompt).await?.len();
        let output_len = match fixed_output_len {
            Some(n) => n,
            None => tok.encode(&c.conversations[1].value).await?.len(),
        };
        if sharegpt_keeps(prompt_len, output_len, fixed_output_len.is_some()) {
            out.push(SampleRequest { prompt: prompt.clone(), prompt_len, expected_output_len: output_len });
        }
    }
    if out.is_empty() {
        return Err(BenchError::Dataset {
            path: path.to_path_buf(),
            message: "no conversation passes the length filters".into(),
        });
    }
    if out.len() < num_prompts {
        eprintln!("warning: only {} of the {num_prompts} requested prompts pass the ShareGPT filters", out.len());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_ranges_follow_the_ratio() {
        assert_eq!(length_range(128, 0.0), (128, 128));
        assert_eq!(length_range(100, 0.5), (50, 150));
        assert_eq!(length_range(1, 0.9), (1, 1));
    }

    #[test]
    fn sharegpt_filters() {
        assert!(sharegpt_keeps(4, 4, false));
        assert!(!sharegpt_keeps(3, 100, false));
        assert!(!sharegpt_keeps(100, 3, false));
        assert!(sharegpt_keeps(100, 3, true));
        assert!(!sharegpt_keeps(1025, 10, false));
        assert!(!sharegpt_keeps(1000, 1049, false));
        assert!(sharegpt_keeps(1000, 1048, false));
    }
}
