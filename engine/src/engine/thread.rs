//! The engine loop: one thread owns the scheduler, the model runner and every live request's state. It takes
//! commands, runs steps while work exists, samples, and hands each step's tokens to the output thread
//! (`output_thread.rs`), which makes the requests' events while the next step runs. A step that fails fails its
//! requests; a panic ends the loop with an error to every request it holds (`faults.rs` says why).
//!
//! Async scheduling (vLLM's): where the runner overlaps steps (`StepRunner::overlaps`), a step is scheduled and
//! launched while the one before it still runs on the device, its placeholders fed from that step's chosen ids on the
//! device; then the step before is collected and its tokens applied. A step whose token choice needs the previous
//! step's ids on the host (grammar masks, penalties or banned words over the output so far) waits for that step
//! instead: the step in flight is collected first and the placeholders are filled from the tokens it chose.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rserve_scheduler::{FinishStatus, IdMap, IdSet, NewRequest, RequestId, Scheduler, SchedulerOutput, TokenId};
use tokio::sync::mpsc::UnboundedSender;

use super::faults::{self, StepHooks};
use super::handle::Command;
use super::masks::GrammarState;
use super::metrics::{EngineMetrics, Finished, RequestStats};
use super::output::TextOutput;
use super::output_thread::{self, Ended, ToOutput};
use crate::api::{FinishReason, GenerateRequest, RequestEvent, SamplingParams, StopReason, Usage};
use crate::runner::{Launch, StepRunner};
use crate::sampling::prompt::{PromptLogprobs, PromptRows};
use crate::sampling::{self, RowLogprobs, RowParams, SampledRows, StepSampling, NO_LOGPROBS};
use crate::structured::Constraint;
use crate::tokenizer::Tokenizer;

/// State of one request while it lives in the engine.
struct Live {
    prompt: Vec<TokenId>,
    output: Vec<TokenId>,
    sampling: SamplingParams,
    /// The key of the request's random stream: its `seed`, or one derived from the engine's seed and its id.
    seed: u64,
    /// Timestamps and counts for the metrics (queue, prefill, decode times ...).
    stats: RequestStats,
    cached_tokens: usize,
    /// Log-probs of the token sampled this step, sent with it.
    logprobs: Option<RowLogprobs>,
    /// `prompt_logprobs`: the scores of the prompt's positions so far (position 0 never has one), until they are
    /// sent with the first token; None when not asked or sent.
    prompt_scores: Option<Vec<Option<RowLogprobs>>>,
    /// The model's EOS ids stop this request (`ignore_eos` unset).
    stops_on_eos: bool,
    /// Structured output: the grammar state that masks this request's logits.
    constraint: Option<GrammarState>,
    /// A stop token's text is part of the output (`include_stop_str_in_output`).
    include_stop: bool,
}

/// The score of a prompt position no step scored (not expected: such requests compute their whole prompt).
const NAN_ROW: RowLogprobs = RowLogprobs { chosen: f32::NAN, top: Vec::new() };

/// A step launched on the device and not collected yet (async scheduling).
struct InFlight {
    out: SchedulerOutput,
    sampling: StepSampling,
}

pub(crate) struct EngineLoop {
    pub(crate) scheduler: Scheduler,
    pub(crate) runner: Box<dyn StepRunner>,
    pub(crate) tokenizer: Arc<Tokenizer>,
    pub(crate) metrics: Arc<EngineMetrics>,
    pub(crate) eos_token_ids: Vec<TokenId>,
    pub(crate) seed: u64,
    live: IdMap<RequestId, Live>,
    shutting_down: bool,
    /// Testing only (`--testing-fail-engine-after-requests N`): the request after the first N makes the thread exit as
    /// if it had crashed.
    pub(crate) fail_after_requests: Option<usize>,
    requests_seen: usize,
    /// When the current step began: the scheduled time of the requests it runs for the first time.
    step_started: Instant,
    /// Testing only: the step-fault hooks (`--testing-panic-in-step-after`, `--testing-error-in-step-after`).
    pub(crate) hooks: StepHooks,
    /// `--max-request-time`: requests older than this are ended before the next step.
    pub(crate) max_request_time: Option<Duration>,
    /// Set once a panic ended the loop (shared with `EngineHandle`, whose `is_alive` turns false at once).
    pub(crate) dead: Arc<AtomicBool>,
    /// This step's messages to the output thread, sent together when the step ends.
    pub(super) outbox: Vec<ToOutput>,
    /// The output thread's inbox (`None` once closed) and its thread.
    to_output: Option<std::sync::mpsc::Sender<Vec<ToOutput>>>,
    output_thread: Option<std::thread::JoinHandle<()>>,
    /// Requests the output thread ended (stop strings, closed channels), for the scheduler to abort.
    ended: std::sync::mpsc::Receiver<Ended>,
    /// The step on the device while the next one is scheduled (async scheduling).
    in_flight: Option<InFlight>,
    /// Set on a pooling engine (`--runner pooling`): its pooler and each request's gathered rows.
    pub(crate) pooling: Option<super::pool_step::PoolingState>,
}

