//! Opt-in per-op timing of the CUDA backend's eager steps (`RSERVE_CUDA_PROFILE_OPS=1`, with `--enforce-eager` to
//! see decode steps; graph replays are timed by `graph_runner`): a CUDA event pair around every op, summed per step
//! (a step ends when the logits are read back) and compared with the step's wall time, so the share of a decode step
//! the GPU is busy can be measured without Nsight. Windows of 64 decode steps (and of 8 steps with a prefill chunk)
//! are printed to stderr as `cuda-profile:` lines. Off by default: the events cost a little host time per op. (cudarc creates events with
//! timing disabled unless asked: they are created with `CU_EVENT_DEFAULT`.)

use std::time::Instant;

use cudarc::driver::{CudaContext, CudaEvent, CudaStream};

/// Step kind by its shape: decode (one new token per sequence) or anything with a prefill chunk.
#[derive(Default)]
struct Window {
    steps: usize,
    wall_ms: f64,
    busy_ms: f64,
    ops: usize,
}

pub(super) struct Profile {
    pending: Vec<(CudaEvent, CudaEvent, &'static str)>,
    open: Option<(CudaEvent, &'static str)>,
    step_start: Option<Instant>,
    last_done: Option<Instant>,
    tokens: usize,
    seqs: usize,
    decode: Window,
    per_op: std::collections::BTreeMap<&'static str, f64>,
    /// The same for steps with a prefill chunk, printed every `PREFILL_WINDOW` such steps.
    prefill: Window,
    prefill_tokens: usize,
    prefill_per_op: std::collections::BTreeMap<&'static str, f64>,
}

/// Steps with a prefill chunk per printed window.
const PREFILL_WINDOW: usize = 8;

impl Profile {
    pub(super) fn from_env() -> Option<Self> {
        std::env::var("RSERVE_CUDA_PROFILE_OPS").ok().filter(|v| v == "1").map(|_| Self {
            pending: Vec::new(),
            open: None,
            step_start: None,
            last_done: None,
            tokens: 0,
            seqs: 0,
            decode: Window::default(),
            per_op: Default::default(),
            prefill: Window::default(),
            prefill_tokens: 0,
            prefill_per_op: Default::default(),
        })
    }

    pub(super) fn note_shape(&mut self, tokens: Option<usize>, seqs: Option<usize>) {
        if let Some(t) = tokens {
            self.tokens = t;
        }
        if let Some(s) = seqs {
            self.seqs = s;
        }
    }

    pub(super) fn begin(&mut self, ctx: &std::sync::Arc<CudaContext>, stream: &CudaStream, name: &'static str) {
        if self.step_start.is_none() {
            self.step_start = Some(Instant::now());
        }
        if let Ok(e) = ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT)) {
            if e.record(stream).is_ok() {
                self.open = Some((e, name));
            }
        }
    }

    pub(super) fn end(&mut self, ctx: &std::sync::Arc<CudaContext>, stream: &CudaStream) {
        if let Some((start, name)) = self.open.take() {
            if let Ok(e) = ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT)) {
                if e.record(stream).is_ok() {
                    self.pending.push((start, e, name));
                }
            }
        }
    }

    /// Called after a blocking read-back (the end of a step): sums the op times of the step.
    pub(super) fn step_done(&mut self) {
        let Some(t0) = self.step_start.take() else { return };
        // A step's wall time runs from the end of the previous step (so host work between steps counts), unless
        // the engine sat idle in between.
        let now = Instant::now();
        let from = match self.last_done {
            Some(d) if now.duration_since(d).as_secs_f64() < 1.0 => d,
            _ => t0,
        };
        self.last_done = Some(now);
        let wall = now.duration_since(from).as_secs_f64() * 1e3;
        let mut busy = 0.0;
        let decode = self.tokens > 0 && self.tokens == self.seqs;
        for (a, b, name) in self.pending.drain(..) {
            let ms = a.elapsed_ms(&b).unwrap_or(0.0) as f64;
            busy += ms;
            let map = if decode { &mut self.per_op } else { &mut self.prefill_per_op };
            *map.entry(name).or_default() += ms;
        }
        if !decode {
            self.prefill.steps += 1;
            self.prefill.wall_ms += wall;
            self.prefill.busy_ms += busy;
            self.prefill_tokens += self.tokens;
            if self.prefill.steps == PREFILL_WINDOW {
                let w = &self.prefill;
                let ops: Vec<String> =
                    self.prefill_per_op.iter().map(|(k, v)| format!("{k}={:.3}ms", v / w.steps as f64)).collect();
                eprintln!(
                    "cuda-profile: prefill steps={} tokens_per_step={:.0} wall_per_step_ms={:.3} gpu_busy_per_step_ms={:.3} per_op[{}]",
                    w.steps,
                    self.prefill_tokens as f64 / w.steps as f64,
                    w.wall_ms / w.steps as f64,
                    w.busy_ms / w.steps as f64,
                    ops.join(" ")
                );
                self.prefill = Window::default();
                self.prefill_tokens = 0;
                self.prefill_per_op.clear();
            }
            return;
        }
        if decode {
            self.decode.steps += 1;
            self.decode.wall_ms += wall;
            self.decode.busy_ms += busy;
            self.decode.ops += 1;
            if self.decode.steps == 64 {
                let w = &self.decode;
                let top: Vec<String> =
                    self.per_op.iter().map(|(k, v)| format!("{k}={:.3}ms", v / w.steps as f64)).collect();
                eprintln!(
                    "cuda-profile: decode batch={} steps={} wall_per_step_ms={:.3} gpu_busy_per_step_ms={:.3} busy_share={:.1}% per_op[{}]",
                    self.seqs,
                    w.steps,
                    w.wall_ms / w.steps as f64,
                    w.busy_ms / w.steps as f64,
                    100.0 * w.busy_ms / w.wall_ms.max(1e-9),
                    top.join(" ")
                );
                self.decode = Window::default();
                self.per_op.clear();
            }
        }
    }
}
