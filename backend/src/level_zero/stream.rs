//! `Stream`: one immediate command list whose commands run strictly in submission order. Each appended command
//! signals the next event of a ring and waits for the previous command's event, so a command never starts before
//! the one before it has finished. `synchronize()` waits on the host for the last command, then resets the events
//! it used and starts the ring over; the ring also synchronises by itself when it runs out of events.
//!
//! Uploads do not wait: the stream owns the host bytes until the next synchronisation.
//!
//! Recorded steps: between `begin_recording` and `end_recording` launches and fills go to a regular command list
//! instead (a barrier after each, so they run in order; host copies are refused), which waits for a `start` event
//! and signals a `done` event. `replay` appends one barrier to the immediate list (signalling `start` after the
//! last command), executes the recorded list on the stream's command queue, and makes `done` the event the next
//! command waits for: a replay costs the stream one append and one execution, whatever the step holds.
//!
//! Invariant: after `synchronize()` returns, every command appended before it has completed (so host memory a
//! command copied from or to may be reused and device memory may be returned to the driver), recorded steps
//! replayed before it included; their events are reset then, so a recording replays at most once between two
//! synchronisations (`replay` synchronises first otherwise).

use std::ffi::c_void;
use std::ptr;
use std::sync::Arc;

use level_zero_sys as sys;

use super::error::LzError;
use super::handles::{CommandList, CommandQueue, Context, Event, EventPool, Kernel};
use super::loader::ze;

type Result<T> = std::result::Result<T, LzError>;

/// Events in the ring: a step of a large model appends a few thousand commands; past that the ring synchronises.
pub const RING_EVENTS: u32 = 4096;

/// Host bytes of queued uploads after which the stream waits for them (bounds the host memory held for weights).
pub const STAGED_LIMIT: usize = 64 << 20;

/// What a stream has done so far (`LevelZeroBackend::stream_stats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamStats {
    /// Commands appended to the immediate list (a replay counts one).
    pub appended: u64,
    pub synchronizations: u64,
    /// Recorded steps executed.
    pub replays: u64,
}

/// A step recorded into a regular command list (`Stream::begin_recording`), executed again by `Stream::replay`.
pub struct Recorded {
    list: CommandList,
    start: Arc<Event>,
    done: Arc<Event>,
    _events: Arc<EventPool>,
    queue: Arc<CommandQueue>,
    /// Commands recorded (launches and fills, not counting the barriers between them).
    pub commands: u64,
}

impl Drop for Recorded {
    fn drop(&mut self) {
        // The list may still be executing: wait for the queue before it is destroyed.
        if let Err(e) = self.queue.synchronize() {
            tracing::warn!("Level Zero: waiting for a recorded step before destroying it failed: {e}");
        }
    }
}

pub struct Stream {
    // Field order is drop order: a recording and events before their pools, the lists before the context they share.
    recording: Option<Recorded>,
    /// Events of recordings replayed since the last synchronisation, reset by the next one.
    replayed: Vec<Arc<Event>>,
    events: Vec<Event>,
    _pool: Arc<EventPool>,
    queue: Option<Arc<CommandQueue>>,
    list: CommandList,
    ordinal: u32,
    /// Next ring slot to signal.
    next: usize,
    /// The event of the last appended command (a ring slot, or a replay's `done`), if any since the last
    /// synchronisation.
    last: Option<sys::ze_event_handle_t>,
    /// Host data of queued uploads, kept alive until the next synchronisation.
    staged: Vec<Vec<u8>>,
    staged_bytes: usize,
    /// Commands appended since the stream was created (for logs and tests).
    pub appended: u64,
    /// Host synchronisations so far.
    pub synchronizations: u64,
    /// Recorded steps executed so far.
    pub replays: u64,
}

// SAFETY: the raw event handle in `last` is one of the stream's own events (or a recording's it keeps alive), and
// Level Zero events are thread-safe objects; the stream itself is used by one thread at a time (`&mut self`).
unsafe impl Send for Stream {}

impl Stream {
    /// A stream on command-queue group `ordinal` of the context's device.
    pub fn new(ctx: &Arc<Context>, ordinal: u32, ring: u32) -> Result<Self> {
        let list = CommandList::immediate(ctx, ordinal)?;
        let pool = EventPool::new(ctx, ring)?;
        let events = (0..ring).map(|i| Event::new(&pool, i)).collect::<Result<Vec<_>>>()?;
        Ok(Self {
            recording: None,
            replayed: Vec::new(),
            events,
            _pool: pool,
            queue: None,
            list,
            ordinal,
            next: 0,
            last: None,
            staged: Vec::new(),
            staged_bytes: 0,
            appended: 0,
            synchronizations: 0,
            replays: 0,
        })
    }

