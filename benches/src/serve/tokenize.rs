//! The tokenizer `bench serve` uses to build prompts of exact lengths and to count tokens: a local one
//! (`--tokenizer`: a `.gguf` file, a `tokenizer.json`, or a folder holding one) or the server's own
//! `/tokenize` + `/detokenize` endpoints. Ids are bare `u32`s here, as the HTTP API carries them; a local tokenizer's
//! `TokenId`s are converted at its calls.

use std::collections::HashSet;
use std::path::Path;

use rserve_engine::TokenId;
use rserve_model_io::chat_template::{ChatMessage, ChatTemplate, TemplateSources};
use rserve_model_io::config::gguf_meta::read_gguf_header;
use rserve_model_io::tokenizer::Tokenizer;

use super::client::Client;
use super::error::BenchError;

/// Token ids drawn for random prompts when the vocabulary is unknown (server-side tokenization): low ids hold
/// special tokens on most models, and 32000 is below every common vocabulary size. `--random-vocab-size` overrides
/// the upper end.
pub const SERVER_RANDOM_ID_RANGE: (u32, u32) = (1000, 32000);

/// Local or server-side tokenization.
pub enum BenchTokenizer {
    /// A local tokenizer, with the model's chat template when its files hold one.
    Local {
        tokenizer: Box<Tokenizer>,
        special: HashSet<u32>,
        template: Option<Box<ChatTemplate>>,
    },
    Server(Client),
}

impl BenchTokenizer {
    /// Loads a local tokenizer from a `.gguf` file, a `tokenizer.json` (with a `tokenizer_config.json` beside it if
    /// there is one) or a folder holding `tokenizer.json`.
    pub fn load_local(path: &Path) -> Result<Self, BenchError> {
        let err = |e: rserve_model_io::ModelError| BenchError::Tokenizer(format!("{}: {e}", path.display()));
        let (tokenizer, template) = if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
            let content = read_gguf_header(path).map_err(err)?;
            let tokenizer = Tokenizer::from_gguf(&content).map_err(err)?;
            let sources = TemplateSources { gguf: Some(&content), ..Default::default() };
            let template = ChatTemplate::from_sources(&sources, &tokenizer).map_err(err)?;
            (tokenizer, template)
        } else {
            let json = if path.is_dir() { path.join("tokenizer.json") } else { path.to_path_buf() };
            let config = json.with_file_name("tokenizer_config.json");
            let tokenizer = Tokenizer::from_file(&json, config.exists().then_some(config.as_path())).map_err(err)?;
            let sources = TemplateSources { model_dir: json.parent(), ..Default::default() };
            let template = ChatTemplate::from_sources(&sources, &tokenizer).map_err(err)?;
            (tokenizer, template)
        };
        let special =
            (0..tokenizer.vocab_size() as u32).filter(|&id| tokenizer.is_special_token(TokenId(id))).collect();
        Ok(BenchTokenizer::Local { tokenizer: Box::new(tokenizer), special, template: template.map(Box::new) })
    }

    /// `text` as one user message rendered with the model's chat template and a generation prompt (vLLM's
    /// `apply_chat_template(..., add_generation_prompt=True, tokenize=False)`); `None` without a local template.
    pub fn chat_prompt(
        &self,
        text: &str,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Option<Result<String, BenchError>> {
        match self {
            BenchTokenizer::Local { template: Some(t), .. } => Some(
                t.render_with(&[ChatMessage::new("user", text)], true, kwargs)
                    .map_err(|e| BenchError::Tokenizer(format!("chat template: {e}"))),
            ),
            _ => None,
        }
    }

    /// Ids of `text`, no special tokens added.
    pub async fn encode(&self, text: &str) -> Result<Vec<u32>, BenchError> {
        match self {
            BenchTokenizer::Local { tokenizer, .. } => {
                let ids = tokenizer.encode(text, false).map_err(|e| BenchError::Tokenizer(e.to_string()))?;
                Ok(ids.into_iter().map(|t| t.0).collect())
            }
            BenchTokenizer::Server(c) => c.tokenize(text).await,
        }
    }

    /// Text of `ids`.
    pub async fn decode(&self, ids: &[u32]) -> Result<String, BenchError> {
        match self {
            BenchTokenizer::Local { tokenizer, .. } => {
                let ids: Vec<TokenId> = ids.iter().copied().map(TokenId).collect();
                tokenizer.decode(&ids, false).map_err(|e| BenchError::Tokenizer(e.to_string()))
            }
            BenchTokenizer::Server(c) => c.detokenize(ids).await,
        }
    }

    /// Token count of `text` when a local tokenizer is loaded (used to count output tokens a server did not report).
    pub fn count_local(&self, text: &str) -> Option<usize> {
        match self {
            BenchTokenizer::Local { tokenizer, .. } => tokenizer.encode(text, false).ok().map(|v| v.len()),
            BenchTokenizer::Server(_) => None,
        }
    }

    /// The ids random prompts are drawn from: every non-special id of a local tokenizer, else
    /// [`SERVER_RANDOM_ID_RANGE`] (upper end replaced by `vocab_size` when given).
    pub fn random_id_pool(&self, vocab_size: Option<usize>) -> Vec<u32> {
        match self {
            BenchTokenizer::Local { tokenizer, special, .. } => {
                let n = vocab_size.unwrap_or(tokenizer.vocab_size()).min(tokenizer.vocab_size()) as u32;
                (0..n).filter(|id| !special.contains(id)).collect()
            }
            BenchTokenizer::Server(_) => {
                let (lo, hi) = SERVER_RANDOM_ID_RANGE;
                let hi = vocab_size.map_or(hi, |v| v as u32);
                (lo.min(hi / 2)..hi).collect()
            }
        }
    }
}
