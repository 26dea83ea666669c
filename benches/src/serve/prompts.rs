//! Which prompts a run sends: the dataset the flags name, built with vLLM's rules (`--input-len` / `--output-len`
//! mapped onto the dataset's own flags, chat templates rendered here for custom and sonnet prompts unless the chat
//! API renders them, oversampling of short files), refused in one line when rserve cannot build it.

use super::args::{json_object, ServeBenchArgs};
use super::args_dataset::{DatasetName, RangeRatio};
use super::client::ApiKind;
use super::custom::{custom_requests, read_jsonl};
use super::dataset::{self, RandomSpec, SampleRequest};
use super::error::BenchError;
use super::sonnet::{self, SonnetSpec};
use super::tokenize::BenchTokenizer;

/// Builds the run's prompts.
pub async fn build(
    args: &ServeBenchArgs,
    api: ApiKind,
    tok: &BenchTokenizer,
) -> Result<Vec<SampleRequest>, BenchError> {
    let d = &args.dataset;
    if let Some(why) = d.dataset_name.unsupported() {
        return Err(BenchError::arg("--dataset-name", format!("{}: {why}", d.dataset_name.name())));
    }
    let path = || {
        d.dataset_path.clone().ok_or_else(|| {
            BenchError::arg("--dataset-path", format!("required for --dataset-name {}", d.dataset_name.name()))
        })
    };
    let kwargs = match &args.chat_template_kwargs {
        Some(t) => json_object(t).map_err(|m| BenchError::arg("--chat-template-kwargs", m))?,
        None => Default::default(),
    };
    let render = !d.skip_chat_template && api == ApiKind::Completions;
    if render
        && matches!(d.dataset_name, DatasetName::Custom | DatasetName::Sonnet)
        && tok.chat_prompt("", &kwargs).is_none()
    {
        eprintln!(
            "warning: no chat template at hand (it is read from a local --tokenizer): prompts are sent as they are, \
             as with --skip-chat-template"
        );
    }
    let format = |text: &str| -> Result<String, BenchError> {
        match tok.chat_prompt(text, &kwargs).filter(|_| render) {
            Some(r) => r,
            None => Ok(text.to_owned()),
        }
    };
    let mut requests = match d.dataset_name {
        DatasetName::Random => {
            if d.dataset_path.is_some() {
                return Err(BenchError::arg("--dataset-path", "cannot be used with --dataset-name random"));
            }
            let spec = RandomSpec {
                input_len: args.input_len.unwrap_or(d.random_input_len),
                output_len: args.output_len.unwrap_or(d.random_output_len),
                range_ratio: RangeRatio::parse(&d.random_range_ratio)
                    .map_err(|m| BenchError::arg("--random-range-ratio", m))?,
                prefix_len: d.random_prefix_len,
                num_prompts: args.num_prompts,
                seed: args.seed,
                vocab_size: d.random_vocab_size,
            };
            return dataset::random_requests(&spec, tok).await;
        }
        DatasetName::Sharegpt => {
            let out_len = args.output_len.or(d.sharegpt_output_len);
            dataset::sharegpt_requests(&path()?, args.num_prompts, out_len, args.seed, !d.disable_shuffle, tok).await?
        }
        DatasetName::Custom => {
            let path = path()?;
            let lines = read_jsonl(&path)?;
            let out_len = match args.output_len {
                Some(n) => Some(n),
                None if d.custom_output_len == -1 => None,
                None => Some(usize::try_from(d.custom_output_len).map_err(|_| {
                    BenchError::arg("--custom-output-len", "must be -1 (each line's output_tokens) or at least 0")
                })?),
            };
            let shuffle = (args.seed, !d.disable_shuffle);
            custom_requests(&path, &lines, args.num_prompts, out_len, shuffle, tok, &format).await?
        }
        DatasetName::Sonnet => {
            let lines = sonnet::read_lines(&path()?)?;
            let spec = SonnetSpec {
                input_len: args.input_len.unwrap_or(d.sonnet_input_len),
                output_len: args.output_len.unwrap_or(d.sonnet_output_len),
                prefix_len: d.sonnet_prefix_len,
                num_prompts: args.num_prompts,
                seed: args.seed,
            };
            return sonnet::sonnet_requests(&lines, &spec, tok, &format).await;
        }
        _ => return Err(BenchError::arg("--dataset-name", "not supported")),
    };
    if !d.no_oversample {
        dataset::oversample(&mut requests, args.num_prompts, args.seed);
    }
    Ok(requests)
}