    /// Appends one command to the recording in progress: `append(list)` then a barrier, so recorded commands run in
    /// order. False when nothing is being recorded.
    fn record(&mut self, append: impl FnOnce(sys::ze_command_list_handle_t) -> Result<()>) -> Result<bool> {
        let Some(r) = self.recording.as_mut() else { return Ok(false) };
        append(r.list.raw)?;
        // SAFETY: valid regular list; no events.
        unsafe { ze!(r.list.ctx.api, zeCommandListAppendBarrier(r.list.raw, ptr::null_mut(), 0, ptr::null_mut()))? };
        r.commands += 1;
        Ok(true)
    }

    /// Starts recording: launches and fills go to a new regular command list until `end_recording`.
    pub fn begin_recording(&mut self) -> Result<()> {
        if self.recording.is_some() {
            return Err(LzError::Invalid("a recording is already in progress".into()));
        }
        let ctx = self.list.ctx.clone();
        let queue = match &self.queue {
            Some(q) => q.clone(),
            None => self.queue.insert(CommandQueue::new(&ctx, self.ordinal)?).clone(),
        };
        let list = CommandList::regular(&ctx, self.ordinal)?;
        let pool = EventPool::new(&ctx, 2)?;
        let (start, done) = (Arc::new(Event::new(&pool, 0)?), Arc::new(Event::new(&pool, 1)?));
        let mut wait = start.raw;
        // SAFETY: valid regular list and event.
        unsafe { ze!(ctx.api, zeCommandListAppendWaitOnEvents(list.raw, 1, &mut wait))? };
        self.recording = Some(Recorded { list, start, done, _events: pool, queue, commands: 0 });
        Ok(())
    }

    /// Ends the recording in progress (also after a failed command): closes its list, which signals `done` last.
    pub fn end_recording(&mut self) -> Result<Recorded> {
        let r = self.recording.take().ok_or_else(|| LzError::Invalid("no recording is in progress".into()))?;
        // SAFETY: valid regular list and event.
        unsafe { ze!(r.list.ctx.api, zeCommandListAppendBarrier(r.list.raw, r.done.raw, 0, ptr::null_mut()))? };
        r.list.close()?;
        Ok(r)
    }

    /// Executes a recorded step after every command appended so far; the next command waits for it.
    pub fn replay(&mut self, r: &Recorded) -> Result<()> {
        if self.recording.is_some() {
            return Err(LzError::Invalid("a recorded step cannot be replayed into a recording".into()));
        }
        if self.replayed.iter().any(|e| Arc::ptr_eq(e, &r.start)) {
            // Its events are still signalled from the last replay: they are reset at a synchronisation.
            self.synchronize()?;
        }
        let mut waits = self.last;
        let (n, wp) = match waits.as_mut() {
            Some(w) => (1, w as *mut sys::ze_event_handle_t),
            None => (0, ptr::null_mut()),
        };
        // SAFETY: valid immediate list and events.
        unsafe { ze!(self.list.ctx.api, zeCommandListAppendBarrier(self.list.raw, r.start.raw, n, wp))? };
        self.appended += 1;
        r.queue.execute(&r.list)?;
        self.last = Some(r.done.raw);
        self.replayed.push(r.start.clone());
        self.replayed.push(r.done.clone());
        self.replays += 1;
        Ok(())
    }

    /// (signal event, wait events) for the next command, synchronising first when the ring is used up.
    fn slots(&mut self) -> Result<(sys::ze_event_handle_t, Option<sys::ze_event_handle_t>)> {
        if self.next == self.events.len() {
            self.synchronize()?;
        }
        Ok((self.events[self.next].raw, self.last))
    }

    fn appended_one(&mut self) {
        self.last = Some(self.events[self.next].raw);
        self.next += 1;
        self.appended += 1;
    }

