//! `EngineCore`: the engine loop driven one step at a time on the caller's thread, without the engine thread, its
//! command channel or the server: requests go in, `step()` runs one scheduler step through the runner and hands its
//! tokens to the output thread, which sends each request's events. The host side of a step can be measured with it
//! (`benches/benches/host_step.rs`) with a runner that does the runner's host work and no device work.

use std::sync::Arc;

use rserve_scheduler::{RequestId, Scheduler};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use super::metrics::{EngineMetrics, MetricsSetup};
use super::thread::EngineLoop;
use crate::api::{GenerateRequest, RequestEvent};
use crate::error::Result;
use crate::model::TokenId;
use crate::runner::StepRunner;
use crate::tokenizer::Tokenizer;

/// One engine loop, stepped by its owner.
pub struct EngineCore {
    inner: EngineLoop,
}

impl EngineCore {
    /// An engine over `scheduler` and `runner`, detokenizing with `tokenizer`; `eos_token_ids` stop requests that
    /// do not ignore them. Metrics are kept (and never served).
    pub fn new(
        scheduler: Scheduler,
        runner: Box<dyn StepRunner>,
        tokenizer: Arc<Tokenizer>,
        eos_token_ids: Vec<TokenId>,
    ) -> Result<Self> {
        let metrics = EngineMetrics::new(MetricsSetup::default())
            .map_err(|e| crate::error::EngineError::Backend(format!("metrics: {e}")))?;
        let metrics = Arc::new(metrics);
        Ok(Self { inner: EngineLoop::new(scheduler, runner, tokenizer, metrics, eos_token_ids, 0) })
    }

    /// Adds a request; its events (text deltas, then `Finished` or `Error`) arrive on the returned channel.
    pub fn add(&mut self, id: RequestId, request: GenerateRequest) -> UnboundedReceiver<RequestEvent> {
        let (tx, rx) = unbounded_channel();
        self.inner.add(id, request, tx);
        self.inner.flush();
        rx
    }

    /// Ends a request as a client abort does (its blocks are freed at once); its channel gets no further event.
    pub fn abort(&mut self, id: RequestId) {
        self.inner.handle(super::handle::Command::Abort { id });
        self.inner.flush();
    }

    /// Runs one engine step: the requests the output thread ended are aborted, then schedule, the runner's step,
    /// the token choice, the scheduler's update, and the step's tokens go to the output thread (which makes each
    /// request's events on its own thread, as in the server).
    pub fn step(&mut self) {
        self.inner.step_once();
    }

    /// The scheduler (its queues and KV cache).
    pub fn scheduler(&self) -> &Scheduler {
        &self.inner.scheduler
    }
}
