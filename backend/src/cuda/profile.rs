//! Opt-in per-op timing of the CUDA backend's eager steps (`--profile ops`, with `--enforce-eager` to
//! see decode steps; replays are timed by the step runner): a CUDA event pair around every op, summed per step
//! (a step ends when the logits are read back) and compared with the step's wall time, so the share of a decode step
//! the GPU is busy can be measured without Nsight. Windows of 64 decode steps (and of 8 steps with a prefill chunk)
//! are printed to stderr as `cuda-profile:` lines. Off by default: the events cost a little host time per op. (cudarc creates events with
//! timing disabled unless asked: they are created with `CU_EVENT_DEFAULT`.)

use std::time::Instant;

use cudarc::driver::{CudaContext, CudaEvent, CudaStream};

/// The steps of one kind (decode, or with a prefill chunk) since the last printed window.
#[derive(Default)]
struct Window {
    steps: usize,
    tokens: usize,
    wall_ms: f64,
    busy_ms: f64,
    per_op: std::collections::BTreeMap<&'static str, f64>,
}

impl Window {
    /// Adds one step; returns the window's summary line (and starts a new window) once it holds `size` steps.
    fn add(&mut self, tokens: usize, wall_ms: f64, busy_ms: f64, size: usize) -> Option<String> {
        self.steps += 1;
        self.tokens += tokens;
        self.wall_ms += wall_ms;
        self.busy_ms += busy_ms;
        if self.steps < size {
            return None;
        }
        let n = self.steps as f64;
        let ops: Vec<String> = self.per_op.iter().map(|(k, v)| format!("{k}={:.3}ms", v / n)).collect();
        let line = format!(
            "steps={} tokens_per_step={:.0} wall_per_step_ms={:.3} gpu_busy_per_step_ms={:.3} busy_share={:.1}% per_op[{}]",
            self.steps,
            self.tokens as f64 / n,
            self.wall_ms / n,
            self.busy_ms / n,
            100.0 * self.busy_ms / self.wall_ms.max(1e-9),
            ops.join(" ")
        );
        *self = Window::default();
        Some(line)
    }
}

pub(super) struct Profile {
    pending: Vec<(CudaEvent, CudaEvent, &'static str)>,
    open: Option<(CudaEvent, &'static str)>,
    step_start: Option<Instant>,
    last_done: Option<Instant>,
    tokens: usize,
    seqs: usize,
    decode: Window,
    /// Steps with a prefill chunk, printed every `PREFILL_WINDOW` such steps.
    prefill: Window,
}

/// Steps with a prefill chunk per printed window.
const PREFILL_WINDOW: usize = 8;

impl Profile {
    pub(super) fn new() -> Self {
        Self {
            pending: Vec::new(),
            open: None,
            step_start: None,
            last_done: None,
            tokens: 0,
            seqs: 0,
            decode: Window::default(),
            prefill: Window::default(),
        }
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
        let window = if decode { &mut self.decode } else { &mut self.prefill };
        for (a, b, name) in self.pending.drain(..) {
            let ms = a.elapsed_ms(&b).unwrap_or(0.0) as f64;
            busy += ms;
            *window.per_op.entry(name).or_default() += ms;
        }
        let (kind, size) =
            if decode { (format!("decode batch={}", self.seqs), 64) } else { ("prefill".to_string(), PREFILL_WINDOW) };
        if let Some(line) = window.add(self.tokens, wall, busy, size) {
            eprintln!("cuda-profile: {kind} {line}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Window;

    #[test]
    fn a_window_prints_per_step_averages_when_full_and_starts_again() {
        let mut w = Window::default();
        w.per_op.insert("matmul", 6.0);
        assert!(w.add(2048, 10.0, 8.0, 2).is_none());
        let line = w.add(2048, 30.0, 16.0, 2).expect("full window");
        assert!(
            line.contains("steps=2 tokens_per_step=2048 wall_per_step_ms=20.000 gpu_busy_per_step_ms=12.000"),
            "{line}"
        );
        assert!(line.contains("busy_share=60.0%") && line.contains("matmul=3.000ms"), "{line}");
        assert_eq!((w.steps, w.tokens, w.per_op.len()), (0, 0, 0));
    }
}
