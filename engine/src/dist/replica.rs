//! `Replica`: one distributed replica's ranks as rank 0 drives them, a step at a time. Each step goes to the ranks
//! (the batch broadcast, rank 0's own shard run where it has one) and the logits come back to rank 0, which chooses
//! the tokens on the host. `leader::MpiRunner` runs it on a thread of its own.

use super::mpi_comm::DriverComm;
use super::runner::RankStep;
use super::wire;
use crate::error::{EngineError, Result};
use crate::model::ScheduledSeq;
use crate::runner::StepMasks;
use crate::sampling::{prompt, SampledRows, StepSampling};

/// Where rank 0 sends a step: its own shard among the replica's ranks, or a replica whose ranks are all other
/// processes (`-dp` replicas 1..), of which rank 0 computes nothing.
pub enum Ranks {
    Local(Box<dyn RankStep>),
    Remote(DriverComm),
}

/// A replica's ranks and what rank 0 keeps of its requests.
pub struct Replica {
    ranks: Ranks,
    vocab: usize,
    /// The block tables kept from the scheduler's deltas: the wire and the ranks' steps take whole tables.
    tables: rserve_scheduler::BlockTables,
}

impl Replica {
    pub fn new(ranks: Ranks, vocab: usize) -> Self {
        Self { ranks, vocab, tables: Default::default() }
    }

    /// Runs one step on the replica's ranks: the logits of each sequence's last row, then of `prompt_rows`.
    pub fn run(&mut self, batch: &[ScheduledSeq], prompt_rows: &[u32]) -> Result<Vec<f32>> {
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

    /// Runs one step and chooses its tokens on the host as `sampling` says (`masks`: the step's grammar masks), with
    /// the prompt rows' scores when it has any.
    pub fn sample(
        &mut self,
        batch: &[ScheduledSeq],
        sampling: &StepSampling,
        masks: Option<StepMasks>,
    ) -> Result<SampledRows> {
        let mut query_start = vec![0u32];
        query_start.extend(batch.iter().scan(0u32, |at, s| {
            *at += s.token_ids.len() as u32;
            Some(*at)
        }));
        // Prompt log-probs: the prompt rows' logits come back after the sequences' and are scored here.
        let rows = prompt::logit_rows(&sampling.prompt, &query_start);
        let mut logits = self.run(batch, &rows)?;
        let (own, scored) = logits.split_at_mut(batch.len() * self.vocab);
        if let Some(m) = masks {
            m.apply_host(own, self.vocab);
        }
        let mut out = crate::sampling::step::sample_host(own, self.vocab, sampling);
        out.prompt = prompt::score_host(scored, &sampling.prompt, self.vocab);
        Ok(out)
    }

    /// Forgets the tables of requests that ended.
    pub fn forget(&mut self, ids: &[rserve_scheduler::RequestId]) {
        self.tables.forget(ids.iter().copied());
    }

    /// The replica's ranks and devices, for the start-up log.
    pub fn device_name(&self) -> String {
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

impl Drop for Replica {
    fn drop(&mut self) {
        // Tell the replica's ranks to stop.
        match &self.ranks {
            Ranks::Local(rank) => rank.comm().broadcast(&mut Vec::new()),
            Ranks::Remote(comm) => comm.broadcast(&mut Vec::new()),
        }
    }
}
