//! Criterion benchmark of the host side of one engine step at 256 running sequences: `EngineCore::step` (schedule,
//! the step's sampling rows, the runner's host work, the scheduler's update, the step's tokens handed to the output
//! thread) with SmolLM2-135M's shape and tokenizer, every request in steady-state decode. The runner is the real
//! `ModelRunner` on `HostOnly`, a backend whose ops do nothing: what is timed is everything a step costs the host
//! (flattening and checking the batch, padding it to its bucket, packing the step inputs into one host buffer as a
//! device backend does, the replay call, the token choice's parameters, reading the ids) and nothing of the device.
//!
//! `host_step_256/greedy` and `host_step_256/sampled` (temperature 0.7, top-p 0.9) time the engine thread's step
//! (what the device waits for); the output thread's work for the step (detokenization, the events) is waited for
//! after the timed region. `host_step_256/greedy_with_outputs` times both: the step and its 256 events received.
//! Every 512 steps the requests are aborted and 256 new ones prefilled outside the timed region, so contexts stay
//! between 512 and 1024 tokens.

use std::cell::RefCell;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::DType;
use criterion::{criterion_group, criterion_main, Criterion};
use rserve_engine::api::{GenerateRequest, RequestEvent, SamplingParams, StopParams};
use rserve_engine::backend::{Backend, Op, Result as BackendResult};
use rserve_engine::config::gguf_meta::read_gguf_header;
use rserve_engine::engine::engine_core::EngineCore;
use rserve_engine::model::TokenId;
use rserve_engine::runner::{ModelRunner, RunnerOptions};
use rserve_engine::source::{resolve_model, ResolveOptions};
use rserve_engine::tokenizer::Tokenizer;
use rserve_scheduler::{RequestId, Scheduler, SchedulerConfig};
use tokio::sync::mpsc::UnboundedReceiver;

const SEQS: usize = 256;
const PROMPT_LEN: usize = 512;
const STEPS_PER_BATCH: usize = 512;
const BS: usize = 16;
const MAX_MODEL_LEN: usize = 2048;

/// A buffer of `HostOnly`: its length only.
struct Nothing(usize);

/// A backend that computes nothing: every op returns at once, downloads return ids of ordinary words. Its step
/// inputs are packed into one host buffer, as the CUDA backend packs them before its one host-to-device copy.
#[derive(Default)]
struct HostOnly {
    packed: RefCell<Vec<u32>>,
    next: RefCell<u32>,
}

impl Backend for HostOnly {
    type Buffer = Nothing;
    type Recording = ();

    fn device_name(&self) -> String {
        "host only".into()
    }
    fn upload_weight(&self, t: &candle_core::Tensor) -> BackendResult<Nothing> {
        Ok(Nothing(t.elem_count()))
    }
    fn upload_weight_rows(&self, parts: &[&candle_core::Tensor]) -> BackendResult<Nothing> {
        Ok(Nothing(parts.iter().map(|t| t.elem_count()).sum()))
    }
    fn alloc_f32(&self, len: usize) -> BackendResult<Nothing> {
        Ok(Nothing(len))
    }
    fn alloc_u32_output(&self, len: usize) -> BackendResult<Nothing> {
        Ok(Nothing(len))
    }
    fn upload_f32(&self, data: &[f32]) -> BackendResult<Nothing> {
        Ok(Nothing(data.len()))
    }
    fn upload_u32(&self, data: &[u32]) -> BackendResult<Nothing> {
        Ok(Nothing(data.len()))
    }
    fn download_f32(&self, buf: &Nothing) -> BackendResult<Vec<f32>> {
        Ok(vec![0.0; buf.0])
    }
    fn download_u32(&self, _buf: &Nothing, len: usize) -> BackendResult<Vec<u32>> {
        // Ordinary words of SmolLM2's vocabulary, a different one each row and step.
        let mut next = self.next.borrow_mut();
        Ok((0..len)
            .map(|_| {
                *next = (*next + 7) % 20_000;
                1_000 + *next
            })
            .collect())
    }
    fn run(&self, _op: Op<'_, Nothing>) -> BackendResult<()> {
        Ok(())
    }
    fn records(&self) -> bool {
        true
    }
    fn begin_recording(&self) -> BackendResult<()> {
        Ok(())
    }
    fn end_recording(&self) -> BackendResult<()> {
        Ok(())
    }
    fn replay(&self, _r: &(), _timed: bool) -> BackendResult<()> {
        Ok(())
    }
    fn write_inputs(
        &self,
        _owner: Option<&Nothing>,
        _views: &mut [&mut Nothing],
        parts: &[&[u32]],
    ) -> BackendResult<()> {
        let mut packed = self.packed.borrow_mut();
        packed.clear();
        for p in parts {
            packed.extend_from_slice(p);
        }
        black_box(&*packed);
        Ok(())
    }
}

struct Bench {
    core: EngineCore,
    events: Vec<UnboundedReceiver<RequestEvent>>,
    next_id: u64,
    sampling: SamplingParams,
}

