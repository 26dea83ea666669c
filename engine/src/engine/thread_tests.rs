//! The engine loop's fault paths on a fake runner (no model): a panic inside a step kills the engine with an error to
//! every request it holds and to the ones still queued, without the panic leaving the thread; a failed step fails its
//! requests and the loop serves the next; `--max-request-time` ends a request with `abort`.

use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use rserve_scheduler::{RequestId, ScheduledSeq, Scheduler, SchedulerConfig, TokenId};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use super::EngineLoop;
use crate::api::{FinishReason, GenerateRequest, RequestEvent, SamplingParams, StopParams};
use crate::engine::faults::StepHooks;
use crate::engine::handle::Command;
use crate::engine::metrics::{EngineMetrics, MetricsSetup};
use crate::runner::StepRunner;
use crate::tokenizer::Tokenizer;

const VOCAB: usize = 8;

/// Every row's logits favour token 3; each step takes `delay`.
struct FakeRunner {
    delay: Duration,
}

impl StepRunner for FakeRunner {
    fn execute(&mut self, batch: &[ScheduledSeq]) -> crate::Result<Vec<f32>> {
        std::thread::sleep(self.delay);
        let mut logits = vec![0.0; batch.len() * VOCAB];
        for row in logits.chunks_mut(VOCAB) {
            row[3] = 1.0;
        }
        Ok(logits)
    }
    fn vocab_size(&self) -> usize {
        VOCAB
    }
    fn device_name(&self) -> String {
        "fake".into()
    }
}

/// A word-level tokenizer of `VOCAB` words, written to a temporary file.
fn tokenizer() -> Arc<Tokenizer> {
    let vocab: serde_json::Map<String, serde_json::Value> = (0..VOCAB).map(|i| (format!("w{i}"), i.into())).collect();
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "w0"},
    });
    // One file per call: the tests run at once.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("rserve-thread-tests-{}-{n}-tokenizer.json", std::process::id()));
    std::fs::write(&path, json.to_string()).expect("write tokenizer");
    let tokenizer = Tokenizer::from_file(&path, None).expect("tokenizer");
    let _ = std::fs::remove_file(&path);
    Arc::new(tokenizer)
}

/// An engine loop on the fake runner, running on its own thread; its command sender.
fn start(hooks: StepHooks, max_request_time: Option<Duration>) -> (mpsc::Sender<Command>, EngineThread) {
    let scheduler = Scheduler::new(SchedulerConfig::new(512, 4096)).expect("scheduler");
    let metrics = Arc::new(EngineMetrics::new(MetricsSetup::default()).expect("metrics"));
    let runner = Box::new(FakeRunner { delay: Duration::from_millis(2) });
    let mut engine = EngineLoop::new(scheduler, runner, tokenizer(), metrics, Vec::new(), 0);
    engine.hooks = hooks;
    engine.max_request_time = max_request_time;
    let dead = engine.dead.clone();
    let (tx, rx) = mpsc::channel();
    let thread = std::thread::spawn(move || engine.run(rx));
    (tx, EngineThread { thread, dead })
}

struct EngineThread {
    thread: std::thread::JoinHandle<()>,
    dead: Arc<std::sync::atomic::AtomicBool>,
}

fn add(tx: &mpsc::Sender<Command>, id: u64, max_tokens: usize) -> UnboundedReceiver<RequestEvent> {
    let (events, rx) = unbounded_channel();
    let request = GenerateRequest {
        prompt_token_ids: vec![TokenId(1), TokenId(2)],
        sampling: SamplingParams { temperature: 0.0, ..SamplingParams::default() },
        stop: StopParams { max_tokens, skip_special_tokens: true, ..StopParams::default() },
        pooling: None,
    };
    tx.send(Command::Add { id: RequestId(id), request: Box::new(request), events }).expect("engine running");
    rx
}

/// The request's events up to its last (blocking; the engine runs on its own thread).
fn events(mut rx: UnboundedReceiver<RequestEvent>) -> Vec<RequestEvent> {
    let mut out = Vec::new();
    while let Some(ev) = rx.blocking_recv() {
        out.push(ev);
    }
    out
}

#[test]
fn a_panic_in_a_step_ends_every_request_with_an_error_and_marks_the_engine_dead() {
    let (tx, engine) = start(StepHooks::new(Some(5), None), None);
    let first = add(&tx, 1, 1000);
    let second = add(&tx, 2, 1000);
    for rx in [first, second] {
        let evs = events(rx);
        let last = evs.last().expect("events");
        assert!(matches!(last, RequestEvent::Error(m) if m.contains("panics on purpose")), "{last:?}");
        assert!(evs.iter().any(|e| matches!(e, RequestEvent::Delta { .. })), "tokens came before the panic");
    }
    engine.thread.join().expect("the panic does not leave the engine thread");
    assert!(engine.dead.load(Ordering::SeqCst));
    // The loop is gone: nothing more is taken.
    assert!(tx.send(Command::Shutdown).is_err());
}

