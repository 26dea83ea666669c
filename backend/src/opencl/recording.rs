//! Recorded steps on OpenCL: the recording in progress (a command-buffer and the buffers allocated while it records)
//! and `OpenClRecording`, what `end_recording` hands the engine.
//!
//! A buffer allocated while recording is retained by the recording (`RetainedMem`), so its memory lives as long as
//! the command-buffer that writes it, whoever dropped the `ClBuffer`; the runtime never hands that memory to another
//! buffer meanwhile, so a replay overwrites nothing outside the recording.

use opencl3::error_codes::ClError;
use opencl3::memory::{release_mem_object, retain_mem_object};
use opencl3::types::cl_mem;

use super::buffer::ClBuffer;
use super::cl_err;
use super::command_buffer::CommandBuffer;
use crate::error::Result;
use crate::kernels::AttnPlan;

/// One reference to a buffer's memory, released when dropped.
pub(super) struct RetainedMem(cl_mem);

// SAFETY: a memory object may be retained and released from any thread.
unsafe impl Send for RetainedMem {}

impl RetainedMem {
    pub(super) fn of(b: &ClBuffer) -> Result<Self> {
        // SAFETY: a valid memory object (the buffer is alive); this value releases the reference it adds.
        unsafe { retain_mem_object(b.mem()) }.map_err(|e| cl_err("retaining a recorded buffer", ClError(e)))?;
        Ok(Self(b.mem()))
    }
}

impl Drop for RetainedMem {
    fn drop(&mut self) {
        // SAFETY: the reference `of` added; the runtime deletes the memory once no queued command uses it.
        if let Err(e) = unsafe { release_mem_object(self.0) } {
            tracing::warn!("opencl: releasing a recorded buffer failed: {}", ClError(e));
        }
    }
}

/// A recording in progress.
pub(super) struct InProgress {
    pub(super) commands: CommandBuffer,
    pub(super) buffers: Vec<RetainedMem>,
}

/// A decode step recorded on OpenCL: its command-buffer, the buffers allocated while recording and the attention
/// work split it reads.
pub struct OpenClRecording {
    // Field order is drop order: the command-buffer before the memory it uses.
    pub(super) commands: CommandBuffer,
    pub(super) _buffers: Vec<RetainedMem>,
    pub(super) _plan: Option<AttnPlan<ClBuffer>>,
}

impl OpenClRecording {
    /// Commands the step recorded (launches and fills).
    pub fn commands(&self) -> u64 {
        self.commands.commands()
    }
}
