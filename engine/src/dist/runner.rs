//! The distributed step: `DistRunner` is the `StepRunner` of rank 0's engine thread; `run_worker` is the loop of
//! every other rank. Each step rank 0 broadcasts the batch (an empty message means stop), every rank runs its shard on
//! its own device (any backend), hidden states flow stage to stage, and the last stage's TP rank 0 returns the logits
//! to rank 0. Collectives run on host memory: activations are downloaded, reduced over MPI and uploaded again.

use super::mpi_comm::{DriverComm, MpiComm};
use super::wire;
use crate::backend::Backend;
use crate::config::ModelParams;
use crate::error::{EngineError, Result};
use crate::model::{KvLayout, LlamaModel, PagedKvCache, ScheduledSeq, StageOutput};
use crate::runner::StepRunner;
use crate::weights::Weights;

/// One rank's part of a step, whatever its device.
pub trait RankStep: Send {
    /// This rank's part of a step; Some(logits) on the rank that must deliver them to rank 0.
    fn step(&self, batch: &[ScheduledSeq]) -> Result<Option<Vec<f32>>>;
    fn comm(&self) -> &MpiComm;
    fn device_name(&self) -> String;
}

/// One rank's shard of the model with its KV cache on backend `B`.
pub struct RankModel<B: Backend> {
    // Field order is drop order: the model and cache before their backend.
    model: LlamaModel<B>,
    cache: PagedKvCache<B>,
    backend: B,
    comm: MpiComm,
}

impl<B: Backend> RankModel<B> {
    pub fn new(
        backend: B,
        p: &ModelParams,
        w: &Weights,
        comm: MpiComm,
        num_blocks: usize,
        block_size: usize,
    ) -> Result<Self> {
        let l = comm.layout;
        let shard = l.shard(p)?;
        let model = LlamaModel::load_shard(&backend, p, w, &shard)?;
        // The layout is the whole model's (the scheduler's groups); this stage allocates the tensors its layers use.
        let (layout, dtype) = (KvLayout::of(p), w.compute_dtype());
        let kv = shard.kv_params(p);
        let cache = PagedKvCache::new(&backend, &kv, &layout, shard.layers.clone(), num_blocks, block_size, dtype)?;
        Ok(Self { model, cache, backend, comm })
    }
}

impl<B: Backend + Send> RankStep for RankModel<B>
where
    LlamaModel<B>: Send,
    PagedKvCache<B>: Send,
{
    fn step(&self, batch: &[ScheduledSeq]) -> Result<Option<Vec<f32>>> {
        let l = self.comm.layout;
        let input = if l.stage() > 0 { Some(self.comm.recv(l.rank_of(l.stage() - 1, l.tp_rank()))) } else { None };
        match self.model.forward_stage(&self.backend, batch, &self.cache, &self.comm, input.as_deref())? {
            StageOutput::Hidden(h) => {
                self.comm.send(l.rank_of(l.stage() + 1, l.tp_rank()), &h);
                Ok(None)
            }
            StageOutput::Logits(logits) => Ok((l.rank == l.logits_rank()).then_some(logits)),
        }
    }

    fn comm(&self) -> &MpiComm {
        &self.comm
    }

    fn device_name(&self) -> String {
        self.backend.device_name()
    }
}

/// Agrees on the KV block count: rank 0's value wins.
pub fn agree_blocks(comm: &MpiComm, num_blocks: usize) -> usize {
    let mut v = vec![num_blocks as u32];
    comm.broadcast(&mut v);
    v.first().copied().unwrap_or(0) as usize
}

/// Rank 0's runner.
pub struct DistRunner {
    rank: Box<dyn RankStep>,
    vocab: usize,
}

impl DistRunner {
    pub fn new(rank: Box<dyn RankStep>, vocab: usize) -> Self {
        Self { rank, vocab }
    }
}

impl StepRunner for DistRunner {
    fn execute(&mut self, batch: &[ScheduledSeq]) -> Result<Vec<f32>> {
        let mut msg = wire::encode(batch);
        self.rank.comm().broadcast(&mut msg);
        let l = self.rank.comm().layout;
        match self.rank.step(batch)? {
            Some(logits) => Ok(logits),
            None => {
                let logits = self.rank.comm().recv(l.logits_rank());
                if logits.len() != batch.len() * self.vocab {
                    return Err(EngineError::Backend(format!("rank {} returned malformed logits", l.logits_rank())));
                }
                Ok(logits)
            }
        }
    }

