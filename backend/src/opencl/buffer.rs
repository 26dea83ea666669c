//! Device buffers of the OpenCL backend: one `cl_mem` each, tagged with what it holds (`kernels::Contents`) so the
//! op layer can check every argument on the host before a kernel touches device memory.

use std::ffi::c_void;

use opencl3::context::Context;
use opencl3::memory::{Buffer, ClMem, CL_MEM_COPY_HOST_PTR, CL_MEM_READ_WRITE};
use opencl3::types::cl_mem;

use super::cl_err;
use crate::error::Result;
pub(crate) use crate::kernels::Contents;

/// An allocation on an OpenCL device. Released when dropped (the in-order queue keeps it alive for commands
/// already enqueued).
#[derive(Debug)]
pub struct ClBuffer {
    mem: Buffer<u8>,
    /// Bytes allocated (what `write_inputs` may write in place).
    bytes: usize,
    pub(super) contents: Contents,
}

impl ClBuffer {
    /// Creates a buffer of `bytes` bytes (at least 4: OpenCL refuses empty buffers), filled from `host` if given.
    pub(super) fn create(ctx: &Context, bytes: usize, host: Option<&[u8]>, contents: Contents) -> Result<Self> {
        let size = bytes.max(4);
        let mut padded;
        let (flags, ptr) = match host {
            Some(data) => {
                let data = if data.len() < size {
                    padded = data.to_vec();
                    padded.resize(size, 0);
                    padded.as_slice()
                } else {
                    data
                };
                (CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, data.as_ptr() as *mut c_void)
            }
            None => (CL_MEM_READ_WRITE, std::ptr::null_mut()),
        };
        // SAFETY: with COPY_HOST_PTR the runtime copies `size` bytes from `ptr` (which holds at least that many)
        // before returning; without it `ptr` is null.
        let mem = unsafe { Buffer::<u8>::create(ctx, flags, size, ptr) }
            .map_err(|e| cl_err(&format!("allocating {bytes} bytes"), e))?;
        Ok(Self { mem, bytes: size, contents })
    }

    pub(super) fn mem(&self) -> cl_mem {
        self.mem.get()
    }

    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    pub(super) fn mem_mut(&mut self) -> &mut Buffer<u8> {
        &mut self.mem
    }

    /// What the buffer holds.
    pub fn contents(&self) -> &Contents {
        &self.contents
    }
}

/// The bytes of a slice of plain numbers.
pub(super) fn as_bytes<T: bytemuck::Pod>(v: &[T]) -> &[u8] {
    bytemuck::cast_slice(v)
}
