//! A pooling engine's step (`--runner pooling`): the scheduled prompt chunks run to the model's final norm, the
//! hidden rows the pooler reads come back (`StepRunner::pool`), and a request whose prompt is complete gets its
//! pooled result (`RequestEvent::Pooled`) and ends at once, its KV blocks freed: pooling requests generate nothing
//! and keep no cache. Such an engine never runs steps ahead (no token feeds the next step).

use std::sync::Arc;

use rserve_scheduler::{IdMap, RequestId, SchedulerOutput};

use super::output_thread::ToOutput;
use super::thread::EngineLoop;
use crate::api::{FinishReason, PoolingParams};
use crate::pooling::Pooler;
use crate::runner::PoolRows;

/// The pooler and what each pooling request gathered so far.
pub(crate) struct PoolingState {
    pub(crate) pooler: Arc<Pooler>,
    pending: IdMap<RequestId, Pending>,
}

struct Pending {
    params: PoolingParams,
    /// The hidden rows the request's steps returned, `[rows, hidden]`.
    rows: Vec<f32>,
}

impl PoolingState {
    pub(crate) fn new(pooler: Arc<Pooler>) -> Self {
        Self { pooler, pending: IdMap::default() }
    }

    pub(super) fn add(&mut self, id: RequestId, params: PoolingParams) {
        self.pending.insert(id, Pending { params, rows: Vec::new() });
    }

    pub(super) fn forget(&mut self, id: RequestId) {
        self.pending.remove(&id);
    }

    /// Drops what the scheduler's ended requests gathered, and restarts the preempted ones (their prompts are
    /// computed again from the start).
    fn apply_ends(&mut self, out: &SchedulerOutput) {
        for id in &out.finished_ids {
            self.pending.remove(id);
        }
        for id in &out.preempted {
            if let Some(p) = self.pending.get_mut(id) {
                p.rows.clear();
            }
        }
    }
}

impl EngineLoop {
    /// Runs one scheduled step of a pooling engine.
    pub(super) fn pool_step(&mut self, out: SchedulerOutput) {
        let Some(state) = self.pooling.as_mut() else { return };
        state.apply_ends(&out);
        let rows: Vec<PoolRows> = out.seqs.iter().map(|q| state.pooler.rows(q.start_position == 0, q.sample)).collect();
        let segments: Vec<&[u32]> = out
            .seqs
            .iter()
            .map(|q| {
                let types = state.pending.get(&q.request_id).and_then(|p| p.params.token_type_ids.as_deref());
                types.and_then(|t| t.get(q.start_position..q.start_position + q.token_ids.len())).unwrap_or(&[])
            })
            .collect();
        let result = self.hooks.before_step().and_then(|()| self.runner.pool(&out.seqs, &rows, &segments));
        let hidden = match result {
            Ok(h) => h,
            Err(e) => {
                if let Some(s) = self.pooling.as_mut() {
                    out.seqs.iter().for_each(|q| s.forget(q.request_id));
                }
                return self.fail_step(&out, &e.to_string());
            }
        };
        self.observe_step(&out);
        // No token is sampled: the scheduler only records the chunks computed.
        self.scheduler.update_from_output(&out, &[]);
        for (q, h) in out.seqs.iter().zip(hidden) {
            let id = q.request_id;
            let Some(state) = self.pooling.as_mut() else { return };
            let Some(p) = state.pending.get_mut(&id) else { continue };
            p.rows.extend_from_slice(&h);
            if !q.sample {
                continue;
            }
            let done = state.pending.remove(&id).map(|p| state.pooler.finish(&p.rows, &p.params));
            self.scheduler.abort(id);
            match done {
                Some(Ok(data)) => {
                    self.observe_pooled(id);
                    self.outbox.push(ToOutput::Pooled { id, data });
                    self.finish(id, FinishReason::Stop, None, false);
                }
                Some(Err(e)) => self.fail_request(id, e.to_string()),
                None => {}
            }
        }
        self.scheduler.recycle(out);
        self.publish_gauges();
    }
}
