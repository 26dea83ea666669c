//! One process's share of the model (`Shard`, from `rserve_model_io::shard`, re-exported) and the collectives a
//! sharded forward needs.
//!
//! Boundary: `TpCollective` works on host memory today. Device-aware MPI (Aurora's MPICH takes Level Zero device
//! pointers) would plug in as a second method family taking backend buffers; the model calls only this trait.

pub use rserve_model_io::shard::*;

use crate::error::Result;

/// Sums and gathers across the tensor-parallel ranks of one pipeline stage.
pub trait TpCollective {
    /// Number of TP ranks (1: no communication).
    fn tp_size(&self) -> usize;
    /// Element-wise sum of `data` over the TP ranks, result on every rank.
    fn all_reduce_sum(&self, data: &mut [f32]) -> Result<()>;
    /// Concatenation of every rank's `local` in rank order (lengths may differ), result on every rank.
    fn all_gather(&self, local: &[f32]) -> Result<Vec<f32>>;
}

/// The single-process collective.
pub struct NoComm;

impl TpCollective for NoComm {
    fn tp_size(&self) -> usize {
        1
    }
    fn all_reduce_sum(&self, _: &mut [f32]) -> Result<()> {
        Ok(())
    }
    fn all_gather(&self, local: &[f32]) -> Result<Vec<f32>> {
        Ok(local.to_vec())
    }
}
