//! Validation of the pooling routes at the edge: which task the served model pools for, the inputs as token ids
//! (text, token ids, or a conversation through the chat template), `truncate_prompt_tokens` and the length limits
//! (the context length; a bidirectional model's one-step budget), `dimensions` against the model's Matryoshka
//! sizes, and `encoding_format`. What comes out is engine `GenerateRequest`s carrying `PoolingParams`.

use rserve_engine::api::{
    EngineInfo, GenerateRequest, PoolingInfo, PoolingParams, PoolingTask, SamplingParams, StopParams,
};
use rserve_engine::TokenId;

use super::error::{Api, PoolingError};
use super::types::EncodeRequest;
use crate::openai::request_extras;
use crate::openai::types::PromptField;
use crate::openai::validate::{self, ValidationError};
use crate::port::{ChatRender, Engine};

type Result<T> = std::result::Result<T, PoolingError>;

/// What the served model pools, when it pools for `task`; else `api` is refused as vLLM refuses it.
pub fn pooling_info(info: &EngineInfo, task: PoolingTask, api: Api) -> Result<&PoolingInfo> {
    info.pooling.as_ref().filter(|p| p.tasks.contains(&task)).ok_or(PoolingError::Unsupported(api))
}

/// A generation route (`api`) on a pooling model is refused.
pub fn refuse_on_pooling_model(info: &EngineInfo, api: Api) -> Result<()> {
    match info.pooling {
        Some(_) => Err(PoolingError::Unsupported(api)),
        None => Ok(()),
    }
}

/// How vectors are written in the response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncodingFormat {
    Float,
    /// Base64 of the vector's little-endian f32 bytes (what the OpenAI client asks for by default).
    Base64,
}

pub fn encoding_format(format: Option<&str>) -> Result<EncodingFormat> {
    match format {
        None | Some("float") => Ok(EncodingFormat::Float),
        Some("base64") => Ok(EncodingFormat::Base64),
        Some(other) => Err(PoolingError::EncodingFormat(other.to_owned())),
    }
}

/// vLLM's output options of `/v1/embeddings` and `/pooling` that change the result (`embed_dtype`, `endianness`,
/// `truncation_side`): the values this server produces pass, any other is refused rather than ignored.
pub fn served_options(req: &EncodeRequest) -> Result<()> {
    let check = |field: &'static str, value: &Option<String>, ok: &[&str], served: &'static str| match value {
        Some(v) if !ok.contains(&v.as_str()) => Err(PoolingError::UnsupportedValue { field, value: v.clone(), served }),
        _ => Ok(()),
    };
    check("embed_dtype", &req.embed_dtype, &["float32"], "float32")?;
    check("endianness", &req.endianness, &["native", "little"], "native, little")?;
    check("truncation_side", &req.truncation_side, &["left"], "left: the last tokens are kept")
}

/// `dimensions`, checked against the model's Matryoshka support (`model`: the served name, for the message).
pub fn dimensions(value: Option<i64>, pooling: &PoolingInfo, model: &str) -> Result<Option<usize>> {
    let Some(value) = value else { return Ok(None) };
    let Some(allowed) = &pooling.matryoshka else {
        return Err(PoolingError::NotMatryoshka { model: model.to_owned() });
    };
    let max = pooling.embed_dim;
    let n = usize::try_from(value)
        .ok()
        .filter(|&n| n >= 1 && n <= max)
        .ok_or(PoolingError::DimensionsOutOfRange { value, max })?;
    if !allowed.is_empty() && !allowed.contains(&n) {
        return Err(PoolingError::DimensionsNotAllowed { model: model.to_owned(), allowed: allowed.clone() });
    }
    Ok(Some(n))
}

/// How long an input may be, and how it is cut first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// `truncate_prompt_tokens`: keep only this many of an input's last tokens.
    pub truncate: Option<usize>,
    pub max_model_len: usize,
    /// A bidirectional model's inputs are never split across steps: each must fit one step's token budget.
    pub step_budget: Option<usize>,
    /// What the input is for, in the too-long message ("embedding generation").
    pub what: &'static str,
}

impl Limits {
    /// The limits of `info`'s model with the request's `truncate_prompt_tokens` (-1: the context length).
    pub fn new(info: &EngineInfo, truncate: Option<i64>, what: &'static str) -> Result<Self> {
        let max_model_len = info.max_model_len;
        let truncate = match truncate {
            None => None,
            Some(-1) => Some(max_model_len),
            Some(k) if k >= 1 => match usize::try_from(k) {
                Ok(k) if k <= max_model_len => Some(k),
                _ => return Err(PoolingError::TruncationTooLarge { value: k, max_model_len }),
            },
            Some(k) => return Err(PoolingError::Truncation(k)),
        };
        let bidirectional = info.pooling.as_ref().is_some_and(|p| p.bidirectional);
        let step_budget = bidirectional.then_some(info.max_num_batched_tokens);
        Ok(Self { truncate, max_model_len, step_budget, what })
    }

