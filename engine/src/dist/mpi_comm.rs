//! MPI through the `mpi` crate: process-wide initialisation, the world and per-stage TP communicators, and the
//! host-memory collectives the model and the step protocol use.
//!
//! MPI is initialised with `MPI_THREAD_MULTIPLE` because rank 0 makes its calls from the engine thread, not the main
//! thread. Only one thread uses the communicators at a time (the engine thread on rank 0, the main thread elsewhere).

use std::sync::Mutex;

use mpi::datatype::PartitionMut;
use mpi::environment::Universe;
use mpi::topology::{Color, SimpleCommunicator};
use mpi::traits::*;

use super::layout::Layout;
use crate::error::{EngineError, Result};
use crate::model::shard::TpCollective;

struct Global {
    universe: Option<Universe>,
}

// SAFETY: the universe is only initialised and finalised from the main thread; holding it in a static just keeps it
// alive until `finalize`.
unsafe impl Send for Global {}

static GLOBAL: Mutex<Option<Global>> = Mutex::new(None);

/// Initialises MPI once when a launcher started this process with more than one rank. Returns (rank, size), or
/// None when running as a single process.
pub fn init() -> Result<Option<(usize, usize)>> {
    let mut g = GLOBAL.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(Global { universe: Some(u) }) = g.as_ref() {
        let w = u.world();
        return Ok(Some((w.rank() as usize, w.size() as usize)));
    }
    let (universe, level) = mpi::initialize_with_threading(mpi::Threading::Multiple)
        .ok_or_else(|| EngineError::Backend("MPI was already initialised".into()))?;
    if level < mpi::Threading::Serialized {
        return Err(EngineError::Backend(format!(
            "the MPI library offers only {level:?} threading; rserve needs serialized"
        )));
    }
    let w = universe.world();
    let out = (w.rank() as usize, w.size() as usize);
    *g = Some(Global { universe: Some(universe) });
    Ok(Some(out))
}

/// (rank, size) when MPI was initialised in this process (never initialises it).
pub fn current() -> Option<(usize, usize)> {
    let g = GLOBAL.lock().unwrap_or_else(|p| p.into_inner());
    match g.as_ref() {
        Some(Global { universe: Some(u) }) => {
            let w = u.world();
            Some((w.rank() as usize, w.size() as usize))
        }
        _ => None,
    }
}

/// Finalises MPI (call once at the end of main on every rank).
pub fn finalize() {
    let mut g = GLOBAL.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(global) = g.as_mut() {
        global.universe.take();
    }
}

/// Ends every rank of the job with an error (used when a rank cannot continue).
pub fn abort(message: &str) -> ! {
    eprintln!("{message}");
    SimpleCommunicator::world().abort(1)
}

/// The communicators of one rank.
pub struct MpiComm {
    pub layout: Layout,
    world: SimpleCommunicator,
    tp: SimpleCommunicator,
}

// SAFETY: MPI is initialised with MPI_THREAD_MULTIPLE (checked to be at least serialized), and one `MpiComm` is used
// by one thread at a time (it moves into the engine thread on rank 0).
unsafe impl Send for MpiComm {}

impl MpiComm {
    pub fn new(tp: usize, pp: usize, expert_parallel: bool) -> Result<Self> {
        let world = SimpleCommunicator::world();
        let layout = Layout { tp, pp, rank: world.rank() as usize, expert_parallel };
        let tp_comm = world
            .split_by_color(Color::with_value(layout.stage() as i32))
            .ok_or_else(|| EngineError::Backend("MPI could not split the TP group".into()))?;
        Ok(Self { layout, world, tp: tp_comm })
    }

    /// Rank 0 sends `data` to every rank; others receive it.
    pub fn broadcast(&self, data: &mut Vec<u32>) {
        let root = self.world.process_at_rank(0);
        let mut len = data.len() as u64;
        root.broadcast_into(&mut len);
        data.resize(len as usize, 0);
        if len > 0 {
            root.broadcast_into(&mut data[..]);
        }
    }

    pub fn send(&self, to: usize, data: &[f32]) {
        self.world.process_at_rank(to as i32).send(data);
    }

    pub fn recv(&self, from: usize) -> Vec<f32> {
        self.world.process_at_rank(from as i32).receive_vec::<f32>().0
    }
}

impl TpCollective for MpiComm {
    fn tp_size(&self) -> usize {
        self.layout.tp
    }

    fn all_reduce_sum(&self, data: &mut [f32]) -> Result<()> {
        let send = data.to_vec();
        self.tp.all_reduce_into(&send[..], data, mpi::collective::SystemOperation::sum());
        Ok(())
    }

    fn all_gather(&self, local: &[f32]) -> Result<Vec<f32>> {
        let n = self.layout.tp;
        let mut counts = vec![0i32; n];
        self.tp.all_gather_into(&(local.len() as i32), &mut counts[..]);
        let displs: Vec<i32> = counts
            .iter()
            .scan(0, |acc, &c| {
                let d = *acc;
                *acc += c;
                Some(d)
            })
            .collect();
        let mut out = vec![0f32; counts.iter().map(|&c| c as usize).sum()];
        let mut part = PartitionMut::new(&mut out[..], counts, displs);
        self.tp.all_gather_varcount_into(local, &mut part);
        Ok(out)
    }
}