#[test]
fn a_failed_step_fails_its_requests_and_the_loop_serves_the_next() {
    let (tx, engine) = start(StepHooks::new(None, Some(2)), None);
    let evs = events(add(&tx, 1, 10));
    assert!(matches!(evs.last(), Some(RequestEvent::Error(m)) if m.contains("out of device memory")), "{evs:?}");
    let evs = events(add(&tx, 2, 4));
    let finished = evs.iter().find_map(|e| match e {
        RequestEvent::Finished { reason, usage, .. } => Some((*reason, usage.completion_tokens)),
        _ => None,
    });
    assert_eq!(finished, Some((FinishReason::Length, 4)));
    tx.send(Command::Shutdown).expect("running");
    engine.thread.join().expect("joins");
    assert!(!engine.dead.load(Ordering::SeqCst));
}

#[test]
fn a_request_past_max_request_time_ends_with_abort() {
    let (tx, engine) = start(StepHooks::default(), Some(Duration::from_millis(60)));
    let t0 = std::time::Instant::now();
    let evs = events(add(&tx, 1, 4000));
    let finished = evs.iter().find_map(|e| match e {
        RequestEvent::Finished { reason, usage, .. } => Some((*reason, usage.completion_tokens)),
        _ => None,
    });
    let (reason, tokens) = finished.expect("finished");
    assert_eq!(reason, FinishReason::Abort);
    assert!(tokens > 0 && tokens < 4000);
    assert!(t0.elapsed() < Duration::from_secs(5));
    tx.send(Command::Shutdown).expect("running");
    engine.thread.join().expect("joins");
}

/// An `EngineCore` on the fake runner (no delay), stepped here.
fn core() -> crate::engine::engine_core::EngineCore {
    let scheduler = Scheduler::new(SchedulerConfig::new(512, 4096)).expect("scheduler");
    let runner = Box::new(FakeRunner { delay: Duration::ZERO });
    crate::engine::engine_core::EngineCore::new(scheduler, runner, tokenizer(), Vec::new()).expect("engine")
}

fn request(max_tokens: usize, stop: &[&str]) -> GenerateRequest {
    GenerateRequest {
        prompt_token_ids: vec![TokenId(1), TokenId(2)],
        sampling: SamplingParams { temperature: 0.0, ..SamplingParams::default() },
        stop: StopParams {
            max_tokens,
            stop: stop.iter().map(|s| s.to_string()).collect(),
            skip_special_tokens: true,
            ..StopParams::default()
        },
        pooling: None,
    }
}

/// Steps `core` until its scheduler holds no request; panics after `limit` steps.
fn step_until_empty(core: &mut crate::engine::engine_core::EngineCore, limit: usize) {
    for _ in 0..limit {
        if !core.scheduler().has_unfinished() {
            return;
        }
        core.step();
        // The output thread's answer (a stop string, a closed channel) comes back between steps.
        std::thread::sleep(Duration::from_millis(2));
    }
    panic!("the scheduler still holds requests after {limit} steps");
}

#[test]
fn a_stop_string_found_on_the_output_thread_ends_the_request_and_frees_its_blocks() {
    let mut core = core();
    // Every step yields "w3": the stop string matches at the second token.
    // Far fewer steps than its max_tokens: the stop ended it, not its length.
    let rx = core.add(RequestId(1), request(4000, &["w3 w3"]));
    step_until_empty(&mut core, 2000);
    assert_eq!(core.scheduler().kv_cache().num_used_blocks(), 0, "the stopped request's blocks are freed");
    let evs = events(rx);
    let text: String = evs
        .iter()
        .filter_map(|e| if let RequestEvent::Delta { text, .. } = e { Some(text.as_str()) } else { None })
        .collect();
    // The word-level decoder joins words with spaces: the text before the stop string is the space after the prompt.
    assert_eq!(text, " ");
    match evs.last() {
        Some(RequestEvent::Finished { reason, usage, stop_reason }) => {
            assert_eq!(*reason, FinishReason::Stop);
            assert_eq!(*stop_reason, Some(crate::api::StopReason::Text("w3 w3".into())));
            assert_eq!(usage.completion_tokens, 2, "tokens computed after the stop are not counted");
        }
        other => panic!("{other:?}"),
    }
    let finished = evs.iter().filter(|e| matches!(e, RequestEvent::Finished { .. })).count();
    assert_eq!(finished, 1, "{evs:?}");
}

#[test]
fn a_client_gone_is_aborted_before_the_engine_runs_out_of_work() {
    let mut core = core();
    let rx = core.add(RequestId(1), request(4000, &[]));
    core.step();
    drop(rx);
    step_until_empty(&mut core, 2000);
    assert_eq!(core.scheduler().kv_cache().num_used_blocks(), 0);
    // Another request is served as before.
    let rx = core.add(RequestId(2), request(3, &[]));
    step_until_empty(&mut core, 10);
    let evs = events(rx);
    assert!(matches!(evs.last(), Some(RequestEvent::Finished { reason: FinishReason::Length, .. })), "{evs:?}");
}