    fn vocab_size(&self) -> usize {
        self.vocab
    }

    fn device_name(&self) -> String {
        let l = self.rank.comm().layout;
        let ep = if l.expert_parallel { ", expert parallel" } else { "" };
        let ranks = match crate::dist::mpi_comm::current() {
            Some((_, size)) if size > l.world() => format!("ranks 0-{} of {size} MPI ranks, replica 0", l.world() - 1),
            _ => format!("{} MPI ranks", l.world()),
        };
        format!("{} on rank 0 of {ranks} (tp={}, pp={}{ep})", self.rank.device_name(), l.tp, l.pp)
    }
}

impl Drop for DistRunner {
    fn drop(&mut self) {
        // Tell the workers to stop.
        self.rank.comm().broadcast(&mut Vec::new());
    }
}

/// Rank 0's runner of a replica whose ranks are all other processes (`-dp` replicas 1..): each step goes to the
/// replica's ranks and the logits come back; rank 0 computes nothing of it.
pub struct RemoteRunner {
    comm: DriverComm,
    vocab: usize,
}

impl RemoteRunner {
    pub fn new(comm: DriverComm, vocab: usize) -> Self {
        Self { comm, vocab }
    }

    /// Tells the replica's ranks the KV block count (rank 0's value, as for replica 0).
    pub fn agree_blocks(comm: &DriverComm, num_blocks: usize) {
        comm.broadcast(&mut vec![num_blocks as u32]);
    }
}

impl StepRunner for RemoteRunner {
    fn execute(&mut self, batch: &[ScheduledSeq]) -> Result<Vec<f32>> {
        let mut msg = wire::encode(batch);
        self.comm.broadcast(&mut msg);
        let logits = self.comm.recv_logits();
        if logits.len() != batch.len() * self.vocab {
            let rank = self.comm.world.ranks_of(self.comm.replica).start + self.comm.layout.logits_rank();
            return Err(EngineError::Backend(format!("rank {rank} returned malformed logits")));
        }
        Ok(logits)
    }

    fn vocab_size(&self) -> usize {
        self.vocab
    }

    fn device_name(&self) -> String {
        let (l, r) = (self.comm.layout, self.comm.replica);
        let ranks = self.comm.world.ranks_of(r);
        let ep = if l.expert_parallel { ", expert parallel" } else { "" };
        format!(
            "MPI ranks {}-{} of {}, replica {r}, driven by rank 0 (tp={}, pp={}{ep})",
            ranks.start,
            ranks.end - 1,
            self.comm.world.size(),
            l.tp,
            l.pp
        )
    }
}

impl Drop for RemoteRunner {
    fn drop(&mut self) {
        // Tell the replica's ranks to stop.
        self.comm.broadcast(&mut Vec::new());
    }
}

/// The loop of ranks other than 0: build the shard on `device` (rank 0 says how many KV blocks), then run steps
/// until rank 0 says stop. `replica`: the data-parallel replica this rank belongs to (0 without `-dp`).
pub fn run_worker(
    device: crate::engine::Device,
    p: &ModelParams,
    w: &Weights,
    replica: usize,
    block_size: usize,
) -> Result<()> {
    // The launcher forwards SIGINT/SIGTERM to every rank; only rank 0 acts on them (it drains, then tells the
    // workers to stop), so workers ignore them instead of dying under it.
    // SAFETY: installing SIG_IGN for two signals has no preconditions.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGTERM, libc::SIG_IGN);
    }
    let comm = super::mpi_comm::take_member(replica)?;
    let num_blocks = agree_blocks(&comm, 0);
    let rank = device.build_rank(p, w, comm, num_blocks, block_size)?;
    loop {
        let mut msg = Vec::new();
        rank.comm().broadcast(&mut msg);
        if msg.is_empty() {
            return Ok(());
        }
        let batch = wire::decode(&msg)?;
        if let Some(logits) = rank.step(&batch)? {
            rank.comm().send_to_driver(&logits);
        }
    }
}