impl Bench {
    fn new(sampling: SamplingParams) -> Self {
        let gguf = rserve_tests::smollm2_gguf();
        let resolved =
            resolve_model(gguf.to_str().expect("utf-8 path"), &ResolveOptions::with_cache_dir(std::env::temp_dir()))
                .expect("SmolLM2");
        let params = resolved.load_params().expect("params");
        let weights = rserve_engine::weights::load(&resolved, &params, DType::F32).expect("weights");
        let tokenizer = Arc::new(Tokenizer::from_gguf(&read_gguf_header(&gguf).expect("header")).expect("tokenizer"));
        let num_blocks = SEQS * (PROMPT_LEN + STEPS_PER_BATCH + 64).div_ceil(BS);
        let opts = RunnerOptions { max_model_len: MAX_MODEL_LEN, max_num_seqs: SEQS, ..Default::default() };
        let runner =
            ModelRunner::with_options(HostOnly::default(), &params, &weights, num_blocks, BS, opts).expect("runner");
        let mut cfg = SchedulerConfig::new(num_blocks, MAX_MODEL_LEN);
        cfg.block_size = BS;
        cfg.max_num_seqs = SEQS;
        cfg.max_num_batched_tokens = 8192;
        let scheduler = Scheduler::new(cfg).expect("scheduler");
        let core = EngineCore::new(scheduler, Box::new(runner), tokenizer, vec![]).expect("engine");
        let mut b = Self { core, events: Vec::new(), next_id: 0, sampling };
        b.refill();
        b
    }

    /// Aborts every request, then adds `SEQS` new ones and steps until they all decode.
    fn refill(&mut self) {
        for id in self.next_id.saturating_sub(SEQS as u64)..self.next_id {
            self.core.abort(RequestId(id));
        }
        self.events.clear();
        for _ in 0..SEQS {
            let id = self.next_id;
            self.next_id += 1;
            let prompt =
                (0..PROMPT_LEN).map(|t| TokenId(1_000 + ((id as usize * 131 + t * 17) % 30_000) as u32)).collect();
            let request = GenerateRequest {
                prompt_token_ids: prompt,
                sampling: self.sampling.clone(),
                stop: StopParams {
                    max_tokens: MAX_MODEL_LEN - PROMPT_LEN,
                    skip_special_tokens: true,
                    ..Default::default()
                },
                pooling: None,
            };
            self.events.push(self.core.add(RequestId(id), request));
        }
        while self.core.scheduler().stats().num_running < SEQS || self.core.scheduler().stats().num_waiting > 0 {
            self.core.step();
            self.drain();
        }
        // One more step, so every request has finished its prompt and decodes; its events are all out before the
        // timed steps.
        self.core.step();
        std::thread::sleep(Duration::from_millis(50));
        self.drain();
    }

    /// Waits until every request's event of the last step (one token each) came from the output thread.
    fn wait_outputs(&mut self) {
        for rx in &mut self.events {
            loop {
                match rx.blocking_recv() {
                    Some(RequestEvent::Delta { token_ids, .. }) if !token_ids.is_empty() => break,
                    Some(RequestEvent::Error(m)) => panic!("a request failed: {m}"),
                    Some(_) => {}
                    None => panic!("a request's channel closed"),
                }
            }
        }
    }

    /// What the server's side would read from the channels (not timed).
    fn drain(&mut self) {
        for rx in &mut self.events {
            while let Ok(e) = rx.try_recv() {
                if let RequestEvent::Error(m) = e {
                    panic!("a request failed: {m}");
                }
            }
        }
    }
}

fn bench_host_step(c: &mut Criterion) {
    let mut group = c.benchmark_group("host_step_256");
    group.sample_size(30).measurement_time(Duration::from_secs(10));
    let greedy = SamplingParams { temperature: 0.0, ..Default::default() };
    let sampled = SamplingParams { temperature: 0.7, top_p: 0.9, ..Default::default() };
    let cases = [("greedy", greedy.clone(), false), ("sampled", sampled, false), ("greedy_with_outputs", greedy, true)];
    for (name, sampling, with_outputs) in cases {
        let mut bench = Bench::new(sampling);
        let mut steps = 0usize;
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    if steps == STEPS_PER_BATCH {
                        bench.refill();
                        steps = 0;
                    }
                    let start = Instant::now();
                    bench.core.step();
                    if with_outputs {
                        bench.wait_outputs();
                    }
                    total += start.elapsed();
                    steps += 1;
                    if !with_outputs {
                        // Outside the timed region: the output thread's work for this step ends before the next.
                        bench.wait_outputs();
                    }
                }
                total
            })
        });
        let st = bench.core.scheduler().stats();
        assert_eq!((st.num_running, st.num_preemptions), (SEQS, 0), "steady state held");
    }
    group.finish();
}

criterion_group!(benches, bench_host_step);
criterion_main!(benches);
