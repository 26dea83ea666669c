//! The distributed step: `MpiRunner` is the `StepRunner` of rank 0's engine thread; `run_worker` is the loop of
//! every other rank. Each step rank 0 broadcasts the batch (an empty message means stop), every rank runs its shard on
//! its own device (any backend), hidden states flow stage to stage, and the last stage's TP rank 0 returns the logits
//! to rank 0. Collectives run on host memory: activations are downloaded, reduced over MPI and uploaded again.

use super::mpi_comm::{DriverComm, MpiComm};
use super::wire;
use crate::backend::Backend;
use crate::config::ModelParams;
use crate::error::{EngineError, Result};
use crate::model::{KvLayout, LlamaModel, PagedKvCache, ScheduledSeq, StageOutput};
use crate::runner::{StepMasks, StepRunner};
use crate::sampling::{prompt, SampledRows, StepSampling};
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

/// Where rank 0's runner sends a step: its own shard among the replica's ranks, or a replica whose ranks are all
/// other processes (`-dp` replicas 1..), of which rank 0 computes nothing.
enum Ranks {
    Local(Box<dyn RankStep>),
    Remote(DriverComm),
}

/// Rank 0's runner of a distributed replica: the MPI shard adaptor of `StepRunner`. Each step goes to the replica's
/// ranks and the logits come back.
pub struct MpiRunner {
    ranks: Ranks,
    vocab: usize,
    /// The block tables kept from the scheduler's deltas: the wire and the ranks' steps take whole tables.
    tables: rserve_scheduler::BlockTables,
}

impl MpiRunner {
    /// Replica 0: rank 0 runs `rank`, its own shard, with the other ranks.
    pub fn local(rank: Box<dyn RankStep>, vocab: usize) -> Self {
        Self { ranks: Ranks::Local(rank), vocab, tables: Default::default() }
    }

    /// A replica whose ranks are all other processes, driven through `comm`.
    pub fn remote(comm: DriverComm, vocab: usize) -> Self {
        Self { ranks: Ranks::Remote(comm), vocab, tables: Default::default() }
    }

    /// Tells a remote replica's ranks the KV block count (rank 0's value, as for replica 0).
    pub fn agree_remote_blocks(comm: &DriverComm, num_blocks: usize) {
        comm.broadcast(&mut vec![num_blocks as u32]);
    }
}

impl MpiRunner {
    /// Runs one step on the replica's ranks: the logits of each sequence's last row, then of `prompt_rows`.
    fn run(&mut self, batch: &[ScheduledSeq], prompt_rows: &[u32]) -> Result<Vec<f32>> {
        self.tables.apply(batch).map_err(|e| EngineError::InvalidArgument(e.to_string()))?;
        let whole: Vec<ScheduledSeq> = batch
            .iter()
            .map(|s| ScheduledSeq { block_tables: self.tables.of(s).to_vec(), is_first_schedule: true, ..s.clone() })
            .collect();
        let batch = whole.as_slice();
        let mut msg = wire::encode(batch, prompt_rows);
        let (logits, from) = match &self.ranks {
            Ranks::Local(rank) => {
                rank.comm().broadcast(&mut msg);
                let l = rank.comm().layout;
                match rank.step(batch, prompt_rows)? {
                    Some(logits) => (logits, l.logits_rank()),
                    None => (rank.comm().recv(l.logits_rank()), l.logits_rank()),
                }
            }
            Ranks::Remote(comm) => {
                comm.broadcast(&mut msg);
                let rank = comm.world.ranks_of(comm.replica).start + comm.layout.logits_rank();
                (comm.recv_logits(), rank)
            }
        };
        if logits.len() != (batch.len() + prompt_rows.len()) * self.vocab {
            return Err(EngineError::Backend(format!("rank {from} returned malformed logits")));
        }
        Ok(logits)
    }
}

impl StepRunner for MpiRunner {
    fn execute(&mut self, batch: &[ScheduledSeq]) -> Result<Vec<f32>> {
        self.run(batch, &[])
    }

    fn execute_sampled(
        &mut self,
        batch: &[ScheduledSeq],
        sampling: &StepSampling,
        masks: Option<&mut dyn FnMut() -> StepMasks>,
    ) -> Result<SampledRows> {
        if sampling.prompt.is_empty() {
            return crate::runner::sample_on_host(self, batch, sampling, masks);
        }
        // Prompt log-probs: the prompt rows' logits come back after the sequences' and are scored here.
        let mut query_start = vec![0u32];
        query_start.extend(batch.iter().scan(0u32, |at, s| {
            *at += s.token_ids.len() as u32;
            Some(*at)
        }));
        let rows = prompt::logit_rows(&sampling.prompt, &query_start);
        let mut logits = self.run(batch, &rows)?;
        let (own, scored) = logits.split_at_mut(batch.len() * self.vocab);
        if let Some(m) = masks {
            m().apply_host(own, self.vocab);
        }
        let mut out = crate::sampling::step::sample_host(own, self.vocab, sampling);
        out.prompt = prompt::score_host(scored, &sampling.prompt, self.vocab);
        Ok(out)
    }

    fn finished(&mut self, ids: &[rserve_scheduler::RequestId]) {
        self.tables.forget(ids.iter().copied());
    }

    fn vocab_size(&self) -> usize {
        self.vocab
    }

    fn device_name(&self) -> String {
        match &self.ranks {
            Ranks::Local(rank) => {
                let l = rank.comm().layout;
                let ep = if l.expert_parallel { ", expert parallel" } else { "" };
                let ranks = match crate::dist::mpi_comm::current() {
                    Some((_, size)) if size > l.world() => {
                        format!("ranks 0-{} of {size} MPI ranks, replica 0", l.world() - 1)
                    }
                    _ => format!("{} MPI ranks", l.world()),
                };
                format!("{} on rank 0 of {ranks} (tp={}, pp={}{ep})", rank.device_name(), l.tp, l.pp)
            }
            Ranks::Remote(comm) => {
                let (l, r) = (comm.layout, comm.replica);
                let ranks = comm.world.ranks_of(r);
                let ep = if l.expert_parallel { ", expert parallel" } else { "" };
                format!(
                    "MPI ranks {}-{} of {}, replica {r}, driven by rank 0 (tp={}, pp={}{ep})",
                    ranks.start,
                    ranks.end - 1,
                    comm.world.size(),
                    l.tp,
                    l.pp
                )
            }
        }
    }
}

impl Drop for MpiRunner {
    fn drop(&mut self) {
        // Tell the replica's ranks to stop.
        match &self.ranks {
            Ranks::Local(rank) => rank.comm().broadcast(&mut Vec::new()),
            Ranks::Remote(comm) => comm.broadcast(&mut Vec::new()),
        }
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
        let (batch, prompt_rows) = wire::decode(&msg)?;
        if let Some(logits) = rank.step(&batch, &prompt_rows)? {
            rank.comm().send_to_driver(&logits);
        }
    }
}
