//! MPI through the `mpi` crate: process-wide initialisation, each replica's step and per-stage TP communicators, and the
//! host-memory collectives the model and the step protocol use.
//!
//! MPI is initialised with `MPI_THREAD_MULTIPLE` because rank 0 makes its calls from the engine thread, not the main
//! thread. Only one thread uses the communicators at a time (the engine thread on rank 0, the main thread elsewhere).

use std::sync::Mutex;

use mpi::datatype::PartitionMut;
use mpi::environment::Universe;
use mpi::topology::{Color, SimpleCommunicator};
use mpi::traits::*;

use super::layout::{Layout, World};
use crate::error::{EngineError, Result};
use crate::model::shard::TpCollective;

struct Global {
    universe: Option<Universe>,
    threading: mpi::Threading,
}

// SAFETY: the universe is only initialised and finalised from the main thread; holding it in a static just keeps it
// alive until `finalize`.
unsafe impl Send for Global {}

static GLOBAL: Mutex<Option<Global>> = Mutex::new(None);

/// Initialises MPI once when a launcher started this process with more than one rank. Returns (rank, size), or
/// None when running as a single process.
pub fn init() -> Result<Option<(usize, usize)>> {
    let mut g = GLOBAL.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(Global { universe: Some(u), .. }) = g.as_ref() {
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
    *g = Some(Global { universe: Some(universe), threading: level });
    Ok(Some(out))
}

/// (rank, size) when MPI was initialised in this process (never initialises it).
pub fn current() -> Option<(usize, usize)> {
    let g = GLOBAL.lock().unwrap_or_else(|p| p.into_inner());
    match g.as_ref() {
        Some(Global { universe: Some(u), .. }) => {
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

/// The communicators of one rank of a replica.
pub struct MpiComm {
    /// This rank's place in its replica's `tp x pp` grid.
    pub layout: Layout,
    /// Rank 0 (the driver, comm rank 0) and this replica's ranks: the step broadcast, stage-to-stage hidden states
    /// and the logits to rank 0 go over it. Replica 0's is its own ranks (rank 0 is one of them).
    step: SimpleCommunicator,
    /// Comm rank of the replica's rank k in `step`: k + offset (1 when rank 0 is the driver only).
    offset: usize,
    /// The TP group of this rank's stage in its replica.
    tp: SimpleCommunicator,
}

// SAFETY: MPI is initialised with MPI_THREAD_MULTIPLE (checked to be at least serialized, and multiple under -dp), and
// one `MpiComm` is used by one thread at a time (it moves into the engine thread on rank 0).
unsafe impl Send for MpiComm {}

/// Rank 0's end of a replica whose ranks are all other processes (`-dp` replicas 1..): rank 0 broadcasts its steps
/// and receives its logits, and holds none of its shards.
pub struct DriverComm {
    /// The replica's grid (`rank` is 0: the logits rank and sizes are what is read).
    pub layout: Layout,
    pub replica: usize,
    pub world: World,
    step: SimpleCommunicator,
}

// SAFETY: as for `MpiComm`: one thread (the replica's engine thread on rank 0) uses it at a time.
unsafe impl Send for DriverComm {}

/// The communicators this rank takes, per replica (`split_all`).
enum Prepared {
    Member(MpiComm),
    Driver(DriverComm),
}

static PREPARED: Mutex<Vec<Option<Prepared>>> = Mutex::new(Vec::new());

/// Splits every communicator of a `world` job, once per process; every rank must call it, in the same order of
/// collective calls (here: by replica, by stage, then one split per replica beyond the first). Later calls do nothing.
pub fn split_all(world: World, expert_parallel: bool) -> Result<()> {
    let mut prepared = PREPARED.lock().unwrap_or_else(|p| p.into_inner());
    if !prepared.is_empty() {
        return Ok(());
    }
    let threading = GLOBAL.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|g| g.threading);
    if world.dp > 1 && threading.is_some_and(|t| t < mpi::Threading::Multiple) {
        return Err(EngineError::Backend(format!(
            "--data-parallel-size {} over MPI needs an MPI library with MPI_THREAD_MULTIPLE (rank 0 drives every              replica from its own thread); this one offers {threading:?}",
            world.dp
        )));
    }
    let w = SimpleCommunicator::world();
    let rank = w.rank() as usize;
    let replica = world.replica_of(rank);
    let layout = Layout { tp: world.tp, pp: world.pp, rank: world.rank_in_replica(rank), expert_parallel };
    let split_failed = |what: &str| EngineError::Backend(format!("MPI could not split the {what} communicator"));
    let group = w.split_by_color(Color::with_value(replica as i32)).ok_or_else(|| split_failed("replica"))?;
    let tp = w
        .split_by_color(Color::with_value((replica * world.pp + layout.stage()) as i32))
        .ok_or_else(|| split_failed("TP group"))?;
    let mut out: Vec<Option<Prepared>> = (0..world.dp).map(|_| None).collect();
    let mut member = Some((group, tp));
    if replica == 0 {
        if let Some((group, tp)) = member.take() {
            out[0] = Some(Prepared::Member(MpiComm { layout, step: group, offset: 0, tp }));
        }
    }
    for (r, slot) in out.iter_mut().enumerate().skip(1) {
        // Rank 0 and replica r's ranks; ordered by world rank, so rank 0 is comm rank 0.
        let inside = rank == 0 || replica == r;
        let color = if inside { Color::with_value(0) } else { Color::undefined() };
        let comm = w.split_by_color(color);
        if !inside {
            continue;
        }
        let step = comm.ok_or_else(|| split_failed("driver"))?;
        if rank == 0 {
            let grid = Layout { rank: 0, ..layout };
            *slot = Some(Prepared::Driver(DriverComm { layout: grid, replica: r, world, step }));
        } else if let Some((_, tp)) = member.take() {
            *slot = Some(Prepared::Member(MpiComm { layout, step, offset: 1, tp }));
        }
    }
    *prepared = out;
    Ok(())
}

/// This rank's communicators in replica `r` (once).
pub fn take_member(r: usize) -> Result<MpiComm> {
    match PREPARED.lock().unwrap_or_else(|p| p.into_inner()).get_mut(r).and_then(Option::take) {
        Some(Prepared::Member(c)) => Ok(c),
        _ => Err(EngineError::Backend(format!("this MPI rank has no communicator of replica {r}"))),
    }
}

/// Rank 0's driver end of replica `r` (once).
pub fn take_driver(r: usize) -> Result<DriverComm> {
    match PREPARED.lock().unwrap_or_else(|p| p.into_inner()).get_mut(r).and_then(Option::take) {
        Some(Prepared::Driver(c)) => Ok(c),
        _ => Err(EngineError::Backend(format!("this MPI rank does not drive replica {r}"))),
    }
}

impl MpiComm {
    /// The driver (rank 0) sends `data` to every rank of the replica; the others receive it.
    pub fn broadcast(&self, data: &mut Vec<u32>) {
        broadcast_from_root(&self.step, data);
    }

    /// Sends to the replica's rank `to`.
    pub fn send(&self, to: usize, data: &[f32]) {
        self.step.process_at_rank((to + self.offset) as i32).send(data);
    }

    /// Receives from the replica's rank `from`.
    pub fn recv(&self, from: usize) -> Vec<f32> {
        self.step.process_at_rank((from + self.offset) as i32).receive_vec::<f32>().0
    }

    /// Sends the logits to rank 0, which samples.
    pub fn send_to_driver(&self, data: &[f32]) {
        self.step.process_at_rank(0).send(data);
    }
}

impl DriverComm {
    pub fn broadcast(&self, data: &mut Vec<u32>) {
        broadcast_from_root(&self.step, data);
    }

    /// The logits of a step, from the replica's logits rank.
    pub fn recv_logits(&self) -> Vec<f32> {
        self.step.process_at_rank((self.layout.logits_rank() + 1) as i32).receive_vec::<f32>().0
    }
}

/// Comm rank 0 sends `data` (length first) to every rank of `comm`.
fn broadcast_from_root(comm: &SimpleCommunicator, data: &mut Vec<u32>) {
    let root = comm.process_at_rank(0);
    let mut len = data.len() as u64;
    root.broadcast_into(&mut len);
    data.resize(len as usize, 0);
    if len > 0 {
        root.broadcast_into(&mut data[..]);
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
