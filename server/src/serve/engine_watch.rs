//! vLLM's engine watchdog: once the engine has died (a panic in a step, or its thread gone), the API server shuts
//! down and the process exits with code 1, so that a supervisor (systemd, Kubernetes, a job script) starts a fresh
//! one; with `VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1` it stays up instead, answering `/health` and new requests with 503.

use std::sync::Arc;
use std::time::Duration;

use crate::port::Engine;

/// How often the engine is looked at (vLLM's watchdog looks every 5 s; a dead engine serves nothing, so the sooner
/// the supervisor hears of it the better).
const POLL: Duration = Duration::from_millis(500);

/// Resolves once the engine is no longer alive.
pub async fn died(engine: Arc<dyn Engine>) {
    while engine.is_alive() {
        tokio::time::sleep(POLL).await;
    }
}
