//! Device memory of the CUDA backend: `CuBuffer` (a raw allocation plus what it holds) and a size-keyed pool, so the
//! model's per-step activations reuse allocations instead of calling `cuMemAlloc`/`cuMemFree` (which synchronises
//! the device) on every op. Buffers return to the pool in `Drop`; the pool frees everything when the backend goes.
//!
//! Two free lists: memory taken while a CUDA graph is being captured belongs to the graphs (their activations) and
//! only ever goes back to the graph list, so nothing outside a graph — a step's inputs, an attention plan a graph
//! keeps, an eager step's buffers — can be handed memory that a later graph replay overwrites. Graphs share their
//! list: they replay one at a time on one stream, and their activations are dead between replays.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{result, sys};

use crate::cpu::be;
use crate::error::Result;
pub use crate::kernels::Contents;

/// Freed allocations by exact byte size, ready for reuse.
#[derive(Default)]
pub(super) struct Pool {
    free: Mutex<HashMap<usize, Vec<sys::CUdeviceptr>>>,
    graph_free: Mutex<HashMap<usize, Vec<sys::CUdeviceptr>>>,
    capturing: std::sync::atomic::AtomicBool,
}

impl Pool {
    /// Whether allocations now belong to the graphs (set between `begin_capture` and `end_capture`).
    pub(super) fn set_capturing(&self, on: bool) {
        self.capturing.store(on, std::sync::atomic::Ordering::SeqCst);
    }

    fn capturing(&self) -> bool {
        self.capturing.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn list(&self, graph: bool) -> &Mutex<HashMap<usize, Vec<sys::CUdeviceptr>>> {
        if graph {
            &self.graph_free
        } else {
            &self.free
        }
    }

    pub(super) fn take(&self, bytes: usize, graph: bool) -> Result<sys::CUdeviceptr> {
        let bytes = bytes.max(4);
        if let Some(p) = self.list(graph).lock().ok().and_then(|mut f| f.get_mut(&bytes).and_then(Vec::pop)) {
            return Ok(p);
        }
        // SAFETY: a plain allocation; the context is current (the backend binds it before every call).
        unsafe { result::malloc_sync(bytes) }.map_err(|e| be(format!("cuda: allocating {bytes} bytes: {e:?}")))
    }

    fn give(&self, bytes: usize, ptr: sys::CUdeviceptr, graph: bool) {
        if let Ok(mut f) = self.list(graph).lock() {
            f.entry(bytes.max(4)).or_default().push(ptr);
        }
    }

    /// Frees every pooled allocation (at shutdown, after the last op).
    pub(super) fn release_all(&self) {
        for list in [&self.free, &self.graph_free] {
            if let Ok(mut f) = list.lock() {
                for (_, ptrs) in f.drain() {
                    for p in ptrs {
                        // SAFETY: pooled pointers are owned by the pool and no longer referenced by any buffer.
                        unsafe { result::free_sync(p).ok() };
                    }
                }
            }
        }
    }
}

/// One device allocation of the CUDA backend.
pub struct CuBuffer {
    ptr: sys::CUdeviceptr,
    bytes: usize,
    pub(super) contents: Contents,
    pool: Arc<Pool>,
    /// Taken while a graph was being captured (goes back to the graphs' free list).
    graph: bool,
    /// False for a view into another buffer (`view`): dropping it frees nothing.
    owned: bool,
}

// SAFETY: a device pointer is plain data; the backend serialises all use on one stream.
unsafe impl Send for CuBuffer {}

impl CuBuffer {
    pub(super) fn new(pool: &Arc<Pool>, bytes: usize, contents: Contents) -> Result<Self> {
        let graph = pool.capturing();
        Ok(Self { ptr: pool.take(bytes, graph)?, bytes, contents, pool: pool.clone(), graph, owned: true })
    }

    /// `bytes` bytes of `parent` from byte `offset` as a buffer of its own (one of several inputs packed into one
    /// allocation, so one host copy fills them all). It frees nothing: `parent` must outlive it.
    pub(super) fn view(parent: &CuBuffer, offset: usize, bytes: usize, contents: Contents) -> Result<Self> {
        if offset.checked_add(bytes).is_none_or(|end| end > parent.bytes) {
            return Err(be(format!(
                "cuda: a view of {bytes} bytes at {offset} is outside a buffer of {}",
                parent.bytes
            )));
        }
        let ptr = parent.ptr + offset as sys::CUdeviceptr;
        Ok(Self { ptr, bytes, contents, pool: parent.pool.clone(), graph: parent.graph, owned: false })
    }

    pub fn ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// What the buffer holds.
    pub fn contents(&self) -> &Contents {
        &self.contents
    }

    /// Describes a u32 buffer's new values (after its device memory was written).
    pub(super) fn set_u32(&mut self, data: &[u32]) -> Result<()> {
        match &mut self.contents {
            Contents::U32 { .. } if data.len() * 4 <= self.bytes => {
                self.contents = Contents::u32_of(data);
                Ok(())
            }
            Contents::U32 { .. } => {
                Err(be(format!("u32 write: {} indices do not fit a buffer of {} bytes", data.len(), self.bytes)))
            }
            _ => Err(be("u32 write: expected a u32 buffer")),
        }
    }
}

impl Drop for CuBuffer {
    fn drop(&mut self) {
        if self.owned {
            self.pool.give(self.bytes, self.ptr, self.graph);
        }
    }
}
