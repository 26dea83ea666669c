//! Process-wide counts of Level Zero handles created and destroyed, by kind, plus failed API calls. A test ends a
//! run by asserting that every kind balances (nothing leaked, nothing destroyed twice) and that no call failed.
//! Also the device allocations made with relaxed limits (over `maxMemAllocSize`), so a test sees that descriptor
//! reached the driver.
//!
//! Invariant: a handle counts as destroyed only when its destroy call succeeded.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// The kinds of Level Zero objects the wrapper creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandleKind {
    Context,
    CommandList,
    CommandQueue,
    EventPool,
    Event,
    Module,
    BuildLog,
    Kernel,
    DeviceMemory,
}

impl HandleKind {
    pub const ALL: [HandleKind; 9] = [
        HandleKind::Context,
        HandleKind::CommandList,
        HandleKind::CommandQueue,
        HandleKind::EventPool,
        HandleKind::Event,
        HandleKind::Module,
        HandleKind::BuildLog,
        HandleKind::Kernel,
        HandleKind::DeviceMemory,
    ];

    fn index(self) -> usize {
        self as usize
    }
}

const N: usize = HandleKind::ALL.len();
static CREATED: [AtomicU64; N] = [const { AtomicU64::new(0) }; N];
static DESTROYED: [AtomicU64; N] = [const { AtomicU64::new(0) }; N];
static FAILED_CALLS: AtomicU64 = AtomicU64::new(0);
static RELAXED_ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

pub(crate) fn created(kind: HandleKind) {
    CREATED[kind.index()].fetch_add(1, Ordering::Relaxed);
}

pub(crate) fn destroyed(kind: HandleKind) {
    DESTROYED[kind.index()].fetch_add(1, Ordering::Relaxed);
}

pub(crate) fn call_failed() {
    FAILED_CALLS.fetch_add(1, Ordering::Relaxed);
}

pub(crate) fn relaxed_allocation() {
    RELAXED_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
}

/// Successful `zeMemAllocDevice` calls whose descriptor chained `ze_relaxed_allocation_limits_exp_desc_t` (each is
/// also a `DeviceMemory` handle of `handle_counts`).
pub fn relaxed_allocations() -> u64 {
    RELAXED_ALLOCATIONS.load(Ordering::Relaxed)
}

/// A snapshot of the counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandleCounts {
    /// (kind, created, destroyed) for every kind.
    pub kinds: Vec<(HandleKind, u64, u64)>,
    /// Level Zero calls that returned an error (the validation layer's rejections included).
    pub failed_calls: u64,
}

impl HandleCounts {
    /// Handles created and not destroyed.
    pub fn live(&self) -> u64 {
        self.kinds.iter().map(|(_, c, d)| c.saturating_sub(*d)).sum()
    }

    /// Every kind balances (created == destroyed).
    pub fn balanced(&self) -> bool {
        self.kinds.iter().all(|(_, c, d)| c == d)
    }

    pub fn total_created(&self) -> u64 {
        self.kinds.iter().map(|(_, c, _)| c).sum()
    }
}

impl fmt::Display for HandleCounts {
    /// One line: `Context 1/1 CommandList 1/1 ... failed_calls 0` (created/destroyed).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (k, c, d) in &self.kinds {
            write!(f, "{k:?} {c}/{d} ")?;
        }
        write!(f, "failed_calls {}", self.failed_calls)
    }
}

/// The counters now.
pub fn handle_counts() -> HandleCounts {
    HandleCounts {
        kinds: HandleKind::ALL
            .iter()
            .map(|&k| (k, CREATED[k.index()].load(Ordering::Relaxed), DESTROYED[k.index()].load(Ordering::Relaxed)))
            .collect(),
        failed_calls: FAILED_CALLS.load(Ordering::Relaxed),
    }
}
