//! Device memory: `LzBuffer` (one allocation with its element type) and `MemPool`, a caching allocator in stream
//! order. A dropped buffer's memory goes back to the pool at once and may serve the next allocation even while
//! earlier commands that used it are still queued: every command runs after the ones appended before it (see
//! `stream`), so the new owner's commands cannot overtake the old owner's. Memory goes back to the driver
//! (`zeMemFree`) only when the stream is idle: `trim` after a synchronisation, and when the pool itself drops.
//!
//! Sizes are rounded up to classes (four per power of two, at least 256 bytes) so steps of slightly different
//! batch sizes reuse the same blocks.
//!
//! Two free lists: memory taken while a step is being recorded (`set_recording`) belongs to the recordings and only
//! ever goes back to their list, never to the driver before the pool drops, so nothing outside a recording is handed
//! memory that a later replay overwrites. Recordings share their list: they replay one at a time on one stream, and
//! their activations are dead between replays.
//!
//! A class over the device's `maxMemAllocSize` (a PVC tile reports about 4 GiB; a large KV pool or a big model's
//! embedding table needs more) is allocated with relaxed limits (`ze_relaxed_allocation_limits_exp_desc_t`) where
//! the driver advertises the extension, and refused with `LzError::AllocationTooLarge` where it does not; every
//! smaller class takes the plain call. The kernels are built for such buffers: `BUILD_FLAGS` in `backend` for
//! SPIR-V, the ocloc options of `kernels/build.rs` for the PVC binaries.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, MutexGuard};

use super::discovery::{DeviceInfo, RELAXED_ALLOCATION_LIMITS};
use super::error::LzError;
use super::handles::{alloc_device, free_device, Context};
pub use crate::kernels::Contents;

type Result<T> = std::result::Result<T, LzError>;

/// Alignment of every allocation (enough for any element type and for vector loads).
const ALIGN: usize = 256;

/// The allocation size class of a request: `bytes` rounded up to a quarter of its power of two (>= 256 bytes).
pub fn size_class(bytes: usize) -> usize {
    let b = bytes.max(ALIGN);
    let pow = usize::BITS - 1 - b.leading_zeros(); // floor(log2(b))
    let step = (1usize << pow) >> 2;
    b.div_ceil(step.max(1)) * step.max(1)
}

/// What one allocation may be on a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AllocLimits {
    /// The largest single allocation (`maxMemAllocSize`; 0 when the driver does not say: no limit is checked).
    pub max_alloc: u64,
    /// The driver advertises `ZE_experimental_relaxed_allocation_limits`: a larger allocation is made with its
    /// descriptor instead of refused.
    pub relaxed: bool,
}

impl AllocLimits {
    /// The limits the driver reported for the device.
    pub fn of(info: &DeviceInfo) -> Self {
        Self { max_alloc: info.max_alloc, relaxed: info.relaxed_alloc_limits }
    }

    /// Whether a block of `class` bytes (for a buffer of `bytes`) needs relaxed limits; the typed error when it
    /// would and the driver lacks them.
    pub fn needs_relaxed(self, bytes: usize, class: usize) -> Result<bool> {
        if self.max_alloc == 0 || class as u64 <= self.max_alloc {
            return Ok(false);
        }
        if !self.relaxed {
            return Err(LzError::AllocationTooLarge {
                bytes,
                class,
                max_alloc: self.max_alloc,
                extension: RELAXED_ALLOCATION_LIMITS,
            });
        }
        Ok(true)
    }
}

#[derive(Clone, Copy)]
struct DevPtr(*mut c_void);

/// A block taken from the pool, not yet wrapped in a buffer.
pub struct Block {
    ptr: DevPtr,
    class: usize,
    /// Taken while recording: goes back to the recordings' list.
    recorded: bool,
}

// SAFETY: a device address is plain data; only Level Zero dereferences it.
unsafe impl Send for DevPtr {}

