//! `Stream`: one immediate command list whose commands run strictly in submission order. Each appended command
//! signals the next event of a ring and waits for the previous command's event, so a command never starts before
//! the one before it has finished. `synchronize()` waits on the host for the last command, then resets the events
//! it used and starts the ring over; the ring also synchronises by itself when it runs out of events.
//!
//! Uploads do not wait: the stream owns the host bytes until the next synchronisation.
//!
//! Invariant: after `synchronize()` returns, every command appended before it has completed (so host memory a
//! command copied from or to may be reused and device memory may be returned to the driver).

use std::ffi::c_void;
use std::ptr;
use std::sync::Arc;

use level_zero_sys as sys;

use super::error::LzError;
use super::handles::{CommandList, Context, Event, EventPool, Kernel};
use super::loader::ze;

type Result<T> = std::result::Result<T, LzError>;

/// Events in the ring: a step of a large model appends a few thousand commands; past that the ring synchronises.
pub const RING_EVENTS: u32 = 4096;

/// Host bytes of queued uploads after which the stream waits for them (bounds the host memory held for weights).
pub const STAGED_LIMIT: usize = 64 << 20;

pub struct Stream {
    // Field order is drop order: events before their pool, the list before the context they share.
    events: Vec<Event>,
    _pool: Arc<EventPool>,
    list: CommandList,
    /// Next ring slot to signal.
    next: usize,
    /// Ring slot of the last appended command, if any since the last synchronisation.
    last: Option<usize>,
    /// Host data of queued uploads, kept alive until the next synchronisation.
    staged: Vec<Vec<u8>>,
    staged_bytes: usize,
    /// Commands appended since the stream was created (for logs and tests).
    pub appended: u64,
    /// Host synchronisations so far.
    pub synchronizations: u64,
}

impl Stream {
    /// A stream on command-queue group `ordinal` of the context's device.
    pub fn new(ctx: &Arc<Context>, ordinal: u32, ring: u32) -> Result<Self> {
        let list = CommandList::immediate(ctx, ordinal)?;
        let pool = EventPool::new(ctx, ring)?;
        let events = (0..ring).map(|i| Event::new(&pool, i)).collect::<Result<Vec<_>>>()?;
        Ok(Self {
            events,
            _pool: pool,
            list,
            next: 0,
            last: None,
            staged: Vec::new(),
            staged_bytes: 0,
            appended: 0,
            synchronizations: 0,
        })
    }

    /// (signal event, wait events) for the next command, synchronising first when the ring is used up.
    fn slots(&mut self) -> Result<(sys::ze_event_handle_t, Option<sys::ze_event_handle_t>)> {
        if self.next == self.events.len() {
            self.synchronize()?;
        }
        let signal = self.events[self.next].raw;
        let wait = self.last.map(|i| self.events[i].raw);
        Ok((signal, wait))
    }

    fn appended_one(&mut self) {
        self.last = Some(self.next);
        self.next += 1;
        self.appended += 1;
    }

    /// Launches `kernel` (arguments and group size already set) on `groups` work-groups.
    pub fn launch(&mut self, kernel: &Kernel, groups: [u32; 3]) -> Result<()> {
        let (signal, wait) = self.slots()?;
        let count = sys::ze_group_count_t { groupCountX: groups[0], groupCountY: groups[1], groupCountZ: groups[2] };
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
        let (signal, wait) = self.slots()?;
        let mut waits = wait;
        let (n, wp) = match waits.as_mut() {
            Some(w) => (1, w as *mut sys::ze_event_handle_t),
            None => (0, ptr::null_mut()),
        };
        static PATTERN: u8 = 0;
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
        self.events[last].host_synchronize()?;
        // Every command of the ring has completed (each waited for the one before), so no pending command signals
        // or waits on these events any more.
        for e in &self.events[..self.next] {
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
