//! What the OpenCL backend's queue has done, counted on the host (`OpenClBackend::queue_stats`): how tests see that a
//! replayed step costs a few enqueues whatever the depth of the model, and that replays create no command-buffers.

use std::cell::Cell;

/// Counts since the backend was created.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueueStats {
    /// Commands enqueued on the queue: kernel launches, fills, writes, reads, and each replay as one.
    pub enqueued: u64,
    /// Command-buffers created (one per recording).
    pub command_buffers: u64,
    /// Recorded steps enqueued.
    pub replays: u64,
}

/// The counters behind `QueueStats` (the backend is used from one thread at a time).
#[derive(Default)]
pub(super) struct Counters(Cell<QueueStats>);

impl Counters {
    pub(super) fn get(&self) -> QueueStats {
        self.0.get()
    }

    fn bump(&self, f: impl FnOnce(&mut QueueStats)) {
        let mut s = self.0.get();
        f(&mut s);
        self.0.set(s);
    }

    pub(super) fn enqueued(&self) {
        self.bump(|s| s.enqueued += 1);
    }

    pub(super) fn command_buffer(&self) {
        self.bump(|s| s.command_buffers += 1);
    }

    pub(super) fn replay(&self) {
        self.bump(|s| {
            s.enqueued += 1;
            s.replays += 1
        });
    }
}
