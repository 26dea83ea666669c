//! A batch's progress: on a terminal an indicatif bar (lines done / total, output tokens/s, ETA); elsewhere (a job
//! log) one line every `LOG_INTERVAL`, so that a log file gets a readable record rather than a redrawn bar. Output
//! tokens are the engine's own `generation_tokens` counter, the number `/metrics` reports.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How often the progress line is logged when stderr is not a terminal.
pub const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Reads the engine's output-token counter.
pub type TokenCounter = Box<dyn Fn() -> u64 + Send + Sync>;

pub struct Progress {
    bar: Option<ProgressBar>,
    /// Lines this run has to answer, when known.
    total: Option<u64>,
    done: AtomicU64,
    errors: AtomicU64,
    start: Instant,
    tokens: TokenCounter,
    tokens_at_start: u64,
}

impl Progress {
    /// A bar on a terminal, else nothing drawn (`report_periodically` logs instead).
    pub fn new(total: Option<u64>, tokens: TokenCounter) -> Arc<Self> {
        let bar = std::io::stderr().is_terminal().then(|| bar(total));
        let tokens_at_start = tokens();
        Arc::new(Self {
            bar,
            total,
            done: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            start: Instant::now(),
            tokens,
            tokens_at_start,
        })
    }

    /// One output line written.
    pub fn line_done(&self, error: bool) {
        self.done.fetch_add(1, Ordering::Relaxed);
        if error {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(bar) = &self.bar {
            bar.inc(1);
            bar.set_message(self.rates());
        }
    }

    /// Lines written, of them error lines.
    pub fn counts(&self) -> (u64, u64) {
        (self.done.load(Ordering::Relaxed), self.errors.load(Ordering::Relaxed))
    }

    /// Output tokens per second since the start.
    pub fn tokens_per_s(&self) -> f64 {
        let tokens = (self.tokens)().saturating_sub(self.tokens_at_start);
        tokens as f64 / self.start.elapsed().as_secs_f64().max(1e-3)
    }

    fn rates(&self) -> String {
        let (_, errors) = self.counts();
        format!("{:.1} tok/s, {errors} error lines", self.tokens_per_s())
    }

    /// Reports while the batch runs (as a task; abort it at the end): the bar's rates every second (output tokens
    /// flow between finished lines too), or without a bar `status_line` every `LOG_INTERVAL`.
    pub async fn report_periodically(self: Arc<Self>) {
        let mut last = u64::MAX;
        loop {
            if let Some(bar) = &self.bar {
                tokio::time::sleep(Duration::from_secs(1)).await;
                bar.set_message(self.rates());
                continue;
            }
            tokio::time::sleep(LOG_INTERVAL).await;
            let (done, errors) = self.counts();
            if done != last {
                last = done;
                let line = status_line(done, self.total, errors, self.tokens_per_s(), self.start.elapsed());
                tracing::info!("{line}");
            }
        }
    }

    /// Takes the bar off the screen (the summary is logged after it).
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

fn bar(total: Option<u64>) -> ProgressBar {
    let target = ProgressDrawTarget::stderr();
    let (bar, template) = match total {
        Some(n) => (
            ProgressBar::with_draw_target(Some(n), target),
            "Running batch {wide_bar} {pos}/{len} lines [{elapsed_precise}<{eta_precise}] {msg}",
        ),
        None => (
            ProgressBar::with_draw_target(None, target),
            "{spinner} Running batch: {pos} lines [{elapsed_precise}] {msg}",
        ),
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    bar.enable_steady_tick(Duration::from_millis(250));
    bar
}

/// `Running batch: 500/1000 lines (50%), 3 error lines, 812.4 output tokens/s, ETA 1m 2s`.
pub fn status_line(done: u64, total: Option<u64>, errors: u64, tokens_per_s: f64, elapsed: Duration) -> String {
    let mut line = match total {
        Some(total) => {
            format!("Running batch: {done}/{total} lines ({:.0}%)", 100.0 * done as f64 / total.max(1) as f64)
        }
        None => format!("Running batch: {done} lines"),
    };
    line += &format!(", {errors} error lines, {tokens_per_s:.1} output tokens/s");
    if let Some(total) = total.filter(|&t| done > 0 && done < t) {
        let per_line = elapsed.as_secs_f64() / done as f64;
        line += &format!(", ETA {}", human_duration((total - done) as f64 * per_line));
    }
    line
}

fn human_duration(secs: f64) -> String {
    let s = secs.round() as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m {}s", s / 60, s % 60),
        _ => format!("{}h {}m", s / 3600, s % 3600 / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_line_has_counts_rate_and_eta() {
        let line = status_line(500, Some(1000), 3, 812.44, Duration::from_secs(62));
        assert_eq!(line, "Running batch: 500/1000 lines (50%), 3 error lines, 812.4 output tokens/s, ETA 1m 2s");
        let line = status_line(7, None, 0, 1.0, Duration::from_secs(1));
        assert_eq!(line, "Running batch: 7 lines, 0 error lines, 1.0 output tokens/s");
        assert!(!status_line(10, Some(10), 0, 1.0, Duration::from_secs(1)).contains("ETA"));
        assert_eq!(human_duration(7300.0), "2h 1m");
    }
}
