//! `Scheduler`: continuous batching in the vLLM v1 shape. There is no prefill or decode phase: every request has
//! `num_computed_tokens` and a number of known tokens, and each step hands out tokens within
//! `max_num_batched_tokens`, running requests first (a decode token or the next prefill chunk), then waiting requests
//! in arrival order. When a running request cannot get blocks, the most recently admitted running request is
//! preempted (its blocks freed, to be recomputed later), possibly the request itself.
//!
//! Boundary: pure bookkeeping. The engine calls `schedule()`, runs the model on the output, then passes the sampled
//! tokens to `update_from_output()`. `abort()` may be called at any time between those calls.

use std::collections::VecDeque;

use crate::config::SchedulerConfig;
use crate::error::SchedulerError;
use crate::id_map::IdMap;
use crate::ids::RequestId;
use crate::kv_cache_manager::KvCacheManager;
use crate::output::{RequestOutput, ScheduledSeq, SchedulerOutput, SchedulerStats};
use crate::request::{NewRequest, Request, RequestStatus};

/// The continuous-batching scheduler. One owner (the engine thread) drives it.
#[derive(Debug, Clone)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    kv: KvCacheManager,
    requests: IdMap<RequestId, Request>,
    /// Arrival order; preempted requests go back to the front.
    waiting: VecDeque<RequestId>,
    /// Admission order; the last one is preempted first.
    running: Vec<RequestId>,
    /// Finished or aborted since the last `schedule()`.
    finished_ids: Vec<RequestId>,
    num_preemptions: u64,
    prefix_cache_queries: u64,
    prefix_cache_hits: u64,
}

impl Scheduler {
    /// A scheduler over an empty cache; fails when `cfg` breaks a rule.
    pub fn new(cfg: SchedulerConfig) -> Result<Self, SchedulerError> {
        cfg.validate()?;
        let kv = KvCacheManager::new(cfg.num_blocks, cfg.block_size, cfg.enable_prefix_caching);
        Ok(Self {
            kv,
            requests: IdMap::default(),
            waiting: VecDeque::new(),
            running: Vec::with_capacity(cfg.max_num_seqs),
            finished_ids: Vec::new(),
            num_preemptions: 0,
            prefix_cache_queries: 0,
            prefix_cache_hits: 0,
            cfg,
        })
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    /// Queues a request at the back of the waiting queue. Fails (and queues nothing) for an empty prompt, a prompt
    /// longer than `max_model_len`, `max_tokens == 0`, `min_tokens > max_tokens` or an id already in use.
    pub fn add_request(&mut self, req: NewRequest) -> Result<(), SchedulerError> {
        if self.requests.contains_key(&req.id) {
            return Err(SchedulerError::DuplicateRequest { id: req.id });
        }
        let mut request = Request::new(req, self.cfg.max_model_len)?;
        self.kv.update_block_hashes(&mut request);
        self.waiting.push_back(request.id);
        self.requests.insert(request.id, request);
        Ok(())
    }

    /// Removes a waiting or running request and frees its blocks at once. Returns false for an unknown (or already
    /// finished) id. Safe at any time between calls, also between `schedule()` and `update_from_output()`: the
    /// aborted request's entries in that output are then ignored.
    pub fn abort(&mut self, id: RequestId) -> bool {
        let Some(req) = self.requests.remove(&id) else { return false };
        match req.status {
            RequestStatus::Waiting => {
                if let Some(pos) = self.waiting.iter().position(|&w| w == id) {
                    self.waiting.remove(pos);
                }
            }
            RequestStatus::Running | RequestStatus::Finished => {
                if let Some(pos) = self.running.iter().position(|&r| r == id) {
                    self.running.remove(pos);
                }
            }
        }
        self.kv.free(id);
        self.finished_ids.push(id);
        true
    }

    /// True while any request is waiting or running.
    pub fn has_unfinished(&self) -> bool {
        !self.requests.is_empty()
    }

    /// Read access to one request's state.
    pub fn request(&self, id: RequestId) -> Option<&Request> {
        self.requests.get(&id)
    }

    /// Read access to the KV cache manager (block tables, pool, invariant checks).
    pub fn kv_cache(&self) -> &KvCacheManager {
        &self.kv
    }

    pub fn stats(&self) -> SchedulerStats {
        SchedulerStats {
            num_running: self.running.len(),
            num_waiting: self.waiting.len(),
            num_blocks_used: self.kv.num_used_blocks(),
            num_blocks_free: self.kv.num_free_blocks(),
            num_blocks_total: self.kv.num_blocks(),
            num_blocks_cached: self.kv.pool().num_cached_blocks(),
            num_preemptions: self.num_preemptions,
            prefix_cache_queries: self.prefix_cache_queries,
            prefix_cache_hits: self.prefix_cache_hits,
        }
    }

    /// Plans one step: which requests compute which tokens, with their block tables and slot mappings.
    pub fn schedule(&mut self) -> SchedulerOutput {
        let mut out = SchedulerOutput {
            seqs: Vec::with_capacity(self.running.len() + 1),
            num_batched_tokens: 0,
            preempted: Vec::new(),
            finished_ids: std::mem::take(&mut self.finished_ids),
        };
        let mut budget = self.cfg.max_num_batched_tokens;

        // 1. Running requests, in admission order.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            let Some(req) = self.requests.get(&id) else {
                debug_assert!(false, "running {id} has no state");
                self.running.remove(i);
                continue;
            };
            let num_new = req.num_tokens().saturating_sub(req.num_computed_tokens).min(budget);
            if num_new == 0 {
                i += 1;
                continue;
            }
            let scheduled = loop {
                if self.kv.allocate_slots(&self.requests[&id], num_new, &[]).is_some() {
                    break true;
                }
                let Some(victim) = self.running.pop() else { break false };
                self.preempt(victim);
                out.preempted.push(victim);
                if victim == id {
                    break false;
                }
            };
            if scheduled {
                out.seqs.push(self.build_seq(id, num_new));
                budget -= num_new;
                i += 1;
            }
        }

