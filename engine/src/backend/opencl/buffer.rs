//! Device buffers of the OpenCL backend: one `cl_mem` each, tagged with what it holds so every op can check its
//! arguments on the host before a kernel touches device memory.
//!
//! u32 buffers (token ids, positions, slot mappings, block tables) keep a host copy: they are small, written once,
//! and the ops validate indices against it (an out-of-range slot must be an error, not a write past the cache).

use std::ffi::c_void;

use opencl3::context::Context;
use opencl3::memory::{Buffer, ClMem, CL_MEM_COPY_HOST_PTR, CL_MEM_READ_WRITE};
use opencl3::types::cl_mem;

use super::cl_err;
use crate::backend::cpu::be;
use crate::backend::WeightDType;
use crate::error::Result;

/// What a buffer holds.
#[derive(Debug)]
pub(super) enum Contents {
    /// `len` f32 values (activations, KV cache, 1-D weights, tables).
    F32 { len: usize },
    /// u32 values, with their host copy.
    U32 { host: Vec<u32> },
    /// A row-major 2-D weight `[rows, cols]` in its dtype.
    Matrix { dtype: WeightDType, rows: usize, cols: usize },
}

/// An allocation on an OpenCL device. Released when dropped (the in-order queue keeps it alive for commands
/// already enqueued).
#[derive(Debug)]
pub struct ClBuffer {
    mem: Buffer<u8>,
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
        Ok(Self { mem, contents })
    }

    pub(super) fn mem(&self) -> cl_mem {
        self.mem.get()
    }

    pub(super) fn mem_mut(&mut self) -> &mut Buffer<u8> {
        &mut self.mem
    }

    /// Checks that this is an f32 buffer of at least `need` values.
    pub(super) fn f32(&self, what: &str, need: usize) -> Result<()> {
        match self.contents {
            Contents::F32 { len } if len >= need => Ok(()),
            Contents::F32 { len } => Err(be(format!("{what}: buffer holds {len} values, op needs {need}"))),
            _ => Err(be(format!("{what}: expected an f32 buffer"))),
        }
    }

    /// The host copy of a u32 buffer, checked to hold at least `need` values.
    pub(super) fn u32(&self, what: &str, need: usize) -> Result<&[u32]> {
        match &self.contents {
            Contents::U32 { host } if host.len() >= need => Ok(host),
            Contents::U32 { host } => Err(be(format!("{what}: buffer holds {} values, op needs {need}", host.len()))),
            _ => Err(be(format!("{what}: expected a u32 buffer"))),
        }
    }

    /// The dtype and shape of a 2-D weight.
    pub(super) fn matrix(&self, what: &str) -> Result<(WeightDType, usize, usize)> {
        match self.contents {
            Contents::Matrix { dtype, rows, cols } => Ok((dtype, rows, cols)),
            _ => Err(be(format!("{what}: expected a weight matrix"))),
        }
    }

    /// Number of f32 values in an f32 buffer.
    pub(super) fn f32_len(&self) -> Option<usize> {
        match self.contents {
            Contents::F32 { len } => Some(len),
            _ => None,
        }
    }
}

/// Plain numbers without padding bytes, whose memory can be viewed as bytes.
pub(super) trait Plain: Copy {}
impl Plain for f32 {}
impl Plain for u32 {}
impl Plain for u16 {}

/// The bytes of a slice of plain numbers.
pub(super) fn as_bytes<T: Plain>(v: &[T]) -> &[u8] {
    // SAFETY: u8 has alignment 1 and every byte of a `Plain` value is initialised.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}