impl EngineLoop {
    pub(crate) fn new(
        scheduler: Scheduler,
        runner: Box<dyn StepRunner>,
        tokenizer: Arc<Tokenizer>,
        metrics: Arc<EngineMetrics>,
        eos_token_ids: Vec<TokenId>,
        seed: u64,
    ) -> Self {
        let (to_output, inbox) = std::sync::mpsc::channel();
        let (ended_tx, ended) = std::sync::mpsc::channel();
        let tok = tokenizer.clone();
        // Without its own thread (none can be started) the loop still works: every send then fails and the engine
        // reports itself dead, as after a panic.
        let output_thread = std::thread::Builder::new()
            .name("rserve-output".into())
            .spawn(move || output_thread::run(tok, inbox, ended_tx))
            .map_err(|e| tracing::error!("cannot start the output thread: {e}"))
            .ok();
        Self {
            scheduler,
            runner,
            tokenizer,
            metrics,
            eos_token_ids,
            seed,
            live: IdMap::default(),
            shutting_down: false,
            fail_after_requests: None,
            requests_seen: 0,
            step_started: Instant::now(),
            hooks: StepHooks::default(),
            max_request_time: None,
            dead: Arc::new(AtomicBool::new(false)),
            outbox: Vec::new(),
            to_output: Some(to_output),
            output_thread,
            ended,
            in_flight: None,
            pooling: None,
        }
    }

