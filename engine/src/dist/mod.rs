//! Tensor and pipeline parallelism across processes on MPI: the layout of ranks, the wire format of a step, the
//! runner rank 0's engine thread drives, and the worker loop every other rank runs.
//!
//! Rank 0 runs the HTTP server, tokenizer and scheduler. Each step it broadcasts the batch to every rank; every
//! rank runs its shard (`model::shard`); the last pipeline stage returns the logits to rank 0. Collectives run on
//! host memory (see `model::shard::TpCollective` for the device-aware seam). Without the `mpi` cargo feature only the
//! checks and the error messages exist.
//!
//! Under `-dp N` the world is N replicas of `tp x pp` ranks (`layout::World`). Rank 0 runs every replica's
//! scheduler: replica 0's steps as above (rank 0 is its first rank), every other replica's through a communicator of
//! rank 0 and that replica's ranks (`mpi_comm::DriverComm`, `leader::MpiRunner`), so its ranks run the same worker
//! loop and rank 0 computes none of its shards.

pub mod layout;
#[cfg(feature = "mpi")]
pub mod leader;
#[cfg(feature = "mpi")]
pub mod mpi_comm;
#[cfg(feature = "mpi")]
pub mod replica;
#[cfg(feature = "mpi")]
pub mod runner;
pub mod wire;

pub use layout::{launcher_world_size, Layout, World};
