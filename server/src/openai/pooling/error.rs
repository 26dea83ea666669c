//! `PoolingError`: the rules of the pooling routes (`/v1/embeddings`, `/pooling`, `/classify`, `/score`, `/rerank`)
//! and of the generation routes on a pooling model, one variant per rule. Every one is a 400 naming its field.

use std::fmt;

use crate::openai::validate::ValidationError;

/// An API, by the name vLLM gives it in "The model does not support ... API".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Embeddings,
    Pooling,
    Classification,
    Score,
    Rerank,
    ChatCompletions,
    Completions,
    Responses,
}

impl fmt::Display for Api {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Api::Embeddings => "Embeddings",
            Api::Pooling => "Pooling",
            Api::Classification => "Classification",
            Api::Score => "Score",
            Api::Rerank => "Rerank (Score)",
            Api::ChatCompletions => "Chat Completions",
            Api::Completions => "Completions",
            Api::Responses => "Responses",
        })
    }
}

/// A broken rule of a pooling request (or a generation request on a pooling model).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PoolingError {
    /// The served model is of the other runner (generate vs pooling), or pools for the other task.
    #[error("The model does not support {0} API")]
    Unsupported(Api),
    /// A rule shared with the generation routes (token ids, tokenization, chat messages).
    #[error(transparent)]
    Validation(#[from] ValidationError),
    #[error("either input or messages is required")]
    MissingInput,
    #[error("{0} must not be empty")]
    Empty(&'static str),
    #[error("encoding_format must be \"float\" or \"base64\", got {0:?}")]
    EncodingFormat(String),
    #[error("task must be \"embed\" or \"classify\", got {0:?}")]
    Task(String),
    /// A field vLLM acts on, with a value this server does not produce.
    #[error("{field} {value:?} is not supported (served: {served})")]
    UnsupportedValue { field: &'static str, value: String, served: &'static str },
    #[error(
        "Model \"{model}\" does not support matryoshka representation, changing output dimensions will lead to poor \
         results."
    )]
    NotMatryoshka { model: String },
    #[error("dimensions must be between 1 and {max} (the model's embedding size), got {value}")]
    DimensionsOutOfRange { value: i64, max: usize },
    #[error(
        "Model \"{model}\" only supports {allowed:?} matryoshka dimensions, use other output dimensions will lead to \
         poor results."
    )]
    DimensionsNotAllowed { model: String, allowed: Vec<usize> },
    #[error("dimensions applies to embeddings only")]
    DimensionsWithoutEmbed,
    #[error("truncate_prompt_tokens must be -1 (the context length) or a positive integer, got {0}")]
    Truncation(i64),
    #[error(
        "truncate_prompt_tokens value ({value}) is greater than max_model_len ({max_model_len}). Please, select a \
         smaller truncation size."
    )]
    TruncationTooLarge { value: i64, max_model_len: usize },
    #[error(
        "This model's maximum context length is {max_model_len} tokens. However, you requested {tokens} tokens in \
         the input for {what}. Please reduce the length of the input, or set truncate_prompt_tokens."
    )]
    TooLong { param: &'static str, tokens: usize, max_model_len: usize, what: &'static str },
    #[error(
        "{param} has {tokens} tokens, more than one engine step computes ({limit}, --max-num-batched-tokens). This \
         model attends both ways, so a whole input must fit in one step: shorten the input, set \
         truncate_prompt_tokens, or raise --max-num-batched-tokens."
    )]
    OverStepBudget { param: &'static str, tokens: usize, limit: usize },
    #[error("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")]
    ContinueWithGenerationPrompt,
    #[error("{first_field} and {second_field} must pair up 1:1, 1:N or N:N, got {first} and {second} inputs")]
    ScoreLengths { first_field: &'static str, second_field: &'static str, first: usize, second: usize },
    #[error("text_1 and text_2 (or queries and documents) are required")]
    ScoreInputsMissing,
    #[error("top_n must be at least 0, got {0}")]
    TopN(i64),
}

impl PoolingError {
    /// The request field the error is about.
    pub fn param(&self) -> Option<String> {
        use PoolingError as P;
        let p: &str = match self {
            P::Unsupported(_) => "model",
            P::Validation(v) => return v.param(),
            P::MissingInput => "input",
            P::Empty(field) => field,
            P::EncodingFormat(_) => "encoding_format",
            P::Task(_) => "task",
            P::UnsupportedValue { field, .. } => field,
            P::NotMatryoshka { .. }
            | P::DimensionsOutOfRange { .. }
            | P::DimensionsNotAllowed { .. }
            | P::DimensionsWithoutEmbed => "dimensions",
            P::Truncation(_) | P::TruncationTooLarge { .. } => "truncate_prompt_tokens",
            P::TooLong { param, .. } | P::OverStepBudget { param, .. } => param,
            P::ContinueWithGenerationPrompt => "continue_final_message",
            P::ScoreLengths { second_field, .. } => second_field,
            P::ScoreInputsMissing => "text_1",
            P::TopN(_) => "top_n",
        };
        Some(p.to_owned())
    }
}