    /// Cuts an input (and its segments) to `truncate`, keeping its last tokens as vLLM does, then checks it fits.
    pub fn fit(
        &self,
        param: &'static str,
        mut ids: Vec<TokenId>,
        mut types: Option<Vec<u32>>,
    ) -> Result<(Vec<TokenId>, Option<Vec<u32>>)> {
        if let Some(k) = self.truncate {
            if ids.len() > k {
                let cut = ids.len() - k;
                ids.drain(..cut);
                if let Some(t) = types.as_mut() {
                    t.drain(..cut.min(t.len()));
                }
            }
        }
        let tokens = ids.len();
        if tokens == 0 {
            return Err(PoolingError::Empty(param));
        }
        if tokens > self.max_model_len {
            return Err(PoolingError::TooLong { param, tokens, max_model_len: self.max_model_len, what: self.what });
        }
        if let Some(limit) = self.step_budget.filter(|&l| tokens > l) {
            return Err(PoolingError::OverStepBudget { param, tokens, limit });
        }
        Ok((ids, types))
    }
}

/// The inputs of an `EncodeRequest` as token ids, before truncation: each `input` entry, or the one conversation of
/// `messages` rendered with the chat template.
pub fn encode_inputs(req: &EncodeRequest, engine: &dyn Engine) -> Result<Vec<Vec<TokenId>>> {
    let info = engine.info();
    let tokenize = |e: rserve_engine::EngineError| ValidationError::Tokenization(e.to_string());
    if let Some(input) = &req.input {
        let add_special_tokens = req.add_special_tokens.unwrap_or(true);
        let texts_or_ids = match input {
            PromptField::Text(s) => vec![engine.encode(s, add_special_tokens).map_err(tokenize)?],
            PromptField::Texts(v) => v
                .iter()
                .map(|s| engine.encode(s, add_special_tokens).map_err(tokenize))
                .collect::<std::result::Result<_, _>>()?,
            PromptField::Tokens(t) => vec![validate::token_ids("input", t, info)?],
            PromptField::TokenLists(v) => {
                v.iter().map(|t| validate::token_ids("input", t, info)).collect::<std::result::Result<_, _>>()?
            }
        };
        if texts_or_ids.is_empty() {
            return Err(PoolingError::Empty("input"));
        }
        return Ok(texts_or_ids);
    }
    let Some(messages) = &req.messages else { return Err(PoolingError::MissingInput) };
    let add_generation_prompt = req.add_generation_prompt.unwrap_or(false);
    let continue_final = req.continue_final_message.unwrap_or(false);
    if add_generation_prompt && continue_final {
        return Err(PoolingError::ContinueWithGenerationPrompt);
    }
    let turns = validate::chat_turns(messages)?;
    if turns.is_empty() {
        return Err(ValidationError::MessagesEmpty.into());
    }
    let render =
        ChatRender { turns: &turns, tools: None, add_generation_prompt, variables: req.chat_template_kwargs.as_ref() };
    let mut text = engine
        .render_chat(&render)
        .ok_or(ValidationError::NoChatTemplate)?
        .map_err(|e| ValidationError::ChatTemplate(e.to_string()))?;
    if continue_final {
        let last = turns.last().map(|t| t.content.as_str()).unwrap_or_default();
        text = request_extras::cut_after_final_message(&text, last)?;
    }
    // The template writes the special tokens, so none are added by default (vLLM's EmbeddingChatRequest).
    let ids = engine.encode(&text, req.add_special_tokens.unwrap_or(false)).map_err(tokenize)?;
    Ok(vec![ids])
}

/// One engine request that pools `ids` (the engine reads neither sampling nor stop settings of a pooling request).
pub fn request(ids: Vec<TokenId>, pooling: PoolingParams) -> GenerateRequest {
    GenerateRequest {
        prompt_token_ids: ids,
        sampling: SamplingParams::default(),
        stop: StopParams { max_tokens: 1, ..StopParams::default() },
        pooling: Some(pooling),
    }
}

/// The engine requests of an `EncodeRequest`: each input tokenized, cut and checked by `limits`, pooled with
/// `pooling`.
pub fn requests(
    req: &EncodeRequest,
    engine: &dyn Engine,
    limits: &Limits,
    pooling: &PoolingParams,
) -> Result<Vec<GenerateRequest>> {
    let param = if req.input.is_some() { "input" } else { "messages" };
    encode_inputs(req, engine)?
        .into_iter()
        .map(|ids| {
            let (ids, _) = limits.fit(param, ids, None)?;
            Ok(request(ids, pooling.clone()))
        })
        .collect()
}
