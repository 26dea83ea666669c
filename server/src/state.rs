//! `AppState`: what every route shares (the engine port, served model names, API key, admission limits), and
//! admission itself: refusing new work when the waiting queue is full or the server is shutting down, and counting
//! the requests in flight (`Admitted` decrements the count when dropped).

use crate::openai::responses::store::ResponseStore;
use crate::openai::tools::ToolSettings;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use rserve_engine::api::{GenerateRequest, RequestEvent};
use rserve_engine::EngineError;

use crate::error::ApiError;
use crate::port::{Engine, Events};

/// Settings of the HTTP layer, from the command line.
#[derive(Debug, Clone)]
pub struct ServerSettings {
    /// Names clients may use for the model; the first is reported in responses by default.
    pub served_model_names: Vec<String>,
    /// `--api-key` (or `VLLM_API_KEY`): a request must carry one of them; empty: no check.
    pub api_keys: Vec<String>,
    /// `--default-chat-template-kwargs`: template variables under each chat request's own `chat_template_kwargs`.
    pub default_chat_template_kwargs: serde_json::Map<String, serde_json::Value>,
    /// Refuse new requests (503) while this many are waiting.
    pub max_num_waiting: usize,
    /// `--disable-access-log-for-endpoints`: paths the access log leaves out (`/health`, `/metrics`, ...).
    pub access_log_skip: Vec<String>,
    /// `--enable-request-id-headers`: responses carry `X-Request-Id`.
    pub request_id_headers: bool,
    /// `--max-num-queued-reqs`: refuse new requests (503) while this many are in flight (waiting or running).
    pub max_num_queued_reqs: Option<usize>,
    /// Log one line per accepted request.
    pub log_requests: bool,
    /// `--enable-auto-tool-choice` and `--tool-call-parser`.
    pub tools: ToolSettings,
    /// `--reasoning-parser`: how chat answers split into reasoning and content.
    pub reasoning: Option<crate::openai::reasoning::ReasoningParser>,
    /// `--enable-server-load-tracking`: count the generation requests in progress for `/load`.
    pub server_load_tracking: bool,
    /// `VLLM_SERVER_DEV_MODE`: the development routes are served, and `/server_info` answers with this.
    pub dev_mode: Option<ServerInfo>,
}

/// What `GET /server_info` reports (vLLM's development route): the configuration as `(name, value)` pairs in
/// vLLM's order of importance, and the environment.
#[derive(Debug, Clone, Default)]
pub struct ServerInfo {
    pub config: Vec<(&'static str, serde_json::Value)>,
}

/// Shared state of all routes (cheap to clone).
#[derive(Clone)]
pub struct AppState {
    pub engine: Arc<dyn Engine>,
    pub settings: Arc<ServerSettings>,
    in_flight: Arc<AtomicUsize>,
    shutting_down: Arc<AtomicBool>,
    server_load: Arc<AtomicUsize>,
    /// Finished Responses-API responses, for retrieval and `previous_response_id`.
    pub responses: Arc<ResponseStore>,
}

/// One generation request counted by `/load` (vLLM's `server_load_metrics`) until it is dropped.
pub struct LoadSlot(Arc<AtomicUsize>);

impl Drop for LoadSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A submitted request's events plus its slot in the in-flight count.
pub struct Admitted {
    events: Events,
    _slot: InFlightSlot,
}

impl Admitted {
    pub async fn next(&mut self) -> Option<RequestEvent> {
        self.events.next().await
    }
}

struct InFlightSlot(Arc<AtomicUsize>);

impl Drop for InFlightSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl AppState {
    pub fn new(engine: Arc<dyn Engine>, settings: ServerSettings) -> Self {
        Self {
            engine,
            settings: Arc::new(settings),
            in_flight: Arc::new(AtomicUsize::new(0)),
            shutting_down: Arc::new(AtomicBool::new(false)),
            server_load: Arc::new(AtomicUsize::new(0)),
            responses: Arc::new(ResponseStore::default()),
        }
    }

    /// Generation requests in progress (with `--enable-server-load-tracking`; 0 without).
    pub fn server_load(&self) -> usize {
        self.server_load.load(Ordering::Relaxed)
    }

    /// Counts one generation request for `/load` until the slot is dropped; `None` without
    /// `--enable-server-load-tracking`.
    pub fn track_load(&self) -> Option<LoadSlot> {
        self.settings.server_load_tracking.then(|| {
            self.server_load.fetch_add(1, Ordering::Relaxed);
            LoadSlot(self.server_load.clone())
        })
    }

    /// The served name a request refers to (the first served name when it names none).
    pub fn resolve_model(&self, requested: Option<&str>) -> Result<String, ApiError> {
        let names = &self.settings.served_model_names;
        match requested {
            None | Some("") => Ok(names.first().cloned().unwrap_or_default()),
            Some(m) if names.iter().any(|n| n == m) => Ok(m.to_owned()),
            Some(m) => Err(ApiError::ModelNotFound(m.to_owned())),
        }
    }

    /// From now on, new requests get 503.
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    /// Requests submitted and not yet dropped.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Waiting requests: the engine's gauge (summed over the data-parallel replicas), or what the server knows it
    /// submitted beyond those running (the gauge is updated once per engine step and lags behind a burst).
    pub fn waiting_estimate(&self) -> usize {
        let replicas = self.engine.replica_metrics();
        let waiting: usize = replicas.iter().map(|m| m.num_requests_waiting.get().max(0) as usize).sum();
        let running: usize = replicas.iter().map(|m| m.num_requests_running.get().max(0) as usize).sum();
        waiting.max(self.in_flight().saturating_sub(running))
    }

    /// Logs one API request (`id`, with `--enable-log-requests`), then submits all its choices, or none of them.
    pub fn submit_all(
        &self,
        id: &str,
        prompt_tokens: usize,
        requests: Vec<GenerateRequest>,
    ) -> Result<Vec<Admitted>, ApiError> {
        self.log_request(id, prompt_tokens, &requests);
        if self.shutting_down.load(Ordering::SeqCst) {
            return Err(ApiError::ShuttingDown);
        }
        let waiting = self.waiting_estimate();
        let limit = self.settings.max_num_waiting;
        if waiting >= limit {
            return Err(ApiError::Overloaded { waiting, limit });
        }
        if let Some(limit) = self.settings.max_num_queued_reqs {
            let in_flight = self.in_flight();
            if in_flight >= limit {
                return Err(ApiError::AtCapacity { in_flight, limit });
            }
        }
        let mut admitted = Vec::with_capacity(requests.len());
        for request in requests {
            self.in_flight.fetch_add(1, Ordering::Relaxed);
            let slot = InFlightSlot(self.in_flight.clone());
            // On failure the already-submitted choices are dropped here, which aborts them.
            let events = self.engine.submit(request).map_err(|e| match e {
                EngineError::EngineStopped => ApiError::EngineStopped,
                other => ApiError::Internal(other.to_string()),
            })?;
            admitted.push(Admitted { events, _slot: slot });
        }
        Ok(admitted)
    }
}

impl AppState {
    /// One log line per accepted request (with `--enable-log-requests`).
    fn log_request(&self, id: &str, prompt_tokens: usize, requests: &[GenerateRequest]) {
        if !self.settings.log_requests {
            return;
        }
        if let Some(first) = requests.first() {
            tracing::info!(
                "Received request {id}: prompt_tokens={prompt_tokens}, n={}, max_tokens={}, temperature={}, seed={:?}",
                requests.len(),
                first.stop.max_tokens,
                first.sampling.temperature,
                first.sampling.seed
            );
        }
    }
}