    /// Launches `kernel` (arguments and group size already set) on `groups` work-groups.
    pub fn launch(&mut self, kernel: &Kernel, groups: [u32; 3]) -> Result<()> {
        let count = sys::ze_group_count_t { groupCountX: groups[0], groupCountY: groups[1], groupCountZ: groups[2] };
        let api = self.list.ctx.api;
        // SAFETY: valid list, kernel and group count; no events.
        let recorded = self.record(|list| unsafe {
            ze!(api, zeCommandListAppendLaunchKernel(list, kernel.raw, &count, ptr::null_mut(), 0, ptr::null_mut()))
        })?;
        if recorded {
            return Ok(());
        }
        let (signal, wait) = self.slots()?;
        let mut waits = wait;
        let (n, wp) = match waits.as_mut() {
            Some(w) => (1, w as *mut sys::ze_event_handle_t),
            None => (0, ptr::null_mut()),
        };
        // SAFETY: valid list, kernel, group count, events; the arguments were copied into the kernel when set.
        unsafe {
            ze!(self.list.ctx.api, zeCommandListAppendLaunchKernel(self.list.raw, kernel.raw, &count, signal, n, wp))?
        };
        self.appended_one();
        Ok(())
    }

    /// Copies `bytes` (> 0) from `src` to `dst` (device or host memory). Host memory must stay valid until the next
    /// `synchronize()`.
    pub fn copy(&mut self, dst: *mut c_void, src: *const c_void, bytes: usize) -> Result<()> {
        if self.recording.is_some() {
            return Err(LzError::Invalid("a copy cannot be part of a recorded step".into()));
        }
        let (signal, wait) = self.slots()?;
        let mut waits = wait;
        let (n, wp) = match waits.as_mut() {
            Some(w) => (1, w as *mut sys::ze_event_handle_t),
            None => (0, ptr::null_mut()),
        };
        // SAFETY: the caller guarantees `dst`/`src` hold `bytes` bytes until the copy completes.
        unsafe {
            ze!(self.list.ctx.api, zeCommandListAppendMemoryCopy(self.list.raw, dst, src, bytes, signal, n, wp))?
        };
        self.appended_one();
        Ok(())
    }

    /// Copies `data` to device memory at `dst` without waiting: the stream keeps the host bytes until the next
    /// synchronisation (and synchronises early when more than `STAGED_LIMIT` bytes are waiting).
    pub fn upload(&mut self, dst: *mut c_void, data: Vec<u8>) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        // A Vec's heap block does not move when the Vec is moved into `staged`.
        self.copy(dst, data.as_ptr().cast(), data.len())?;
        self.staged_bytes += data.len();
        self.staged.push(data);
        if self.staged_bytes > STAGED_LIMIT {
            self.synchronize()?;
        }
        Ok(())
    }

    /// Fills `bytes` (> 0) of device memory at `dst` with zeros.
    pub fn zero(&mut self, dst: *mut c_void, bytes: usize) -> Result<()> {
        static PATTERN: u8 = 0;
        let pattern = (&PATTERN as *const u8).cast();
        let api = self.list.ctx.api;
        // SAFETY: `dst` holds `bytes` bytes; the pattern is a static; no events.
        let recorded = self.record(|list| unsafe {
            ze!(api, zeCommandListAppendMemoryFill(list, dst, pattern, 1, bytes, ptr::null_mut(), 0, ptr::null_mut()))
        })?;
        if recorded {
            return Ok(());
        }
        let (signal, wait) = self.slots()?;
        let mut waits = wait;
        let (n, wp) = match waits.as_mut() {
            Some(w) => (1, w as *mut sys::ze_event_handle_t),
            None => (0, ptr::null_mut()),
        };
        // SAFETY: `dst` holds `bytes` bytes; the pattern is a static, valid whenever the driver reads it.
        unsafe {
            ze!(
                self.list.ctx.api,
                zeCommandListAppendMemoryFill(
                    self.list.raw,
                    dst,
                    (&PATTERN as *const u8).cast(),
                    1,
                    bytes,
                    signal,
                    n,
                    wp
                )
            )?
        };
        self.appended_one();
        Ok(())
    }

    /// Waits until every appended command has completed, then recycles the ring.
    pub fn synchronize(&mut self) -> Result<()> {
        let Some(last) = self.last else {
            self.next = 0;
            return Ok(());
        };
        // SAFETY: valid event (a ring slot, or the `done` of a recording `replayed` keeps alive); u64::MAX waits
        // without a time limit.
        unsafe { ze!(self.list.ctx.api, zeEventHostSynchronize(last, u64::MAX))? };
        // Every command of the ring and every replay has completed (each waited for the one before), so no pending
        // command signals or waits on these events any more.
        for e in &self.events[..self.next] {
            e.host_reset()?;
        }
        for e in self.replayed.drain(..) {
            e.host_reset()?;
        }
        self.next = 0;
        self.last = None;
        self.staged.clear();
        self.staged_bytes = 0;
        self.synchronizations += 1;
        Ok(())
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let Err(e) = self.synchronize() {
            tracing::warn!("Level Zero: synchronising the stream at shutdown failed: {e}");
        }
    }
}