#[derive(Default)]
struct Cache {
    free: BTreeMap<usize, Vec<DevPtr>>,
    /// The recordings' free blocks (not counted in `cached_bytes`: never trimmed).
    recorded_free: BTreeMap<usize, Vec<DevPtr>>,
    recording: bool,
    cached_bytes: u64,
    in_use_bytes: u64,
    peak_bytes: u64,
}

/// The device memory of one backend.
pub struct MemPool {
    ctx: Arc<Context>,
    limits: AllocLimits,
    cache: Mutex<Cache>,
}

impl MemPool {
    pub fn new(ctx: &Arc<Context>, limits: AllocLimits) -> Arc<Self> {
        if limits.max_alloc > 0 {
            tracing::debug!(
                "Level Zero: largest allocation {} bytes (maxMemAllocSize); larger ones {}",
                limits.max_alloc,
                if limits.relaxed { "with relaxed limits" } else { "refused (no relaxed-limits extension)" }
            );
        }
        Arc::new(Self { ctx: ctx.clone(), limits, cache: Mutex::new(Cache::default()) })
    }

    fn lock(&self) -> MutexGuard<'_, Cache> {
        // A panic while holding the lock cannot leave the maps inconsistent (every update is one statement).
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A block of at least `bytes` bytes: a cached one of the same class, else a new allocation (with relaxed
    /// limits over `maxMemAllocSize`). Fails with `LzError::AllocationTooLarge` over the limit on a driver without
    /// relaxed limits, or with the driver's error (e.g. ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY); the caller may `trim`
    /// and retry.
    pub fn take(&self, bytes: usize) -> Result<Block> {
        let class = size_class(bytes);
        let relaxed = self.limits.needs_relaxed(bytes, class)?;
        let mut c = self.lock();
        let recorded = c.recording;
        let list = if recorded { &mut c.recorded_free } else { &mut c.free };
        let reused = list.get_mut(&class).and_then(|v| v.pop());
        let p = match reused {
            Some(p) if recorded => p,
            Some(p) => {
                c.cached_bytes -= class as u64;
                p
            }
            None => {
                drop(c);
                let p = DevPtr(alloc_device(&self.ctx, class, ALIGN, relaxed)?);
                c = self.lock();
                p
            }
        };
        c.in_use_bytes += class as u64;
        c.peak_bytes = c.peak_bytes.max(c.in_use_bytes);
        Ok(Block { ptr: p, class, recorded })
    }

    /// Whether allocations now belong to the recordings (between `begin_recording` and `end_recording`).
    pub fn set_recording(&self, on: bool) {
        self.lock().recording = on;
    }

    fn give_back(&self, p: DevPtr, class: usize, recorded: bool) {
        let mut c = self.lock();
        c.in_use_bytes = c.in_use_bytes.saturating_sub(class as u64);
        if recorded {
            c.recorded_free.entry(class).or_default().push(p);
            return;
        }
        c.cached_bytes += class as u64;
        c.free.entry(class).or_default().push(p);
    }

    /// Returns cached blocks to the driver, largest first, until at most `keep` bytes stay cached. Only while the
    /// stream is idle (no queued command may use a cached block).
    pub fn trim(&self, keep: u64) {
        let mut c = self.lock();
        while c.cached_bytes > keep {
            let Some((&class, _)) = c.free.iter().next_back() else { break };
            let ptrs = c.free.remove(&class).unwrap_or_default();
            for p in ptrs {
                free_device(&self.ctx, p.0);
                c.cached_bytes -= class as u64;
            }
        }
    }

    /// (bytes in live buffers, bytes cached for reuse, peak bytes in live buffers).
    pub fn usage(&self) -> (u64, u64, u64) {
        let c = self.lock();
        (c.in_use_bytes, c.cached_bytes, c.peak_bytes)
    }
}

impl Drop for MemPool {
    fn drop(&mut self) {
        // Every buffer holds an Arc to the pool and the stream synchronised when the backend dropped: all idle.
        self.trim(0);
        let recorded = std::mem::take(&mut self.lock().recorded_free);
        for p in recorded.into_values().flatten() {
            free_device(&self.ctx, p.0);
        }
    }
}

/// A device allocation. Dropping it returns the memory to its pool.
pub struct LzBuffer {
    ptr: DevPtr,
    class: usize,
    recorded: bool,
    bytes: usize,
    pub(crate) contents: Contents,
    pool: Arc<MemPool>,
}

impl LzBuffer {
    /// A buffer of `bytes` bytes in `block` (taken from `pool`), described by `contents`; not initialised.
    pub fn wrap(pool: &Arc<MemPool>, block: Block, bytes: usize, contents: Contents) -> Self {
        Self { ptr: block.ptr, class: block.class, recorded: block.recorded, bytes, contents, pool: pool.clone() }
    }

