//! The engine's public request/response types: what the server hands in and gets back.
//!
//! A request is validated by the server into a `GenerateRequest` (token ids, sampling and stop settings); the engine
//! answers with a stream of `RequestEvent`s. Nothing here parses JSON. Token ids are [`TokenId`]s, not bare numbers.

use crate::structured::Grammar;
use crate::TokenId;

/// Sampling settings of one request (already validated: ranges hold).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// 1.0 disables.
    pub top_p: f32,
    /// 0 (or -1 on the wire) disables.
    pub top_k: usize,
    /// 0.0 disables.
    pub min_p: f32,
    pub seed: Option<u64>,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// 1.0 disables.
    pub repetition_penalty: f32,
    /// (token id, bias) pairs added to the logits before sampling.
    pub logit_bias: Vec<(TokenId, f32)>,
    /// Return the sampled token's log-probability and this many top alternatives (None: no log-probs).
    pub logprobs: Option<usize>,
    /// vLLM's `prompt_logprobs`: the log-probability of every prompt token after the first, given the tokens before
    /// it, with this many top alternatives (None: none). Such a request is not served from the prefix cache: its
    /// whole prompt is computed, as vLLM does, so every position has logits.
    pub prompt_logprobs: Option<usize>,
    /// Structured output: every sampled token keeps the text a prefix of a sentence of this grammar.
    pub constraint: Option<Grammar>,
    /// The grammar starts only once the output holds these ids (a reasoning parser's end marker: vLLM applies
    /// structured outputs to the text after the reasoning); the marker itself is not part of the grammar's text.
    /// `None`: from the first output token.
    pub constraint_after: Option<Vec<TokenId>>,
    /// vLLM's `allowed_token_ids`: only these ids may be sampled (sorted, deduplicated).
    pub allowed_token_ids: Option<Vec<TokenId>>,
    /// vLLM's `bad_words` as token sequences: the last token of a sequence is banned when the output so far ends
    /// with the rest of it.
    pub bad_words: Vec<Vec<TokenId>>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            seed: None,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            logit_bias: Vec::new(),
            logprobs: None,
            prompt_logprobs: None,
            constraint: None,
            constraint_after: None,
            allowed_token_ids: None,
            bad_words: Vec::new(),
        }
    }
}

/// When a request stops.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StopParams {
    /// Maximum new tokens (always set: the server defaults it to the rest of the context).
    pub max_tokens: usize,
    pub min_tokens: usize,
    /// Extra stop token ids (the model's EOS ids are added unless `ignore_eos`).
    pub stop_token_ids: Vec<TokenId>,
    pub ignore_eos: bool,
    /// Stop strings, matched across token boundaries; the matched string is not part of the output.
    pub stop: Vec<String>,
    /// Whether special tokens are left out of the text (default true).
    pub skip_special_tokens: bool,
    /// vLLM's `include_stop_str_in_output`: the matched stop string (or the stop token's text) ends the output
    /// instead of being cut from it.
    pub include_stop_str_in_output: bool,
}

/// One request, as the engine takes it: a generation, or on a pooling model (`--runner pooling`) a pooling request,
/// whose prompt is run once and pooled, with no token generated (`sampling` and `stop` are then not read).
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub prompt_token_ids: Vec<TokenId>,
    pub sampling: SamplingParams,
    pub stop: StopParams,
    /// Set on a pooling model's requests, and only there.
    pub pooling: Option<PoolingParams>,
}

/// What a pooling request asks of the model's pooler (vLLM's pooling tasks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PoolingTask {
    /// One vector per input: the pooled hidden state (sentence-transformers' Pooling, Dense and Normalize).
    Embed,
    /// The classifier head's scores per input (a `...ForSequenceClassification` model: its labels; a
    /// cross-encoder's relevance of a (query, document) pair).
    Classify,
}

impl PoolingTask {
    pub fn as_str(self) -> &'static str {
        match self {
            PoolingTask::Embed => "embed",
            PoolingTask::Classify => "classify",
        }
    }
}

/// A pooling request's settings (already validated against the model's `PoolingInfo`).
#[derive(Debug, Clone, PartialEq)]
pub struct PoolingParams {
    pub task: PoolingTask,
    /// Embed: L2-normalise the vector (None: as the model's pooler config says).
    pub normalize: Option<bool>,
    /// Embed: keep the first `dimensions` values (Matryoshka), before normalising.
    pub dimensions: Option<usize>,
    /// Classify: apply the model's activation to the logits (softmax over labels, sigmoid for one label); false
    /// returns the raw logits (vLLM's `activation`).
    pub activation: bool,
    /// The segment of each prompt token (a BERT pair's `token_type_ids`: 0 for the query, 1 for the document);
    /// None: every token is segment 0. Same length as the prompt.
    pub token_type_ids: Option<Vec<u32>>,
}

