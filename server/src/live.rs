//! `LiveEngine`: the `Engine` port over the real `rserve_engine` (its handle, tokenizer and chat template). The only
//! file of the server that calls the engine crate's loading and tokenizer APIs.

use futures_util::future::BoxFuture;
use rserve_engine::api::{EngineInfo, GenerateRequest, SamplingParams};
use rserve_engine::engine::{EngineConfig, EngineHandle, EngineMetrics};
use rserve_engine::structured::{Grammar, GrammarError, GrammarSpec};
use rserve_engine::{EngineError, TokenId};

use crate::port::{ChatRender, Engine, Events};

/// The running engine.
pub struct LiveEngine {
    handle: EngineHandle,
}

impl LiveEngine {
    /// Loads the model and starts the engine thread (blocking; logs the model, memory and KV cache lines).
    pub fn start(config: EngineConfig) -> Result<Self, EngineError> {
        let handle = rserve_engine::engine::start(config)?;
        Ok(Self { handle })
    }

    /// An engine started elsewhere (`-dp` replicas over MPI: `rserve_engine::engine::replicas::start_over_mpi`).
    pub fn from_handle(handle: EngineHandle) -> Self {
        Self { handle }
    }
}

impl Engine for LiveEngine {
    fn info(&self) -> &EngineInfo {
        self.handle.info()
    }

    fn metrics(&self) -> &EngineMetrics {
        self.handle.metrics()
    }

    fn default_sampling(&self) -> SamplingParams {
        self.handle.default_sampling()
    }

    fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<TokenId>, EngineError> {
        Ok(self.handle.tokenizer().encode(text, add_special_tokens)?)
    }

    fn encode_pair(&self, first: &str, second: &str) -> Result<(Vec<TokenId>, Vec<u32>), EngineError> {
        Ok(self.handle.tokenizer().encode_pair(first, second, true)?)
    }

    fn decode(&self, ids: &[TokenId], skip_special_tokens: bool) -> Result<String, EngineError> {
        Ok(self.handle.tokenizer().decode(ids, skip_special_tokens)?)
    }

    fn bos_token(&self) -> Option<String> {
        self.handle.tokenizer().bos_token()
    }

    fn render_chat(&self, chat: &ChatRender<'_>) -> Option<Result<String, EngineError>> {
        let template = self.handle.chat_template()?;
        let no_variables = serde_json::Map::new();
        let variables = chat.variables.unwrap_or(&no_variables);
        Some(
            template
                .render_request(chat.turns, chat.tools, chat.add_generation_prompt, variables)
                .map_err(EngineError::from),
        )
    }

    fn compile_grammar(&self, spec: &GrammarSpec) -> Result<Grammar, GrammarError> {
        self.handle.compile_grammar(spec)
    }

    fn submit(&self, request: GenerateRequest) -> Result<Events, EngineError> {
        self.handle.submit(request).map(Events::live)
    }

    fn shutdown(&self) {
        self.handle.shutdown();
    }

    fn is_alive(&self) -> bool {
        self.handle.is_alive()
    }

    fn reset_prefix_cache(&self, preempt_running: bool) -> BoxFuture<'static, Result<bool, EngineError>> {
        let reset = self.handle.reset_prefix_cache(preempt_running);
        Box::pin(async move { reset.await.map(|r| r.complete) })
    }
}