        // 2. Waiting requests, first come first served; not in a step that had to preempt.
        if out.preempted.is_empty() {
            self.admit_waiting(&mut out, &mut budget);
        }

        out.num_batched_tokens = self.cfg.max_num_batched_tokens - budget;
        out
    }

    fn admit_waiting(&mut self, out: &mut SchedulerOutput, budget: &mut usize) {
        while *budget > 0 && self.running.len() < self.cfg.max_num_seqs {
            let Some(&id) = self.waiting.front() else { break };
            let Some(req) = self.requests.get(&id) else {
                debug_assert!(false, "waiting {id} has no state");
                self.waiting.pop_front();
                continue;
            };
            let (hits, num_cached) = self.kv.get_computed_blocks(req);
            let num_new = (req.num_tokens() - num_cached).min(*budget);
            if self.kv.allocate_slots(req, num_new, &hits).is_none() {
                break;
            }
            self.waiting.pop_front();
            let Some(req) = self.requests.get_mut(&id) else { break };
            req.num_computed_tokens = num_cached;
            req.status = RequestStatus::Running;
            req.first_schedule_pending = true;
            if req.num_cached_tokens.is_none() {
                req.num_cached_tokens = Some(num_cached.min(req.prompt_len));
            }
            self.prefix_cache_queries += req.num_tokens() as u64;
            self.prefix_cache_hits += num_cached as u64;
            self.running.push(id);
            out.seqs.push(self.build_seq(id, num_new));
            *budget -= num_new;
        }
    }

    /// Frees `id`'s blocks and puts it at the front of the waiting queue to be recomputed from scratch.
    fn preempt(&mut self, id: RequestId) {
        self.kv.free(id);
        if let Some(req) = self.requests.get_mut(&id) {
            req.num_computed_tokens = 0;
            req.status = RequestStatus::Waiting;
        }
        self.waiting.push_front(id);
        self.num_preemptions += 1;
    }

    /// The step's entry for `id`, whose blocks for `num_new` tokens are allocated.
    fn build_seq(&mut self, id: RequestId, num_new: usize) -> ScheduledSeq {
        let bs = self.cfg.block_size;
        let table = self.kv.block_table(id).unwrap_or(&[]);
        let Some(req) = self.requests.get_mut(&id) else {
            debug_assert!(false, "scheduled {id} has no state");
            return ScheduledSeq {
                request_id: id,
                token_ids: Vec::new(),
                start_position: 0,
                block_table: Vec::new(),
                slot_mapping: Vec::new(),
                sample: false,
                num_cached_tokens: 0,
                is_first_schedule: false,
            };
        };
        let start = req.num_computed_tokens;
        let end = start + num_new;
        let slot_mapping = (start..end).map(|p| table[p / bs].0 * bs as u32 + (p % bs) as u32).collect();
        let is_first_schedule = std::mem::replace(&mut req.first_schedule_pending, false);
        ScheduledSeq {
            request_id: id,
            token_ids: req.token_ids[start..end].to_vec(),
            start_position: start,
            block_table: table.to_vec(),
            slot_mapping,
            sample: end == req.num_tokens(),
            num_cached_tokens: req.num_cached_tokens.unwrap_or(0),
            is_first_schedule,
        }
    }

    /// Applies a step's results: advances `num_computed_tokens` of every scheduled request, caches blocks that became
    /// full, appends each sampled token and checks the stop conditions. Finished requests are freed and reported.
    /// `sampled` holds one `(id, token)` per seq of `out` with `sample == true`, ideally in the same order. Entries of
    /// requests aborted since `schedule()` are ignored.
    pub fn update_from_output(&mut self, out: &SchedulerOutput, sampled: &[(RequestId, u32)]) -> Vec<RequestOutput> {
        let mut outputs = Vec::with_capacity(sampled.len());
        let mut any_finished = false;
        let mut cursor = 0;
        for seq in &out.seqs {
            let Some(req) = self.requests.get_mut(&seq.request_id) else { continue };
            if req.status != RequestStatus::Running || req.num_computed_tokens != seq.start_position {
                continue; // stale entry: aborted and re-added, or an output applied twice
            }
            req.num_computed_tokens += seq.token_ids.len();
            self.kv.cache_computed_blocks(req);
            if !seq.sample {
                continue;
            }
            let Some(token) = find_sample(sampled, &mut cursor, seq.request_id) else { continue };
            req.append_output(token);
            self.kv.update_block_hashes(req);
            let finished = req.check_stop(self.cfg.max_model_len);
            if finished.is_some() {
                req.status = RequestStatus::Finished;
                any_finished = true;
            }
            outputs.push(RequestOutput { request_id: seq.request_id, new_token: Some(token), finished });
        }
        if any_finished {
            let requests = &mut self.requests;
            let kv = &mut self.kv;
            let finished_ids = &mut self.finished_ids;
            self.running.retain(|id| {
                let done = requests.get(id).is_some_and(|r| r.status == RequestStatus::Finished);
                if done {
                    requests.remove(id);
                    kv.free(*id);
                    finished_ids.push(*id);
                }
                !done
            });
        }
        outputs
    }

    /// Checks cross-structure invariants (for tests): KV manager invariants; each running request holds a table and
    /// each waiting one none; no request is both; `num_computed_tokens` never exceeds the tokens or the table capacity.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.kv.check_invariants()?;
        if self.running.len() + self.waiting.len() != self.requests.len() {
            return Err(format!(
                "{} running + {} waiting != {} requests",
                self.running.len(),
                self.waiting.len(),
                self.requests.len()
            ));
        }
        if self.running.len() > self.cfg.max_num_seqs {
            return Err(format!("{} running > max_num_seqs {}", self.running.len(), self.cfg.max_num_seqs));
        }
        for id in &self.running {
            let r = self.requests.get(id).ok_or_else(|| format!("running {id} unknown"))?;
            if r.status != RequestStatus::Running {
                return Err(format!("running {id} has status {:?}", r.status));
            }
            let cap = self.kv.block_table(*id).map_or(0, |t| t.len()) * self.cfg.block_size;
            if r.num_computed_tokens > r.num_tokens() || r.num_computed_tokens > cap {
                return Err(format!("{id}: {} computed of {} tokens, capacity {cap}", r.num_computed_tokens, r.num_tokens()));
            }
        }
        for id in &self.waiting {
            let r = self.requests.get(id).ok_or_else(|| format!("waiting {id} unknown"))?;
            if r.status != RequestStatus::Waiting || r.num_computed_tokens != 0 {
                return Err(format!("waiting {id}: {:?}, {} computed", r.status, r.num_computed_tokens));
            }
            if self.kv.block_table(*id).is_some() {
                return Err(format!("waiting {id} holds blocks"));
            }
        }
        if self.kv.num_tables() != self.running.len() {
            return Err(format!("{} block tables for {} running", self.kv.num_tables(), self.running.len()));
        }
        Ok(())
    }
}

/// The sampled token of `id`: the entry at `cursor` when the order matches (the common case), else a search.
fn find_sample(sampled: &[(RequestId, u32)], cursor: &mut usize, id: RequestId) -> Option<u32> {
    if let Some(&(sid, tok)) = sampled.get(*cursor) {
        if sid == id {
            *cursor += 1;
            return Some(tok);
        }
    }
    sampled.iter().find(|(sid, _)| *sid == id).map(|&(_, tok)| tok)
}
