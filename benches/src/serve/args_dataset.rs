//! The dataset flags of `rserve bench serve` (vLLM's names and defaults): which prompts to send and how long their
//! outputs are. Every dataset name vLLM knows parses; the ones rserve cannot build are refused with one line in
//! [`DatasetName::unsupported`].

use std::path::PathBuf;

use clap::{Args, ValueEnum};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DatasetName {
    /// A ShareGPT-format JSON file (`--dataset-path`).
    Sharegpt,
    #[value(name = "burstgpt")]
    BurstGpt,
    /// Random token ids of `--random-input-len` tokens (see `--random-range-ratio`, `--random-prefix-len`).
    Random,
    #[value(name = "random-mm")]
    RandomMm,
    #[value(name = "random-rerank")]
    RandomRerank,
    Hf,
    /// A JSONL file with a "prompt" (and optionally "output_tokens") per line (`--dataset-path`).
    Custom,
    #[value(name = "custom_audio")]
    CustomAudio,
    #[value(name = "custom_image")]
    CustomImage,
    #[value(name = "prefix_repetition")]
    PrefixRepetition,
    #[value(name = "spec_bench")]
    SpecBench,
    #[value(name = "speed_bench")]
    SpeedBench,
    #[value(name = "timed_trace")]
    TimedTrace,
    /// Lines of a text file (vLLM's benchmarks/sonnet.txt) picked at random after a shared prefix
    /// (`--dataset-path`; vLLM dropped it in 0.11, rserve keeps it).
    Sonnet,
}

impl DatasetName {
    /// The name as the flag spells it.
    pub fn name(self) -> String {
        self.to_possible_value().map(|v| v.get_name().to_owned()).unwrap_or_default()
    }

    /// Why rserve cannot build this dataset, for the ones it cannot.
    pub fn unsupported(self) -> Option<&'static str> {
        match self {
            DatasetName::Random | DatasetName::Sharegpt | DatasetName::Custom | DatasetName::Sonnet => None,
            DatasetName::Hf => Some(
                "Hugging Face datasets cannot be downloaded by rserve bench serve; save the prompts as JSONL and use \
                 --dataset-name custom",
            ),
            DatasetName::RandomMm | DatasetName::CustomAudio | DatasetName::CustomImage => {
                Some("multimodal datasets are not supported (rserve serves text models)")
            }
            DatasetName::RandomRerank => Some("reranking is not supported (rserve serves generative models)"),
            DatasetName::BurstGpt
            | DatasetName::PrefixRepetition
            | DatasetName::SpecBench
            | DatasetName::SpeedBench
            | DatasetName::TimedTrace => {
                Some("not implemented by rserve bench serve (use random, sharegpt, sonnet or custom)")
            }
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct DatasetArgs {
    #[arg(long, value_enum, default_value_t = DatasetName::Random)]
    pub dataset_name: DatasetName,
    /// The dataset file (sharegpt: JSON, custom: JSONL, sonnet: text).
    #[arg(long)]
    pub dataset_path: Option<PathBuf>,
    /// Do not repeat prompts when the file holds fewer than --num-prompts.
    #[arg(long)]
    pub no_oversample: bool,
    /// Send custom and sonnet prompts without the model's chat template.
    #[arg(long)]
    pub skip_chat_template: bool,
    /// Keep the file's order instead of shuffling with --seed.
    #[arg(long)]
    pub disable_shuffle: bool,
    /// Output tokens per custom-dataset request; -1 takes each line's "output_tokens".
    #[arg(long, default_value_t = 256, allow_negative_numbers = true)]
    pub custom_output_len: i64,
    /// Output length for ShareGPT prompts (default: the length of the recorded reply).
    #[arg(long)]
    pub sharegpt_output_len: Option<usize>,
    #[arg(long, default_value_t = 1024)]
    pub random_input_len: usize,
    #[arg(long, default_value_t = 128)]
    pub random_output_len: usize,
    /// Lengths are drawn uniformly from [len * (1 - r), len * (1 + r)]; a number, or {"input": r, "output": r}.
    #[arg(long, default_value = "0.0")]
    pub random_range_ratio: String,
    /// Tokens of one random prefix shared by every prompt, before its random part.
    #[arg(long, default_value_t = 0)]
    pub random_prefix_len: usize,
    /// rserve only: draw random prompt ids below this id (default: the local tokenizer's vocabulary without special
    /// tokens, or ids 1000..32000 with server-side tokenization).
    #[arg(long)]
    pub random_vocab_size: Option<usize>,
    /// Sonnet: prompt tokens (at most).
    #[arg(long, default_value_t = 550)]
    pub sonnet_input_len: usize,
    #[arg(long, default_value_t = 150)]
    pub sonnet_output_len: usize,
    /// Sonnet: tokens of the shared prefix (the file's first lines).
    #[arg(long, default_value_t = 200)]
    pub sonnet_prefix_len: usize,
}

/// `--random-range-ratio`: one ratio for both lengths or one each.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RangeRatio {
    pub input: f64,
    pub output: f64,
}

impl RangeRatio {
    /// Parses `0.3` or `{"input": 0.3, "output": 0.5}`; each must be in [0, 1).
    pub fn parse(text: &str) -> Result<Self, String> {
        let check = |r: f64| {
            if (0.0..1.0).contains(&r) {
                Ok(r)
            } else {
                Err(format!("{r} is not in [0, 1)"))
            }
        };
        if let Ok(r) = text.trim().parse::<f64>() {
            let r = check(r)?;
            return Ok(RangeRatio { input: r, output: r });
        }
        let m = super::args::json_object(text).map_err(|e| format!("'{text}' is neither a number nor {{..}}: {e}"))?;
        let get = |k: &str| match m.get(k) {
            None => Ok(0.0),
            Some(v) => v.as_f64().ok_or_else(|| format!("\"{k}\" is not a number")).and_then(check),
        };
        if let Some(k) = m.keys().find(|k| *k != "input" && *k != "output") {
            return Err(format!("unknown key \"{k}\" (use \"input\" and \"output\")"));
        }
        Ok(RangeRatio { input: get("input")?, output: get("output")? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_ratios_parse_as_number_or_object() {
        assert_eq!(RangeRatio::parse("0.25"), Ok(RangeRatio { input: 0.25, output: 0.25 }));
        assert_eq!(RangeRatio::parse(r#"{"input": 0.3, "output": 0.5}"#), Ok(RangeRatio { input: 0.3, output: 0.5 }));
        assert!(RangeRatio::parse("1.0").is_err());
        assert!(RangeRatio::parse(r#"{"in": 0.3}"#).is_err());
        assert!(RangeRatio::parse("wide").is_err());
    }

    #[test]
    fn dataset_names_are_vllms_spellings() {
        assert_eq!(DatasetName::SpecBench.name(), "spec_bench");
        assert_eq!(DatasetName::RandomMm.name(), "random-mm");
        assert!(DatasetName::Hf.unsupported().is_some());
        assert!(DatasetName::Sonnet.unsupported().is_none());
    }
}