impl PoolingParams {
    /// A plain request for `task` with the model's defaults.
    pub fn new(task: PoolingTask) -> Self {
        Self { task, normalize: None, dimensions: None, activation: true, token_type_ids: None }
    }
}

/// What a pooling model serves, for validation and `/v1/models`.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolingInfo {
    /// The tasks it serves (a classifier serves `Classify`, an embedder `Embed`).
    pub tasks: Vec<PoolingTask>,
    /// Length of an embedding (after the sentence-transformers Dense layers, if any).
    pub embed_dim: usize,
    /// Embed: whether `dimensions` may cut the vector (the config's `is_matryoshka` / `matryoshka_dimensions`), and
    /// the sizes it allows (empty: any size up to `embed_dim`).
    pub matryoshka: Option<Vec<usize>>,
    /// Classify: the label of each output, by index (`id2label`; `LABEL_i` when the config names none).
    pub labels: Vec<String>,
    /// A cross-encoder: `/score` and `/rerank` feed the (query, document) pair to the model as one input
    /// (tokenized as a pair); otherwise they compare the two inputs' embeddings by cosine similarity.
    pub cross_encoder: bool,
    /// Whether the model attends both ways (an encoder such as BERT): a prompt is never split across steps, so it
    /// must fit in one step's token budget.
    pub bidirectional: bool,
}

/// Why a request finished, as OpenAI reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// Stop token or stop string.
    Stop,
    /// `max_tokens` or the context limit.
    Length,
    /// Aborted (client gone, shutdown).
    Abort,
}

impl FinishReason {
    /// Every reason, in the order of `index`.
    pub const ALL: [FinishReason; 3] = [FinishReason::Stop, FinishReason::Length, FinishReason::Abort];

    /// The reason's position in `ALL`.
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }
}

/// What stopped a request that finished with `FinishReason::Stop`, as vLLM reports it in `stop_reason`: a user stop
/// token id or stop string. Stopping on the model's EOS has none (vLLM's null).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    Token(TokenId),
    Text(String),
}

/// Log-probability of one token and its top alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token_id: TokenId,
    pub token: String,
    pub logprob: f32,
    /// Top alternatives, highest first: (id, text, logprob).
    pub top: Vec<(TokenId, String, f32)>,
}

/// Token counts of a finished request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
}

/// What the engine streams back for one request, in order: zero or more `Delta`s, then exactly one `Finished`.
#[derive(Debug, Clone, PartialEq)]
pub enum RequestEvent {
    /// New output: the text is safe to show (complete UTF-8, not part of a possible stop string).
    Delta { text: String, token_ids: Vec<TokenId>, logprobs: Vec<TokenLogprob> },
    /// The request ended; `text` is any text held back until now.
    Finished { reason: FinishReason, usage: Usage, stop_reason: Option<StopReason> },
    /// The engine failed to run this request (internal error); no more events follow.
    Error(String),
    /// `prompt_logprobs`: the first prompt token's text (nothing scores it), then the log-probs of every later prompt
    /// token given the ones before it; sent once, before the first `Delta`.
    PromptLogprobs { first: String, scored: Vec<TokenLogprob> },
    /// A pooling request's result (an embedding, or the classifier's scores), sent once, just before `Finished`.
    Pooled { data: Vec<f32> },
}

/// Static facts about the loaded engine, for `/v1/models`, validation and start-up logs.
#[derive(Debug, Clone)]
pub struct EngineInfo {
    pub model_path: String,
    pub max_model_len: usize,
    pub vocab_size: usize,
    pub block_size: usize,
    pub num_kv_blocks: usize,
    pub kv_cache_bytes: u64,
    pub weights_bytes: u64,
    pub dtype: String,
    pub device: String,
    pub max_num_seqs: usize,
    pub eos_token_ids: Vec<TokenId>,
    /// Most log-probs a request may ask for (`--max-logprobs`; the vocabulary size for -1).
    pub max_logprobs: usize,
    /// `max_tokens` of a request that sends none (capped by the room left in the context): the generation config's
    /// `max_new_tokens`, as vLLM takes it; None: the room left in the context.
    pub default_max_tokens: Option<usize>,
    /// The most `max_tokens` any request gets, whatever it asks for (vLLM's `override_max_tokens`:
    /// `--override-generation-config`'s `max_new_tokens`, or a `--generation-config` folder's); None: no cap.
    pub max_tokens_cap: Option<usize>,
    /// Set when the model is served for pooling (`--runner pooling`): what it pools. Such an engine serves pooling
    /// requests only; a generation model serves none.
    pub pooling: Option<PoolingInfo>,
    /// The most tokens one step computes (`--max-num-batched-tokens`): a bidirectional model's prompt must fit.
    pub max_num_batched_tokens: usize,
}
