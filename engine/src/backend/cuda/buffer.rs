//! Device memory of the CUDA backend: `CuBuffer` (a raw allocation plus what it holds) and a size-keyed pool, so the
//! model's per-step activations reuse allocations instead of calling `cuMemAlloc`/`cuMemFree` (which synchronises
//! the device) on every op. Buffers return to the pool in `Drop`; the pool frees everything when the backend goes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{result, sys};

use crate::backend::cpu::be;
use crate::backend::WeightDType;
use crate::error::Result;

/// Freed allocations by exact byte size, ready for reuse.
#[derive(Default)]
pub(super) struct Pool {
    free: Mutex<HashMap<usize, Vec<sys::CUdeviceptr>>>,
}

impl Pool {
    pub(super) fn take(&self, bytes: usize) -> Result<sys::CUdeviceptr> {
        let bytes = bytes.max(4);
        if let Some(p) = self.free.lock().ok().and_then(|mut f| f.get_mut(&bytes).and_then(Vec::pop)) {
            return Ok(p);
        }
        // SAFETY: a plain allocation; the context is current (the backend binds it before every call).
        unsafe { result::malloc_sync(bytes) }.map_err(|e| be(format!("cuda: allocating {bytes} bytes: {e:?}")))
    }

    fn give(&self, bytes: usize, ptr: sys::CUdeviceptr) {
        if let Ok(mut f) = self.free.lock() {
            f.entry(bytes.max(4)).or_default().push(ptr);
        }
    }

    /// Frees every pooled allocation (at shutdown, after the last op).
    pub(super) fn release_all(&self) {
        if let Ok(mut f) = self.free.lock() {
            for (_, ptrs) in f.drain() {
                for p in ptrs {
                    // SAFETY: pooled pointers are owned by the pool and no longer referenced by any buffer.
                    unsafe { result::free_sync(p).ok() };
                }
            }
        }
    }
}

/// What a buffer holds (for the host-side checks before each launch).
#[derive(Debug, Clone)]
pub enum Contents {
    F32 { len: usize },
    /// Indices, with the host copy every index check reads.
    U32 { host: Vec<u32> },
    Matrix { dtype: WeightDType, rows: usize, cols: usize },
    /// Scratch (converted activations, split-KV partials).
    Raw,
}

/// One device allocation of the CUDA backend.
pub struct CuBuffer {
    ptr: sys::CUdeviceptr,
    bytes: usize,
    pub(super) contents: Contents,
    pool: Arc<Pool>,
}

// SAFETY: a device pointer is plain data; the backend serialises all use on one stream.
unsafe impl Send for CuBuffer {}

impl CuBuffer {
    pub(super) fn new(pool: &Arc<Pool>, bytes: usize, contents: Contents) -> Result<Self> {
        Ok(Self { ptr: pool.take(bytes)?, bytes, contents, pool: pool.clone() })
    }

    pub fn ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn f32_len(&self) -> Option<usize> {
        match self.contents {
            Contents::F32 { len } => Some(len),
            _ => None,
        }
    }

    /// Checks an f32 buffer holds at least `need` values.
    pub(super) fn f32(&self, what: &str, need: usize) -> Result<()> {
        match self.f32_len() {
            Some(len) if len >= need => Ok(()),
            Some(len) => Err(be(format!("{what}: buffer of {len} values, op needs {need}"))),
            None => Err(be(format!("{what}: expected an f32 buffer"))),
        }
    }

    /// The host copy of a u32 buffer of at least `need` values.
    pub(super) fn u32(&self, what: &str, need: usize) -> Result<&[u32]> {
        match &self.contents {
            Contents::U32 { host } if host.len() >= need => Ok(host),
            Contents::U32 { host } => Err(be(format!("{what}: buffer of {} indices, op needs {need}", host.len()))),
            _ => Err(be(format!("{what}: expected a u32 buffer"))),
        }
    }

    pub(super) fn matrix(&self, what: &str) -> Result<(WeightDType, usize, usize)> {
        match self.contents {
            Contents::Matrix { dtype, rows, cols } => Ok((dtype, rows, cols)),
            _ => Err(be(format!("{what}: expected a weight matrix"))),
        }
    }
}

impl Drop for CuBuffer {
    fn drop(&mut self) {
        self.pool.give(self.bytes, self.ptr);
    }
}
