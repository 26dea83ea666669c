//! Read-backs queued on the stream (`Backend::read_u32_later`): a device-to-host copy into pinned host memory,
//! followed by an event, so the host waits for the step whose ids it reads and not for the step launched behind it
//! (async scheduling). Pinned buffers are pooled: pinning memory is a slow driver call, a step reads a few bytes.

use std::sync::{Arc, Mutex};

use cudarc::driver::{result, CudaContext, CudaStream, HostSlice, PinnedHostSlice};

use super::buffer::CuBuffer;
use crate::cpu::be;
use crate::error::Result;
use crate::PendingRead;

/// Pinned buffers not in use.
#[derive(Default)]
pub(super) struct PinnedPool(Mutex<Vec<PinnedHostSlice<u32>>>);

impl PinnedPool {
    /// Queues the copy of `buf`'s first `len` values on `stream` into a pinned buffer of the pool (a new one if none
    /// is large enough).
    pub(super) fn read_later(
        self: &Arc<Self>,
        ctx: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
        buf: &CuBuffer,
        len: usize,
    ) -> Result<Box<dyn PendingRead>> {
        if len * 4 > buf.bytes() {
            return Err(be(format!("cuda: a read of {len} values from a buffer of {} bytes", buf.bytes())));
        }
        let found = {
            let mut free = self.0.lock().map_err(|_| be("cuda: the pinned pool's lock is poisoned"))?;
            free.iter().position(|p| p.len() >= len).map(|i| free.swap_remove(i))
        };
        let mut host = match found {
            Some(p) => p,
            // SAFETY: the slice is only read after the event recorded behind the copy into it completes.
            None => unsafe { ctx.alloc_pinned::<u32>(len.max(256)) }.map_err(|e| be(format!("cuda: pinned: {e:?}")))?,
        };
        if len > 0 {
            // SAFETY: `host` holds at least `len` values; the guard records the slice's event on the stream when
            // dropped (behind the copy), and every later access to the slice waits for that event.
            unsafe {
                let (dst, _guard) = host.stream_synced_mut_slice(stream);
                result::memcpy_dtoh_async(&mut dst[..len], buf.ptr(), stream.cu_stream())
                    .map_err(|e| be(format!("cuda: read-back: {e:?}")))?;
            }
        }
        Ok(Box::new(CudaRead { host: Some(host), len, pool: self.clone() }))
    }
}

/// One queued read.
struct CudaRead {
    host: Option<PinnedHostSlice<u32>>,
    len: usize,
    pool: Arc<PinnedPool>,
}

impl PendingRead for CudaRead {
    fn wait(mut self: Box<Self>) -> Result<Vec<u32>> {
        let host = self.host.take().ok_or_else(|| be("cuda: a read-back waited for twice"))?;
        let got = host.as_slice().map_err(|e| be(format!("cuda: read-back: {e:?}")))?[..self.len].to_vec();
        if let Ok(mut free) = self.pool.0.lock() {
            free.push(host);
        }
        Ok(got)
    }
}
