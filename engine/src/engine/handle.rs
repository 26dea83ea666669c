//! `EngineHandle`: the cloneable front of the engine thread. The server holds one; it sends commands and receives
//! per-request event streams. Dropping a `RequestStream` aborts its request (its KV blocks are freed at once).

use std::sync::Arc;

use tokio::sync::mpsc;

use crate::api::{EngineInfo, GenerateRequest, RequestEvent};
use crate::chat_template::ChatTemplate;
use crate::engine::metrics::EngineMetrics;
use crate::error::EngineError;
use crate::structured::{Grammar, GrammarCompiler, GrammarError, GrammarSpec};
use crate::tokenizer::Tokenizer;
pub use rserve_scheduler::PrefixCacheReset;
use rserve_scheduler::RequestId;

/// Commands the engine thread takes.
#[derive(Debug)]
pub(crate) enum Command {
    Add {
        id: RequestId,
        request: Box<GenerateRequest>,
        events: mpsc::UnboundedSender<RequestEvent>,
    },
    Abort {
        id: RequestId,
    },
    /// `POST /reset_prefix_cache`: drop the cached blocks no request holds (after preempting the running requests
    /// with `preempt_running`), then answer what was done.
    ResetPrefixCache {
        preempt_running: bool,
        reply: tokio::sync::oneshot::Sender<PrefixCacheReset>,
    },
    Shutdown,
}

/// A cloneable handle to the engine thread.
#[derive(Clone)]
pub struct EngineHandle {
    pub(crate) tx: std::sync::mpsc::Sender<Command>,
    pub(crate) info: Arc<EngineInfo>,
    pub(crate) metrics: Arc<EngineMetrics>,
    pub(crate) tokenizer: Arc<Tokenizer>,
    pub(crate) chat_template: Option<Arc<ChatTemplate>>,
    pub(crate) next_id: Arc<std::sync::atomic::AtomicU64>,
    pub(crate) default_sampling: crate::api::SamplingParams,
    /// The engine thread, joined by the first `shutdown`.
    pub(crate) thread: Arc<std::sync::Mutex<Option<std::thread::JoinHandle<()>>>>,
    /// Set by the engine thread when a panic ended it (before it fails the requests it held).
    pub(crate) dead: Arc<std::sync::atomic::AtomicBool>,
    /// The grammar engine, built by the first structured-output request (a server that gets none pays nothing).
    pub(crate) grammars: Arc<std::sync::OnceLock<Result<GrammarCompiler, GrammarError>>>,
}

/// The events of one request. Dropping it before `Finished` aborts the request.
pub struct RequestStream {
    pub id: RequestId,
    rx: mpsc::UnboundedReceiver<RequestEvent>,
    tx: std::sync::mpsc::Sender<Command>,
    done: bool,
}

impl RequestStream {
    /// The next event; `None` once the request has finished (after its `Finished`/`Error` event).
    pub async fn next(&mut self) -> Option<RequestEvent> {
        if self.done {
            return None;
        }
        let ev = self.rx.recv().await;
        match &ev {
            Some(RequestEvent::Finished { .. }) | Some(RequestEvent::Error(_)) | None => self.done = true,
            _ => {}
        }
        ev
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        if !self.done {
            // The engine may already be gone at shutdown; nothing to free then.
            let _ = self.tx.send(Command::Abort { id: self.id });
        }
    }
}

impl EngineHandle {
    /// Queue a request. Errors: the engine thread has stopped, or the waiting queue is full.
    pub fn submit(&self, request: GenerateRequest) -> Result<RequestStream, EngineError> {
        if self.dead.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(EngineError::EngineStopped);
        }
        let id = RequestId(self.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        let (etx, erx) = mpsc::unbounded_channel();
        self.tx
            .send(Command::Add { id, request: Box::new(request), events: etx })
            .map_err(|_| EngineError::EngineStopped)?;
        Ok(RequestStream { id, rx: erx, tx: self.tx.clone(), done: false })
    }

    /// Resets the prefix cache between two steps (vLLM's `reset_prefix_cache`; see `Scheduler::reset_prefix_cache`).
    /// Errors: the engine thread has stopped.
    pub fn reset_prefix_cache(
        &self,
        preempt_running: bool,
    ) -> impl std::future::Future<Output = Result<PrefixCacheReset, EngineError>> + Send + 'static {
        let (reply, rx) = tokio::sync::oneshot::channel();
        let sent = self.tx.send(Command::ResetPrefixCache { preempt_running, reply });
        async move {
            sent.map_err(|_| EngineError::EngineStopped)?;
            rx.await.map_err(|_| EngineError::EngineStopped)
        }
    }

    /// Stops the engine after aborting what is left (the end of a graceful shutdown) and waits for its thread, so
    /// that everything it owns (KV memory, MPI peers) is released when this returns.
    pub fn shutdown(&self) {
        let _ = self.tx.send(Command::Shutdown);
        let thread = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }

    /// True while the engine thread runs: false once a panic killed it (from the moment it is caught) or it has
    /// ended (`shutdown`, or a failure that stopped it), when no request can be served any more (`/health` answers
    /// 503 then, as vLLM's does).
    pub fn is_alive(&self) -> bool {
        if self.dead.load(std::sync::atomic::Ordering::SeqCst) {
            return false;
        }
        let thread = self.thread.lock().unwrap_or_else(|p| p.into_inner());
        thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Sampling defaults from the model's generation config (temperature, top_p, ...).
    pub fn default_sampling(&self) -> crate::api::SamplingParams {
        self.default_sampling.clone()
    }

    pub fn info(&self) -> &EngineInfo {
        &self.info
    }

    pub fn metrics(&self) -> &EngineMetrics {
        &self.metrics
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Compiles a structured-output spec against the model's vocabulary (cached per spec).
    pub fn compile_grammar(&self, spec: &GrammarSpec) -> Result<Grammar, GrammarError> {
        self.grammar_compiler().as_ref().map_err(Clone::clone)?.compile(spec)
    }

    /// The grammar engine, built on first use (a structured-output request waits for it then).
    fn grammar_compiler(&self) -> &Result<GrammarCompiler, GrammarError> {
        self.grammars.get_or_init(|| {
            let t0 = std::time::Instant::now();
            let c = GrammarCompiler::new(self.tokenizer.clone(), self.info.vocab_size, &self.info.eos_token_ids);
            tracing::info!("Structured outputs: grammar engine ready in {:.2} s", t0.elapsed().as_secs_f64());
            c
        })
    }

    /// Builds the grammar engine's view of the vocabulary on a background thread at start-up, so the first
    /// structured-output requests (often many at once, from an agent framework or a benchmark) do not all wait for
    /// it; a request that comes sooner waits for the same build.
    pub(crate) fn prepare_grammars(&self) {
        let handle = self.clone();
        let spawned = std::thread::Builder::new().name("rserve-grammar".into()).spawn(move || {
            let _ = handle.grammar_compiler();
        });
        if let Err(e) = spawned {
            tracing::warn!("structured outputs: the grammar engine will be built at the first request ({e})");
        }
    }

    /// The chat template, or None when the model has none (chat requests must then be refused).
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_deref()
    }
}
