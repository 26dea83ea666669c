//! `MpiRunner`: rank 0's `StepRunner` of a distributed replica, the MPI shard adaptor. A driver thread of its own
//! owns the replica (`replica::Replica`) and runs its steps in the order the engine thread sends them. With async
//! scheduling the engine launches step N+1 while the driver still runs step N: the driver fills step N+1's
//! placeholders from the ids step N chose before it broadcasts it, so the host's scheduling and output work overlap
//! the ranks' compute, as on a single device, and no rank sees a placeholder.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::thread::JoinHandle;

use rserve_scheduler::{IdMap, RequestId, TokenId};

use super::mpi_comm::DriverComm;
use super::replica::{Ranks, Replica};
use super::runner::RankStep;
use crate::error::{EngineError, Result};
use crate::model::ScheduledSeq;
use crate::runner::{Launch, StepMasks, StepRunner};
use crate::sampling::{SampledRows, StepSampling};

/// What the engine thread asks of the driver, in order.
enum Job {
    /// A step's logits (`StepRunner::execute`).
    Logits(Vec<ScheduledSeq>),
    /// A step and its token choice; its placeholders take the previous step's ids.
    Sampled { batch: Vec<ScheduledSeq>, sampling: Box<StepSampling>, masks: Option<StepMasks> },
    /// Requests that ended: their tables go.
    Finished(Vec<RequestId>),
}

/// The driver's answer to a `Logits` or `Sampled` job.
enum Reply {
    Logits(Vec<f32>),
    Sampled(SampledRows),
}

/// Rank 0's runner of a distributed replica.
pub struct MpiRunner {
    jobs: Option<Sender<Job>>,
    replies: Receiver<Result<Reply>>,
    driver: Option<JoinHandle<()>>,
    vocab: usize,
    name: String,
    overlaps: bool,
    /// Steps launched and not collected.
    in_flight: usize,
}

impl MpiRunner {
    /// Replica 0: rank 0 runs `rank`, its own shard, with the other ranks. `overlaps`: async scheduling.
    pub fn local(rank: Box<dyn RankStep>, vocab: usize, overlaps: bool) -> Result<Self> {
        Self::start(Replica::new(Ranks::Local(rank), vocab), vocab, overlaps)
    }

    /// A replica whose ranks are all other processes, driven through `comm`.
    pub fn remote(comm: DriverComm, vocab: usize, overlaps: bool) -> Result<Self> {
        Self::start(Replica::new(Ranks::Remote(comm), vocab), vocab, overlaps)
    }

    /// Tells a remote replica's ranks the KV block count (rank 0's value, as for replica 0).
    pub fn agree_remote_blocks(comm: &DriverComm, num_blocks: usize) {
        comm.broadcast(&mut vec![num_blocks as u32]);
    }

    fn start(replica: Replica, vocab: usize, overlaps: bool) -> Result<Self> {
        let name = replica.device_name();
        let (jobs, job_rx) = channel();
        let (reply_tx, replies) = channel();
        let driver = std::thread::Builder::new()
            .name("rserve-mpi-driver".into())
            .spawn(move || drive(replica, job_rx, reply_tx))
            .map_err(|e| EngineError::Backend(format!("starting the MPI driver thread: {e}")))?;
        Ok(Self { jobs: Some(jobs), replies, driver: Some(driver), vocab, name, overlaps, in_flight: 0 })
    }

    fn send(&self, job: Job) -> Result<()> {
        let jobs = self.jobs.as_ref().ok_or_else(gone)?;
        jobs.send(job).map_err(|_| gone())
    }

    fn reply(&mut self) -> Result<Reply> {
        self.replies.recv().map_err(|_| gone())?
    }

    /// A step run to its end here: nothing may be in flight before it, or its reply would be another step's.
    fn now(&mut self, job: Job) -> Result<Reply> {
        if self.in_flight > 0 {
            return Err(EngineError::Backend("an MPI step ran with another still in flight".into()));
        }
        self.send(job)?;
        self.reply()
    }
}

fn gone() -> EngineError {
    EngineError::Backend("the MPI driver thread ended".into())
}

/// The driver thread: runs the jobs in order until the engine drops its sender; dropping the replica then tells
/// its ranks to stop.
fn drive(mut replica: Replica, jobs: Receiver<Job>, replies: Sender<Result<Reply>>) {
    // The last sampled step: each request's row, and the ids it chose.
    let mut last: Option<(IdMap<RequestId, usize>, Vec<u32>)> = None;
    while let Ok(job) = jobs.recv() {
        let reply = match job {
            Job::Finished(ids) => {
                replica.forget(&ids);
                continue;
            }
            Job::Logits(batch) => replica.run(&batch, &[]).map(Reply::Logits),
            Job::Sampled { mut batch, sampling, masks } => {
                let got = fill_placeholders(&mut batch, last.as_ref())
                    .and_then(|()| replica.sample(&batch, &sampling, masks));
                last = got.as_ref().ok().map(|rows| {
                    let at = batch.iter().enumerate().map(|(i, s)| (s.request_id, i)).collect();
                    (at, rows.ids.clone())
                });
                got.map(Reply::Sampled)
            }
        };
        if replies.send(reply).is_err() {
            break;
        }
    }
}

