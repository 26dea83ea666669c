//! The server's one view of the engine: the `Engine` trait (what routes may ask of the engine) and `Events` (the
//! event stream of one submitted request). The live implementation over `rserve_engine` is in `live.rs`; unit tests
//! use a fake (`testing.rs`). Dropping an `Events` aborts its request.

use futures_util::future::BoxFuture;
use rserve_engine::api::{EngineInfo, GenerateRequest, RequestEvent, SamplingParams};
use rserve_engine::engine::{EngineMetrics, RequestStream};
use rserve_engine::structured::{Grammar, GrammarError, GrammarSpec};
use rserve_engine::{EngineError, TokenId};

/// One chat message as the chat template sees it: role, plain-text content (parts joined), and where present an
/// assistant's `tool_calls` (arguments already parsed into objects, as vLLM does), a tool result's `tool_call_id`,
/// a `name`. The engine's own message type: validation builds it, the template reads it as it is.
pub use rserve_engine::chat_template::ChatMessage as ChatTurn;

/// What `Engine::render_chat` renders: the conversation, the request's `tools` (OpenAI function tools as sent; the
/// engine hands them to the template in vLLM's shape), and whether to open the assistant's turn.
#[derive(Debug, Clone, Copy)]
pub struct ChatRender<'a> {
    pub turns: &'a [ChatTurn],
    pub tools: Option<&'a [serde_json::Value]>,
    pub add_generation_prompt: bool,
    /// Further template variables: `documents` and the request's `chat_template_kwargs`.
    pub variables: Option<&'a serde_json::Map<String, serde_json::Value>>,
}

/// What the HTTP layer needs from the engine.
pub trait Engine: Send + Sync + 'static {
    /// Static facts: context length, vocabulary size, KV cache shape.
    fn info(&self) -> &EngineInfo;
    /// Live counters and gauges (of the first replica under `-dp`; it also holds the per-API-request histograms).
    fn metrics(&self) -> &EngineMetrics;
    /// Every replica's metrics, in replica order (one without `-dp`): `/metrics` and the stats line show them all.
    fn replica_metrics(&self) -> Vec<&EngineMetrics> {
        vec![self.metrics()]
    }
    /// Sampling defaults (the model's generation_config.json over OpenAI's defaults).
    fn default_sampling(&self) -> SamplingParams;
    /// Text to token ids.
    fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<TokenId>, EngineError>;
    /// A (first, second) text pair to token ids and each token's segment (`token_type_ids`), as the tokenizer's pair
    /// template joins them (cross-encoder inputs).
    fn encode_pair(&self, first: &str, second: &str) -> Result<(Vec<TokenId>, Vec<u32>), EngineError>;
    /// Token ids to text.
    fn decode(&self, ids: &[TokenId], skip_special_tokens: bool) -> Result<String, EngineError>;
    /// The tokenizer's BOS token string, if any.
    fn bos_token(&self) -> Option<String>;
    /// Renders a conversation with the chat template; `None` when the model has no template.
    fn render_chat(&self, chat: &ChatRender<'_>) -> Option<Result<String, EngineError>>;
    /// Compiles a structured-output constraint against the model's vocabulary (cached per spec).
    fn compile_grammar(&self, spec: &GrammarSpec) -> Result<Grammar, GrammarError>;
    /// Queues a request.
    fn submit(&self, request: GenerateRequest) -> Result<Events, EngineError>;
    /// Stops the engine thread (aborting what is left).
    fn shutdown(&self);
    /// False once the engine thread has stopped: nothing can be served, and `/health` says so with 503.
    fn is_alive(&self) -> bool;
    /// Drops the prefix cache's blocks no request holds, first preempting the running requests with
    /// `preempt_running`; true when nothing was in use, so the whole cache is gone (vLLM's `success`).
    fn reset_prefix_cache(&self, preempt_running: bool) -> BoxFuture<'static, Result<bool, EngineError>>;
}

/// The events of one request, in order: `Delta`s, then one `Finished` (or `Error`); `None` afterwards.
pub struct Events {
    inner: Inner,
    done: bool,
    /// Dropped with the events, after the stream: what the data-parallel router counts in flight.
    _guard: Option<Box<dyn Send + Sync>>,
}

enum Inner {
    Live(RequestStream),
    #[cfg(test)]
    Channel(tokio::sync::mpsc::UnboundedReceiver<RequestEvent>),
}

impl Events {
    pub fn live(stream: RequestStream) -> Self {
        Self { inner: Inner::Live(stream), done: false, _guard: None }
    }

    /// These events, holding `guard` until they are dropped.
    pub fn with_guard(mut self, guard: Box<dyn Send + Sync>) -> Self {
        self._guard = Some(guard);
        self
    }

    /// Events fed by a channel (test fakes); dropping the `Events` closes the channel, which the fake sees as abort.
    #[cfg(test)]
    pub fn channel(rx: tokio::sync::mpsc::UnboundedReceiver<RequestEvent>) -> Self {
        Self { inner: Inner::Channel(rx), done: false, _guard: None }
    }

    /// The next event, or `None` once the request has ended (a closed channel also ends it).
    pub async fn next(&mut self) -> Option<RequestEvent> {
        if self.done {
            return None;
        }
        let ev = match &mut self.inner {
            Inner::Live(s) => s.next().await,
            #[cfg(test)]
            Inner::Channel(rx) => rx.recv().await,
        };
        if matches!(ev, None | Some(RequestEvent::Finished { .. }) | Some(RequestEvent::Error(_))) {
            self.done = true;
        }
        ev
    }
}