    /// Sends this step's messages to the output thread.
    pub(super) fn flush(&mut self) {
        if self.outbox.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut self.outbox);
        let sent = self.to_output.as_ref().is_some_and(|tx| tx.send(batch).is_ok());
        if !sent && !self.dead.swap(true, Ordering::SeqCst) {
            tracing::error!("the output thread is gone: no request can get its output; the engine stops");
            self.shutting_down = true;
        }
    }

    /// Lets the output thread finish what it was sent, and waits for it.
    fn close_outputs(&mut self) {
        self.flush();
        self.to_output = None;
        if let Some(t) = self.output_thread.take() {
            let _ = t.join();
        }
    }

    /// Aborts the requests the output thread ended (a stop string matched, the client is gone, the text failed).
    fn apply_ended(&mut self) {
        while let Ok(e) = self.ended.try_recv() {
            let (id, reason) = match e {
                Ended::Stop(id) => (id, "stop"),
                Ended::Gone(id) => (id, "abort"),
                Ended::Failed(id) => (id, "error"),
            };
            if let Some(live) = self.live.remove(&id) {
                self.observe_end(&live, reason);
                self.scheduler.abort(id);
            }
        }
    }

    /// One turn of the loop's work: the output thread's ends, one step, its messages out.
    pub(super) fn step_once(&mut self) {
        self.apply_ended();
        if self.scheduler.has_unfinished() {
            self.step_started = Instant::now();
            self.step();
        } else {
            // Every request of the step in flight ended meanwhile: its result is read and changes nothing.
            self.complete_in_flight();
        }
        self.flush();
    }

    /// Runs until a `Shutdown` command arrives or every handle is gone, or until a panic: the engine is dead then,
    /// and every request it holds or that is still queued gets an error.
    pub(crate) fn run(mut self, rx: std::sync::mpsc::Receiver<Command>) {
        // The loop's state after a panic is not trusted again: `die` touches only `live` (the requests' channels)
        // and the metrics, and reads the cache's size for them.
        match catch_unwind(AssertUnwindSafe(|| self.serve(&rx))) {
            Ok(()) => self.publish_gauges(),
            Err(payload) => self.die(&faults::panic_message(&*payload), &rx),
        }
        self.close_outputs();
    }

    /// The loop proper.
    fn serve(&mut self, rx: &std::sync::mpsc::Receiver<Command>) {
        loop {
            self.apply_ended();
            if !self.scheduler.has_unfinished() {
                self.complete_in_flight();
                self.flush();
                self.publish_gauges();
                match rx.recv() {
                    Ok(cmd) => self.handle(cmd),
                    Err(_) => break,
                }
            }
            while let Ok(cmd) = rx.try_recv() {
                self.handle(cmd);
            }
            if self.shutting_down {
                self.in_flight = None;
                self.runner.abandon();
                let ids: Vec<RequestId> = self.live.keys().copied().collect();
                for id in ids {
                    self.finish(id, FinishReason::Abort, None, false);
                }
                self.flush();
                break;
            }
            self.expire_overdue();
            self.step_once();
        }
    }

    /// After a panic: marks the engine dead (new requests are refused from now on), ends every live request with an
    /// error, answers the commands still queued, and returns (the thread ends; the scheduler's and runner's memory
    /// is freed as the loop is dropped).
    fn die(&mut self, message: &str, rx: &std::sync::mpsc::Receiver<Command>) {
        self.dead.store(true, Ordering::SeqCst);
        tracing::error!(
            "the engine failed: a step panicked ({message}); {} requests end with an error and no new request is \
             served",
            self.live.len()
        );
        let error = format!("the engine failed: {message}");
        // What is still in the outbox (requests added before the step, tokens it made) goes first.
        for (id, live) in std::mem::take(&mut self.live) {
            self.observe_end(&live, "error");
            self.outbox.push(ToOutput::Fail { id, message: error.clone() });
        }
        self.flush();
        while let Ok(cmd) = rx.try_recv() {
            if let Command::Add { events, .. } = cmd {
                let _ = events.send(RequestEvent::Error(error.clone()));
            }
        }
        self.metrics.set_scheduler_state(0, 0, 0, self.scheduler.kv_cache().num_blocks());
    }

    /// `--max-request-time`: ends each request that arrived longer ago than the limit (finish reason `abort`, with
    /// the text it has; its blocks are freed before the next step).
    fn expire_overdue(&mut self) {
        let Some(limit) = self.max_request_time else { return };
        let now = Instant::now();
        let overdue: Vec<RequestId> = self
            .live
            .iter()
            .filter(|(_, l)| now.saturating_duration_since(l.stats.arrival) >= limit)
            .map(|(id, _)| *id)
            .collect();
        if overdue.is_empty() {
            return;
        }
        for id in overdue {
            tracing::warn!("request {} ended: it ran past --max-request-time ({:.1} s)", id.0, limit.as_secs_f64());
            self.scheduler.abort(id);
            self.finish(id, FinishReason::Abort, None, true);
        }
        self.publish_gauges();
    }

    pub(super) fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Add { id, request, events } => {
                self.requests_seen += 1;
                if self.fail_after_requests.is_some_and(|n| self.requests_seen > n) {
                    return self.fail_for_testing(events);
                }
                self.add(id, *request, events)
            }
            Command::Abort { id } => {
                if let Some(live) = self.live.remove(&id) {
                    self.observe_end(&live, "abort");
                    self.scheduler.abort(id);
                    self.outbox.push(ToOutput::Forget { id });
                }
            }
            Command::ResetPrefixCache { preempt_running, reply } => {
                let reset = self.scheduler.reset_prefix_cache(preempt_running);
                if reset.complete {
                    tracing::info!("Reset the prefix cache ({} cached blocks dropped)", reset.dropped_blocks);
                } else {
                    tracing::warn!(
                        "Failed to reset the whole prefix cache: {} blocks are in use ({} free cached blocks dropped)",
                        self.scheduler.kv_cache().num_used_blocks(),
                        reset.dropped_blocks
                    );
                }
                self.publish_gauges();
                let _ = reply.send(reset);
            }
            Command::Shutdown => self.shutting_down = true,
        }
    }

    /// The testing hook's crash: every request's event channel is dropped without a last event (as when the thread
    /// dies) and the loop ends.
    fn fail_for_testing(&mut self, events: UnboundedSender<RequestEvent>) {
        tracing::error!("--testing-fail-engine-after-requests: the engine thread exits now, as if it had failed");
        drop(events);
        for (id, _) in std::mem::take(&mut self.live) {
            self.outbox.push(ToOutput::Forget { id });
        }
        self.shutting_down = true;
    }

    pub(super) fn add(&mut self, id: RequestId, req: GenerateRequest, events: UnboundedSender<RequestEvent>) {
        let GenerateRequest { prompt_token_ids, sampling, mut stop, pooling } = req;
        // A pooling engine serves pooling requests only, and a generating one none (the server checks it first).
        let whole_prompt = match (&mut self.pooling, pooling) {
            (Some(state), Some(params)) => {
                state.add(id, params);
                stop.max_tokens = 1;
                state.pooler.info().bidirectional
            }
            (None, None) => false,
            (Some(_), None) | (None, Some(_)) => {
                let what = if self.pooling.is_some() {
                    "a pooling model generates no text"
                } else {
                    "this model does not pool"
                };
                let _ = events.send(RequestEvent::Error(what.into()));
                return;
            }
        };
        let include_stop = stop.include_stop_str_in_output;
        let text = match TextOutput::new(
            self.tokenizer.clone(),
            &prompt_token_ids,
            stop.skip_special_tokens,
            stop.stop,
            include_stop,
        ) {
            Ok(t) => t,
            Err(e) => {
                let _ = events.send(RequestEvent::Error(e.to_string()));
                return;
            }
        };
        let mut stop_ids = stop.stop_token_ids.clone();
        if !stop.ignore_eos {
            stop_ids.extend(&self.eos_token_ids);
        }
        let seed = sampling.seed.unwrap_or_else(|| self.seed ^ id.0.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let new = NewRequest {
            id,
            prompt_token_ids: prompt_token_ids.clone(),
            max_tokens: stop.max_tokens,
            min_tokens: stop.min_tokens,
            stop_token_ids: stop_ids,
            // A pooling request reads every prompt row it pools: none is served from the cache.
            skip_prefix_cache: sampling.prompt_logprobs.is_some() || self.pooling.is_some(),
            whole_prompt,
        };
        if let Err(e) = self.scheduler.add_request(new) {
            if let Some(state) = self.pooling.as_mut() {
                state.forget(id);
            }
            let _ = events.send(RequestEvent::Error(e.to_string()));
            return;
        }
        let constraint = sampling
            .constraint
            .as_ref()
            .map(|g| GrammarState::new(Constraint::new(g), sampling.constraint_after.as_deref()));
        let prompt_tokens = prompt_token_ids.len();
        let prompt_scores = sampling.prompt_logprobs.map(|_| vec![None; prompt_tokens]);
        self.outbox.push(ToOutput::Add { id, text: Box::new(text), events, prompt_tokens });
        self.live.insert(
            id,
            Live {
                prompt: prompt_token_ids,
                output: Vec::new(),
                sampling,
                seed,
                stats: RequestStats::new(Instant::now(), stop.max_tokens),
                cached_tokens: 0,
                logprobs: None,
                prompt_scores,
                stops_on_eos: !stop.ignore_eos,
                constraint,
                include_stop,
            },
        );
        self.publish_gauges();
    }

    pub(super) fn step(&mut self) {
        let mut out = self.scheduler.schedule();
        // Before the step: the runner forgets what it kept of the requests that ended since the last one.
        self.runner.finished(&out.finished_ids);
        self.runner.finished(&out.preempted);
        if self.pooling.is_some() && !out.seqs.is_empty() {
            return self.pool_step(out);
        }
        if out.seqs.is_empty() {
            if self.in_flight.is_some() {
                // Every running request's limits are reached by the samples in flight.
                self.complete_in_flight();
                return;
            }
            // Nothing could be scheduled (e.g. every waiting request waits for blocks held by none): don't spin.
            std::thread::sleep(Duration::from_millis(1));
            self.publish_gauges();
            return;
        }
        let constrained =
            out.seqs.iter().any(|s| s.sample && self.live.get(&s.request_id).is_some_and(|l| l.constraint.is_some()));
        if !constrained && self.overlappable(&out) {
            return self.step_ahead(out);
        }
        if self.in_flight.is_some() {
            // This step's token choice needs the previous step's ids on the host: that step ends first.
            self.complete_in_flight();
            self.fill_placeholders(&mut out);
        }
        let sampling = self.step_sampling(&out);
        let result = if let Err(e) = self.hooks.before_step() {
            Err(e)
        } else if constrained {
            self.execute_constrained(&out, &sampling)
        } else {
            self.launch_and_collect(&out, &sampling).map(|r| (r, Vec::new()))
        };
        match result {
            Ok((rows, errors)) => {
                if constrained {
                    self.observe_step(&out);
                }
                self.apply_step(out, rows, &errors);
            }
            Err(e) => self.fail_step(&out, &e.to_string()),
        }
    }

    /// Whether `out` may run while the step before it is still on the device: the runner feeds placeholders, and no
    /// sampling row's choice depends on its request's output so far (penalties, banned words), which the step in
    /// flight is still extending.
    fn overlappable(&self, out: &SchedulerOutput) -> bool {
        if !self.runner.overlaps() {
            return false;
        }
        out.seqs.iter().filter(|s| s.sample).all(|s| {
            self.live.get(&s.request_id).is_none_or(|l| {
                let p = &l.sampling;
                p.repetition_penalty == 1.0
                    && p.presence_penalty == 0.0
                    && p.frequency_penalty == 0.0
                    && p.bad_words.is_empty()
            })
        })
    }

    /// Launches `out` with the step before it still in flight, then collects that one and applies its tokens (the
    /// host's work for it overlaps `out` on the device).
    fn step_ahead(&mut self, out: SchedulerOutput) {
        let sampling = self.step_sampling(&out);
        let launched = match self.hooks.before_step() {
            Err(e) => Err(e),
            Ok(()) => self.runner.launch(&out.seqs, &sampling),
        };
        match launched {
            Ok(Launch::Running) => {
                self.observe_step(&out);
                match self.in_flight.replace(InFlight { out, sampling }) {
                    Some(before) => self.collect_step(before),
                    None => {
                        self.apply_ended();
                        self.flush();
                        self.publish_gauges();
                    }
                }
            }
            Ok(Launch::Done(rows)) => {
                // It ran to its end here (after the step before it, which is read first).
                self.complete_in_flight();
                self.observe_step(&out);
                self.apply_step(out, rows, &[]);
            }
            Err(e) => {
                self.complete_in_flight();
                self.fail_step(&out, &e.to_string());
            }
        }
    }

    /// Collects the step in flight, if any, and applies its tokens.
    fn complete_in_flight(&mut self) {
        if let Some(f) = self.in_flight.take() {
            self.collect_step(f);
        }
    }

    /// Waits for a launched step and applies its tokens; the host's work that needs none of them is done first.
    fn collect_step(&mut self, f: InFlight) {
        self.apply_ended();
        self.flush();
        self.publish_gauges();
        match self.runner.collect(&f.sampling) {
            Ok(rows) => self.apply_step(f.out, rows, &[]),
            Err(e) => self.fail_step(&f.out, &e.to_string()),
        }
    }

    /// Gives a step's tokens to the scheduler and the requests. `errors`: the step's grammar errors by row.
    fn apply_step(&mut self, out: SchedulerOutput, rows: SampledRows, errors: &[Option<String>]) {
        let sampled = self.take_sampled(&out, rows, errors);
        let outputs = self.scheduler.update_from_output(&out, &sampled);
        for o in outputs {
            self.on_output(o.request_id, o.new_token, o.finished);
        }
        // Hand the buffers back so the next schedule() refills them instead of allocating.
        self.scheduler.recycle(out);
        self.publish_gauges();
    }

    /// After the step in flight was applied: each placeholder of `out` becomes the token its request got (0 for a
    /// request that ended meanwhile, whose result is ignored).
    fn fill_placeholders(&self, out: &mut SchedulerOutput) {
        for s in &mut out.seqs {
            if !s.token_ids.contains(&TokenId::PLACEHOLDER) {
                continue;
            }
            let known = self.scheduler.request(s.request_id).map(|r| r.token_ids());
            for (k, t) in s.token_ids.iter_mut().enumerate() {
                if *t == TokenId::PLACEHOLDER {
                    *t = known.and_then(|ids| ids.get(s.start_position + k)).copied().unwrap_or(TokenId(0));
                }
            }
        }
    }

    /// Runs a step without grammar masks: launched on the device, then, while it computes, the host's work that does
    /// not need its tokens (the requests the output thread ended, the messages of commands handled before the step,
    /// the step's metrics and gauges), then its tokens collected.
    fn launch_and_collect(&mut self, out: &SchedulerOutput, sampling: &StepSampling) -> crate::Result<SampledRows> {
        match self.runner.launch(&out.seqs, sampling)? {
            Launch::Done(rows) => {
                self.observe_step(out);
                Ok(rows)
            }
            Launch::Running => {
                self.apply_ended();
                self.flush();
                self.observe_step(out);
                self.publish_gauges();
                self.runner.collect(sampling)
            }
        }
    }

    /// The step's token choice: each sampling row's draw (its seed, and its output length as the place in its random
    /// stream, so a recomputed request draws the same numbers), edits, bans and log-probs; rows that do not sample
    /// this step (prefill chunks) are greedy and their ids ignored.
    fn step_sampling(&self, out: &SchedulerOutput) -> StepSampling {
        let vocab = self.runner.vocab_size();
        let mut s = StepSampling { params: Vec::with_capacity(out.seqs.len() * 8), ..StepSampling::default() };
        let mut logprobs = Vec::new();
        let mut any_logprobs = false;
        // A request whose sample in the step in flight is not back yet draws at the place after it.
        let out_now: IdSet<RequestId> =
            self.in_flight.iter().flat_map(|f| f.out.seqs.iter().filter(|q| q.sample).map(|q| q.request_id)).collect();
        let rows = out.seqs.iter().map(|q| self.live.get(&q.request_id).filter(|_| q.sample).map(|l| (q, l)));
        for (r, live) in rows.enumerate() {
            let Some((q, l)) = live else {
                s.params.extend(RowParams::GREEDY.pack());
                logprobs.push(NO_LOGPROBS);
                continue;
            };
            let place = l.output.len() + usize::from(out_now.contains(&q.request_id));
            s.params.extend(crate::sampling::row_params(&l.sampling, l.seed, place as u64).pack());
            sampling::adjust::push_row(&mut s.edits, r as u32, &l.sampling, &l.prompt, &l.output, vocab);
            let n = l.sampling.logprobs.map_or(NO_LOGPROBS, |n| n.min(u32::MAX as usize - 1) as u32);
            any_logprobs |= n != NO_LOGPROBS;
            logprobs.push(n);
        }
        if any_logprobs {
            s.logprobs = logprobs;
        }
        let bans = out
            .seqs
            .iter()
            .map(|q| self.live.get(&q.request_id).filter(|_| q.sample).map(|l| (&l.sampling, l.output.as_slice())));
        s.bans = sampling::step::ban_masks(bans, vocab);
        s.prompt = self.prompt_rows(out);
        s
    }

    /// The rows of `out`'s prompt chunks that score the prompt token after them, for the requests that want prompt
    /// log-probs and have not got them yet.
    fn prompt_rows(&self, out: &SchedulerOutput) -> Vec<PromptRows> {
        let mut rows = Vec::new();
        for (r, q) in out.seqs.iter().enumerate() {
            let Some(l) = self.live.get(&q.request_id).filter(|l| l.prompt_scores.is_some()) else { continue };
            let top = l.sampling.prompt_logprobs.unwrap_or(0).min(u32::MAX as usize - 1) as u32;
            // A row at position i scores prompt token i + 1: up to the prompt's second-to-last token.
            let end = (q.start_position + q.token_ids.len()).min(l.prompt.len().saturating_sub(1));
            if q.start_position < end {
                let targets = l.prompt[q.start_position + 1..=end].iter().map(|t| t.0).collect();
                rows.push(PromptRows { seq: r as u32, targets, top });
            }
        }
        rows
    }

    /// Keeps the prompt scores a step read, and sends each request's whole set once its prompt is computed (before
    /// its first token).
    fn take_prompt_scores(&mut self, out: &SchedulerOutput, scored: Vec<PromptLogprobs>) {
        for p in scored {
            let Some(q) = out.seqs.get(p.seq as usize) else { continue };
            let Some(scores) = self.live.get_mut(&q.request_id).and_then(|l| l.prompt_scores.as_mut()) else {
                continue;
            };
            for (i, row) in p.rows.into_iter().enumerate() {
                if let Some(slot) = scores.get_mut(q.start_position + 1 + i) {
                    *slot = Some(row);
                }
            }
        }
        for q in out.seqs.iter().filter(|q| q.sample) {
            let Some(l) = self.live.get_mut(&q.request_id) else { continue };
            let Some(scores) = l.prompt_scores.take() else { continue };
            let Some(&first) = l.prompt.first() else { continue };
            // Every position after the first was scored once the prompt is computed (no prefix-cache hits).
            let scored = scores.into_iter().zip(&l.prompt).skip(1).map(|(lp, &t)| (t, lp.unwrap_or(NAN_ROW))).collect();
            self.outbox.push(ToOutput::Prompt { id: q.request_id, first, scored });
        }
    }

    /// The step's chosen tokens for the sequences that sample, with their log-probs; each constrained sequence's
    /// grammar is handed its token. `errors`: the step's grammar errors by row (empty: none).
    fn take_sampled(
        &mut self,
        out: &SchedulerOutput,
        rows: SampledRows,
        errors: &[Option<String>],
    ) -> Vec<(RequestId, TokenId)> {
        self.take_prompt_scores(out, rows.prompt);
        let mut sampled = Vec::new();
        let mut failed = Vec::new();
        let mut logprobs = rows.logprobs.into_iter();
        for (i, s) in out.seqs.iter().enumerate() {
            let lp = logprobs.next().flatten();
            let Some(live) = self.live.get_mut(&s.request_id) else { continue };
            live.cached_tokens = live.cached_tokens.max(s.num_cached_tokens);
            if !s.sample {
                continue;
            }
            if let Some(Some(e)) = errors.get(i) {
                failed.push((s.request_id, format!("structured output: {e}")));
                continue;
            }
            let Some(&t) = rows.ids.get(i) else { continue };
            let token = TokenId(t);
            if let Some(g) = live.constraint.as_mut() {
                g.sampled(token);
            }
            live.logprobs = lp;
            sampled.push((s.request_id, token));
        }
        for (id, message) in failed {
            self.fail_request(id, message);
        }
        sampled
    }

    /// Runs a step with constrained rows: their grammar masks are computed on other threads while the runner queues
    /// the forward pass, and the runner applies them to the logits (on its device where it has one). Returns the
    /// step's choice and its grammar errors by row.
    fn execute_constrained(
        &mut self,
        out: &SchedulerOutput,
        sampling: &StepSampling,
    ) -> crate::Result<(SampledRows, Vec<Option<String>>)> {
        let vocab = self.runner.vocab_size();
        let mut live: IdMap<RequestId, &mut GrammarState> =
            self.live.iter_mut().filter_map(|(id, l)| Some((*id, l.constraint.as_mut()?))).collect();
        let rows: Vec<Option<&mut GrammarState>> =
            out.seqs.iter().map(|s| if s.sample { live.remove(&s.request_id) } else { None }).collect();
        let runner = &mut self.runner;
        let mut errors = Vec::new();
        let result = std::thread::scope(|scope| {
            let mut pending = Some(scope.spawn(move || super::masks::compute(rows, vocab)));
            let mut join = || {
                let joined = pending.take().map(|h| h.join());
                match joined {
                    Some(Ok((masks, e))) => {
                        errors = e;
                        masks
                    }
                    _ => {
                        errors = out.seqs.iter().map(|_| Some("the grammar engine panicked".to_owned())).collect();
                        crate::runner::StepMasks::allow_all(out.seqs.len(), vocab)
                    }
                }
            };
            let result = runner.execute_sampled(&out.seqs, sampling, Some(&mut join));
            // A runner that failed before asking for the masks: the mask thread still ends inside this scope.
            if let Some(h) = pending.take() {
                let _ = h.join();
            }
            result
        });
        result.map(|o| (o, errors))
    }

    /// Ends one request with an error event (its blocks are freed before the next step); the step goes on for the
    /// others.
    pub(super) fn fail_request(&mut self, id: RequestId, message: String) {
        tracing::error!("request {} failed: {message}", id.0);
        if let Some(live) = self.live.remove(&id) {
            self.observe_end(&live, "error");
            self.outbox.push(ToOutput::Fail { id, message });
        }
        self.scheduler.abort(id);
    }

    fn on_output(&mut self, id: RequestId, token: Option<TokenId>, finished: Option<FinishStatus>) {
        let now = Instant::now();
        let Some(live) = self.live.get_mut(&id) else { return };
        let stops_on_eos = live.stops_on_eos;
        if let Some(t) = token {
            live.output.push(t);
            let timing = live.stats.token(now);
            self.metrics.observe_token(timing, live.prompt.len(), live.cached_tokens);
            // A stop token's own text is not part of the output, unless the request asked for it.
            let show = live.include_stop || !matches!(finished, Some(FinishStatus::StopToken(_)));
            let (logprobs, cached_tokens) = (live.logprobs.take(), live.cached_tokens);
            self.outbox.push(ToOutput::Token { id, token: t, show, logprobs, cached_tokens });
        }
        if let Some(f) = finished {
            let (reason, stop) = match f {
                // As vLLM: the model's EOS is checked first and reports no stop reason, even when the user listed
                // the same id in stop_token_ids.
                FinishStatus::StopToken(t) if stops_on_eos && self.eos_token_ids.contains(&t) => {
                    (FinishReason::Stop, None)
                }
                FinishStatus::StopToken(t) => (FinishReason::Stop, Some(StopReason::Token(t))),
                FinishStatus::Length => (FinishReason::Length, None),
            };
            self.finish(id, reason, stop, true);
        }
    }

    /// Counts a pooling request's result in the metrics (its time to the result, its prompt tokens).
    pub(super) fn observe_pooled(&mut self, id: RequestId) {
        let Some(live) = self.live.get_mut(&id) else { return };
        let ttft = live.stats.pooled(Instant::now());
        self.metrics.observe_pooled(ttft, live.prompt.len());
    }

    /// Has the output thread send the request's last text (when `flush`) and its `Finished` event, and forgets it.
    /// The scheduler side is already done (or is aborted by the caller).
    pub(super) fn finish(&mut self, id: RequestId, reason: FinishReason, stop_reason: Option<StopReason>, flush: bool) {
        let Some(live) = self.live.remove(&id) else { return };
        let usage = Usage {
            prompt_tokens: live.prompt.len(),
            completion_tokens: live.output.len(),
            cached_tokens: live.cached_tokens,
        };
        self.observe_end(&live, reason.as_str());
        self.outbox.push(ToOutput::Finish { id, reason, stop_reason, usage, flush });
    }

    pub(super) fn fail_step(&mut self, out: &SchedulerOutput, message: &str) {
        tracing::error!("model step failed: {message}");
        for s in &out.seqs {
            if let Some(live) = self.live.remove(&s.request_id) {
                self.observe_end(&live, "error");
                let (id, message) = (s.request_id, format!("model step failed: {message}"));
                self.outbox.push(ToOutput::Fail { id, message });
            }
            self.scheduler.abort(s.request_id);
        }
        self.publish_gauges();
    }

    pub(super) fn publish_gauges(&self) {
        let s = self.scheduler.stats();
        let m = &self.metrics;
        m.set_scheduler_state(s.num_running, s.num_waiting, s.num_blocks_used, s.num_blocks_total);
        m.sync_scheduler_totals(s.num_preemptions, s.prefix_cache_queries, s.prefix_cache_hits);
    }

    /// The step's share of the metrics, before its outputs are processed: the requests it schedules for the first
    /// time leave the queue, preempted ones count a preemption, and its tokens are counted as vLLM counts an
    /// iteration (the computed prompt tokens of each prefill that samples its first token, plus one per sampled
    /// token).
    pub(super) fn observe_step(&mut self, out: &SchedulerOutput) {
        let mut iteration = 0;
        for s in &out.seqs {
            let Some(live) = self.live.get_mut(&s.request_id) else { continue };
            live.stats.scheduled(self.step_started);
            if s.sample {
                if live.stats.first_token.is_none() {
                    iteration += live.prompt.len().saturating_sub(s.num_cached_tokens.max(live.cached_tokens));
                }
                iteration += 1;
            }
        }
        for id in &out.preempted {
            if let Some(live) = self.live.get_mut(id) {
                live.stats.preemptions += 1;
            }
        }
        self.metrics.observe_step(iteration, out.num_batched_tokens);
    }

    /// Counts a request that leaves the engine for `reason` (a `FINISHED_REASONS` value).
    fn observe_end(&self, live: &Live, reason: &'static str) {
        let end = Finished {
            reason,
            stats: &live.stats,
            prompt_tokens: live.prompt.len(),
            cached_tokens: live.cached_tokens,
        };
        self.metrics.observe_finished(end, Instant::now());
    }
}

#[cfg(test)]
#[path = "thread_tests.rs"]
mod tests;