    /// The device address, for kernel arguments and copies.
    pub fn device_ptr(&self) -> *mut c_void {
        self.ptr.0
    }

    /// Bytes of the contents (not of the rounded allocation).
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl std::fmt::Debug for LzBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LzBuffer({:?}, {} bytes)", self.contents, self.bytes)
    }
}

impl Drop for LzBuffer {
    fn drop(&mut self) {
        self.pool.give_back(self.ptr, self.class, self.recorded);
    }
}

#[cfg(test)]
mod tests {
    use super::{size_class, AllocLimits};
    use crate::level_zero::error::LzError;

    const GIB: usize = 1 << 30;

    #[test]
    fn over_the_limit_without_the_extension_is_a_typed_error() {
        // A PVC tile's limit, a 5 GiB KV pool, a driver without ZE_experimental_relaxed_allocation_limits.
        let limits = AllocLimits { max_alloc: 4 << 30, relaxed: false };
        let bytes = 5 * GIB - 100;
        let e = limits.needs_relaxed(bytes, size_class(bytes)).unwrap_err();
        assert!(
            matches!(e, LzError::AllocationTooLarge { bytes: b, class, max_alloc, .. }
                if b == bytes && class == 5 * GIB && max_alloc == 4 << 30),
            "{e:?}"
        );
        let text = e.to_string();
        for part in
            ["5368709020 bytes", "4294967296 bytes, maxMemAllocSize", "ZE_experimental_relaxed_allocation_limits"]
        {
            assert!(text.contains(part), "{part:?} missing from: {text}");
        }
        // Up to the limit the plain call serves.
        assert!(!limits.needs_relaxed(4 * GIB, size_class(4 * GIB)).unwrap());
    }

    #[test]
    fn over_the_limit_with_the_extension_is_relaxed_and_only_there() {
        let limits = AllocLimits { max_alloc: 4 << 30, relaxed: true };
        assert!(limits.needs_relaxed(5 * GIB, size_class(5 * GIB)).unwrap());
        assert!(!limits.needs_relaxed(4 * GIB, size_class(4 * GIB)).unwrap());
        assert!(!limits.needs_relaxed(1000, size_class(1000)).unwrap());
        // A driver that reports no limit (0): every size takes the plain call.
        let unknown = AllocLimits { max_alloc: 0, relaxed: false };
        assert!(!unknown.needs_relaxed(64 * GIB, size_class(64 * GIB)).unwrap());
    }

    #[test]
    fn size_classes_round_up_by_at_most_a_quarter() {
        assert_eq!(size_class(0), 256);
        assert_eq!(size_class(1), 256);
        assert_eq!(size_class(256), 256);
        assert_eq!(size_class(257), 320);
        assert_eq!(size_class(1000), 1024);
        for b in [300usize, 4097, 123_457, 1 << 30, (1 << 30) + 1] {
            let c = size_class(b);
            assert!(c >= b && (c - b) * 4 <= b, "{b} -> {c}");
            assert_eq!(size_class(c), c, "a class is its own class");
        }
    }
}
