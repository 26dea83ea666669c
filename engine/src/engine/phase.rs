//! Start-up phases in the log: each phase's name and time, at info level when it took a second or more (a user
//! waiting for "Application startup complete." wants to see where the time goes), at debug level otherwise.

use std::time::Instant;

/// A start-up phase being timed.
#[must_use = "a phase is logged when `done` is called"]
pub struct Phase {
    name: &'static str,
    t0: Instant,
}

impl Phase {
    pub fn start(name: &'static str) -> Self {
        Self { name, t0: Instant::now() }
    }

    /// Logs the phase with its time (and `detail`, when not empty).
    pub fn done(self, detail: &str) {
        let secs = self.t0.elapsed().as_secs_f64();
        let sep = if detail.is_empty() { "" } else { ": " };
        if secs >= 1.0 {
            tracing::info!("{}{sep}{detail} ({secs:.1} s)", self.name);
        } else {
            tracing::debug!("{}{sep}{detail} ({:.0} ms)", self.name, secs * 1e3);
        }
    }
}
