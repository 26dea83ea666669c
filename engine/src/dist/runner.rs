//! The distributed step: each rank's shard (`RankStep`); rank 0 drives its replica through `leader::MpiRunner`, and
//! `run_worker` is the loop of every other rank. Each step rank 0 broadcasts the batch (an empty message means stop), every rank runs its shard on
//! its own device (any backend), hidden states flow stage to stage, and the last stage's TP rank 0 returns the logits
//! to rank 0. Collectives run on host memory: activations are downloaded, reduced over MPI and uploaded again.

use super::mpi_comm::MpiComm;
use super::wire;
use crate::backend::Backend;
use crate::config::ModelParams;
use crate::error::Result;
use crate::model::{KvLayout, LlamaModel, PagedKvCache, ScheduledSeq, StageOutput};
use crate::weights::Weights;

/// One rank's part of a step, whatever its device.
pub trait RankStep: Send {
    /// This rank's part of a step; Some(logits) on the rank that must deliver them to rank 0: each sequence's last
    /// row's, then `prompt_rows`'.
    fn step(&self, batch: &[ScheduledSeq], prompt_rows: &[u32]) -> Result<Option<Vec<f32>>>;
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
    fn step(&self, batch: &[ScheduledSeq], prompt_rows: &[u32]) -> Result<Option<Vec<f32>>> {
        let l = self.comm.layout;
        let input = if l.stage() > 0 { Some(self.comm.recv(l.rank_of(l.stage() - 1, l.tp_rank()))) } else { None };
        let (b, cache, comm) = (&self.backend, &self.cache, &self.comm);
        match self.model.forward_stage(b, batch, prompt_rows, cache, comm, input.as_deref())? {
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
        let (batch, prompt_rows) = wire::decode(&msg)?;
        if let Some(logits) = rank.step(&batch, &prompt_rows)? {
            rank.comm().send_to_driver(&logits);
        }
    }
}