/// Gives each placeholder of `batch` the id its request got in the step before (`last`).
fn fill_placeholders(batch: &mut [ScheduledSeq], last: Option<&(IdMap<RequestId, usize>, Vec<u32>)>) -> Result<()> {
    for s in batch {
        for t in s.token_ids.iter_mut().filter(|t| **t == TokenId::PLACEHOLDER) {
            let id = last.and_then(|(at, ids)| ids.get(*at.get(&s.request_id)?)).ok_or_else(|| {
                EngineError::InvalidArgument(format!(
                    "request {}: a token to compute whose id the step before did not choose",
                    s.request_id.0
                ))
            })?;
            *t = TokenId(*id);
        }
    }
    Ok(())
}

impl StepRunner for MpiRunner {
    fn execute(&mut self, batch: &[ScheduledSeq]) -> Result<Vec<f32>> {
        match self.now(Job::Logits(batch.to_vec()))? {
            Reply::Logits(l) => Ok(l),
            Reply::Sampled(_) => Err(EngineError::Backend("expected logits".into())),
        }
    }

    fn execute_sampled(
        &mut self,
        batch: &[ScheduledSeq],
        sampling: &StepSampling,
        masks: Option<&mut dyn FnMut() -> StepMasks>,
    ) -> Result<SampledRows> {
        let masks = masks.map(|m| m());
        let job = Job::Sampled { batch: batch.to_vec(), sampling: Box::new(sampling.clone()), masks };
        match self.now(job)? {
            Reply::Sampled(rows) => Ok(rows),
            Reply::Logits(_) => Err(EngineError::Backend("expected sampled ids".into())),
        }
    }

    fn launch(&mut self, batch: &[ScheduledSeq], sampling: &StepSampling) -> Result<Launch> {
        self.send(Job::Sampled { batch: batch.to_vec(), sampling: Box::new(sampling.clone()), masks: None })?;
        self.in_flight += 1;
        Ok(Launch::Running)
    }

    fn collect(&mut self, _sampling: &StepSampling) -> Result<SampledRows> {
        if self.in_flight == 0 {
            return Err(EngineError::Backend("no step was launched".into()));
        }
        self.in_flight -= 1;
        match self.reply()? {
            Reply::Sampled(rows) => Ok(rows),
            Reply::Logits(_) => Err(EngineError::Backend("expected sampled ids".into())),
        }
    }

    fn overlaps(&self) -> bool {
        self.overlaps
    }

    fn abandon(&mut self) {
        // The driver still answers the steps launched: their replies are dropped here, in order.
        while self.in_flight > 0 {
            self.in_flight -= 1;
            if self.reply().is_err() {
                self.in_flight = 0;
            }
        }
    }

    fn finished(&mut self, ids: &[RequestId]) {
        if !ids.is_empty() {
            let _ = self.send(Job::Finished(ids.to_vec()));
        }
    }

    fn vocab_size(&self) -> usize {
        self.vocab
    }

    fn device_name(&self) -> String {
        self.name.clone()
    }
}

impl Drop for MpiRunner {
    fn drop(&mut self) {
        // Closing the job channel ends the driver, which tells the ranks to stop.
        self.jobs.take();
        if let Some(d) = self.driver.take() {
            let _ = d.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rserve_scheduler::BlockId;

    fn seq(id: u64, tokens: &[u32]) -> ScheduledSeq {
        let tokens = tokens.iter().copied().map(TokenId).collect();
        ScheduledSeq { request_id: RequestId(id), ..ScheduledSeq::new(tokens, 4, vec![BlockId(1)], 16) }
    }

    #[test]
    fn placeholders_take_the_ids_the_step_before_chose() {
        let p = TokenId::PLACEHOLDER.0;
        let last: (IdMap<RequestId, usize>, Vec<u32>) =
            ([(RequestId(7), 1), (RequestId(3), 0)].into_iter().collect(), vec![11, 22]);
        let mut batch = vec![seq(3, &[p]), seq(9, &[5, 6]), seq(7, &[p])];
        fill_placeholders(&mut batch, Some(&last)).unwrap();
        assert_eq!(batch[0].token_ids, [TokenId(11)]);
        assert_eq!(batch[1].token_ids, [TokenId(5), TokenId(6)]);
        assert_eq!(batch[2].token_ids, [TokenId(22)]);
        // A placeholder of a request the step before did not sample is refused, never guessed.
        let mut orphan = [seq(4, &[p])];
        assert!(fill_placeholders(&mut orphan, Some(&last)).is_err());
        assert!(fill_placeholders(&mut [seq(3, &[p])], None).is_err());
    }
}
