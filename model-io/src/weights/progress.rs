//! The progress bar drawn while weights are read (as vLLM draws one over checkpoint shards): on a terminal only,
//! so logs and pipes get nothing but the log line that follows.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A bar over `total` tensors, drawn on stderr when it is a terminal (hidden otherwise). Safe to advance from the
/// loader's worker threads.
pub(crate) fn tensors(total: usize, what: &str) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("{msg}: {percent:>3}% |{wide_bar}| {pos}/{len} [{elapsed}<{eta}]") {
        bar.set_style(style);
    }
    bar.set_message(what.to_owned());
    bar
}

/// Advances the bar by one when dropped (when a tensor's loading ends, also by an error).
pub(crate) struct AdvanceOnDrop<'a>(pub(crate) &'a ProgressBar);

impl Drop for AdvanceOnDrop<'_> {
    fn drop(&mut self) {
        self.0.inc(1);
    }
}
