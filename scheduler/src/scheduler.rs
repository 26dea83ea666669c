//! `Scheduler`: continuous batching in the vLLM v1 shape. There is no prefill or decode phase: every request has
//! `num_computed_tokens` and a number of known tokens, and each step hands out tokens within
//! `max_num_batched_tokens`, running requests first (a decode token or the next prefill chunk), then waiting requests
//! in arrival order, within the partial-prefill limits (`SchedulerConfig::prefill_limits`: how many requests prefill in
//! one step, how many of them long, the longest chunk). When a running request cannot get blocks, the most recently admitted running request is
//! preempted (its blocks freed, to be recomputed later), possibly the request itself.
//!
//! Boundary: pure bookkeeping. The engine calls `schedule()`, runs the model on the output, passes the sampled tokens
//! to `update_from_output()` and may hand the output back with `recycle()` so the next step reuses its buffers.
//! `abort()` may be called at any time between those calls.
//!
//! Async scheduling (vLLM v1's): `schedule()` advances each request's `num_computed_tokens` as it schedules, and a
//! token it schedules to be sampled is a placeholder until its id comes back. So the engine may call `schedule()`
//! again before the previous step's `update_from_output()`: a running request whose sample is still out is scheduled
//! for its next position with [`TokenId::PLACEHOLDER`] as input (the runner feeds the id on its device), unless its
//! length limits are reached by the samples in flight. Outputs are applied in step order; an output whose request was
//! preempted, aborted or finished since (its next token would not sit where the output says) is ignored.
//!
//! KV cache groups: the scheduler serves the groups of `SchedulerConfig::kv_groups` through one
//! [`KvCacheManager`]; every scheduled seq carries one block table and slot mapping per group. All groups' tables of
//! a request have the same length, so capacity is read from group 0.
//!
//! Invariant: requests live in exactly one of `running` (admission order, holding a block table) and `waiting`
//! (arrival order, preempted ones at the front, holding no blocks); `live` holds the ids of both.

use std::collections::VecDeque;

use crate::config::SchedulerConfig;
use crate::error::SchedulerError;
use crate::id_map::IdSet;
use crate::ids::{RequestId, TokenId};
use crate::kv_cache_manager::{KvCacheManager, RequestBlocks};
use crate::output::{push_slots, RequestOutput, ScheduledSeq, SchedulerOutput, SchedulerStats};
use crate::prefill_limits::{PrefillBlocked, PrefillSlots};
use crate::request::{NewRequest, Request, RequestStatus};

/// What [`Scheduler::reset_prefix_cache`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixCacheReset {
    /// Cached blocks that no request held and that are now plain free blocks.
    pub dropped_blocks: usize,
    /// No block was in use: nothing cached is left (vLLM's `success`).
    pub complete: bool,
}

/// The continuous-batching scheduler. One owner (the engine thread) drives it.
#[derive(Debug, Clone)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    kv: KvCacheManager,
    /// Admitted requests in admission order; the last one is preempted first.
    running: Vec<Request>,
    /// Requests to admit, first come first served; preempted requests go back to the front.
    waiting: VecDeque<Request>,
    /// Ids of all running and waiting requests.
    live: IdSet<RequestId>,
    /// Finished or aborted since the last `schedule()`.
    finished_ids: Vec<RequestId>,
    /// The seqs of an output handed back through `recycle()`; the next `schedule()` refills them in place.
    spare_seqs: Vec<ScheduledSeq>,
    num_preemptions: u64,
    prefix_cache_queries: u64,
    prefix_cache_hits: u64,
}

impl Scheduler {
    /// A scheduler over an empty cache; fails when `cfg` breaks a rule.
    pub fn new(cfg: SchedulerConfig) -> Result<Self, SchedulerError> {
        cfg.validate()?;
        let kv = KvCacheManager::new(cfg.num_blocks, cfg.block_size, cfg.enable_prefix_caching, &cfg.kv_groups);
        Ok(Self {
            kv,
            running: Vec::with_capacity(cfg.max_num_seqs),
            waiting: VecDeque::new(),
            live: IdSet::default(),
            finished_ids: Vec::new(),
            spare_seqs: Vec::new(),
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
        if self.live.contains(&req.id) {
            return Err(SchedulerError::DuplicateRequest { id: req.id });
        }
        let mut request = Request::new(req, self.cfg.max_model_len)?;
        self.kv.update_block_hashes(&mut request);
        self.live.insert(request.id);
        self.waiting.push_back(request);
        Ok(())
    }

    /// Removes a waiting or running request and frees its blocks at once. Returns false for an unknown (or already
    /// finished) id. Safe at any time between calls, also between `schedule()` and `update_from_output()`: the
    /// aborted request's entries in that output are then ignored.
    pub fn abort(&mut self, id: RequestId) -> bool {
        if !self.live.remove(&id) {
            return false;
        }
        if let Some(pos) = self.running.iter().position(|r| r.id == id) {
            self.running.remove(pos);
        } else if let Some(pos) = self.waiting.iter().position(|r| r.id == id) {
            self.waiting.remove(pos);
        }
        self.kv.free(id);
        self.finished_ids.push(id);
        true
    }

    /// True while any request is waiting or running.
    pub fn has_unfinished(&self) -> bool {
        !self.live.is_empty()
    }

    /// Read access to one live request's state (a linear search: for tests and diagnostics).
    pub fn request(&self, id: RequestId) -> Option<&Request> {
        self.running.iter().chain(self.waiting.iter()).find(|r| r.id == id)
    }

    /// Read access to the KV cache manager (block tables, pool, invariant checks).
    pub fn kv_cache(&self) -> &KvCacheManager {
        &self.kv
    }

    /// Short for [`Scheduler::kv_cache`].
    pub fn kv(&self) -> &KvCacheManager {
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
        // `out.seqs` starts as the recycled seqs; `filled` counts the entries rewritten this step.
        let mut out = SchedulerOutput {
            seqs: std::mem::take(&mut self.spare_seqs),
            num_batched_tokens: 0,
            preempted: Vec::new(),
            finished_ids: std::mem::take(&mut self.finished_ids),
        };
        let mut budget = self.cfg.max_num_batched_tokens;
        let bs = self.cfg.block_size;
        let mut filled = 0;

        let limits = self.cfg.prefill_limits;
        let mut prefills = PrefillSlots::default();

        // 1. Running requests, in admission order; a prefill beyond the partial-prefill limits waits a step.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let req = &self.running[i];
            let id = req.id;
            if req.limits_reached_in_flight(self.cfg.max_model_len) {
                i += 1;
                continue;
            }
            let remaining = req.num_tokens_with_placeholders().saturating_sub(req.num_computed_tokens);
            let prompt_len = req.prompt_len;
            let num_new = match prefills.allowed(&limits, remaining, prompt_len) {
                Ok(n) => n.min(budget),
                Err(_) => 0,
            };
            if num_new == 0 {
                i += 1;
                continue;
            }
            let scheduled = loop {
                if self.kv.allocate_slots(&self.running[i], num_new, &[]).is_some() {
                    break true;
                }
                let Some(victim) = self.running.pop() else { break false };
                out.preempted.push(victim.id);
                let was_self = victim.id == id;
                self.preempt(victim);
                if was_self {
                    break false;
                }
            };
            if scheduled {
                let tables = self.kv.block_tables(id).unwrap_or(&[]);
                fill_seq(next_seq(&mut out.seqs, &mut filled), &mut self.running[i], tables, num_new, bs);
                prefills.take(&limits, remaining, prompt_len);
                budget -= num_new;
                i += 1;
            }
        }

        // 2. Waiting requests, first come first served; not in a step that had to preempt.
        if out.preempted.is_empty() {
            self.admit_waiting(&mut out, &mut filled, &mut budget, &mut prefills);
        }
        out.seqs.truncate(filled);

        out.num_batched_tokens = self.cfg.max_num_batched_tokens - budget;
        out
    }

    /// Admits waiting requests in arrival order while the budget, `max_num_seqs`, the KV cache and the partial-prefill
    /// limits allow. When only the long-prefill limit stops a request, shorter ones behind it may go first (vLLM's
    /// reason for `max_long_partial_prefills`); the long one keeps its place.
    fn admit_waiting(
        &mut self,
        out: &mut SchedulerOutput,
        filled: &mut usize,
        budget: &mut usize,
        prefills: &mut PrefillSlots,
    ) {
        let limits = self.cfg.prefill_limits;
        let mut j = 0;
        while *budget > 0 && self.running.len() < self.cfg.max_num_seqs {
            let Some(req) = self.waiting.get(j) else { break };
            let (hits, num_cached) = self.kv.get_computed_blocks(req);
            let remaining = req.num_tokens() - num_cached;
            let prompt_len = req.prompt_len;
            let num_new = match prefills.allowed(&limits, remaining, prompt_len) {
                Ok(n) => n.min(*budget),
                Err(PrefillBlocked::Full) => break,
                Err(PrefillBlocked::LongFull) => {
                    j += 1;
                    continue;
                }
            };
            // A prompt that must run whole waits (in its place: arrival order holds) for a step with room for it.
            if req.whole_prompt && num_new < remaining {
                break;
            }
            if self.kv.allocate_slots(req, num_new, &hits).is_none() {
                break;
            }
            let Some(mut req) = self.waiting.remove(j) else { break };
            prefills.take(&limits, remaining, prompt_len);
            req.num_computed_tokens = num_cached;
            req.status = RequestStatus::Running;
            req.first_schedule_pending = true;
            if req.num_cached_tokens.is_none() {
                req.num_cached_tokens = Some(num_cached.min(req.prompt_len));
            }
            self.prefix_cache_queries += req.num_tokens() as u64;
            self.prefix_cache_hits += num_cached as u64;
            let tables = self.kv.block_tables(req.id).unwrap_or(&[]);
            fill_seq(next_seq(&mut out.seqs, filled), &mut req, tables, num_new, self.cfg.block_size);
            self.running.push(req);
            *budget -= num_new;
        }
    }

    /// Resets the prefix cache (vLLM's `Scheduler.reset_prefix_cache`): with `preempt_running`, every running request
    /// is first preempted (its blocks freed; it is recomputed when scheduled again). Then the keys of all blocks no
    /// request holds are dropped. `complete` is vLLM's `success`: no block was in use, so the whole cache is gone;
    /// otherwise the blocks in use keep their keys and the caller may retry.
    pub fn reset_prefix_cache(&mut self, preempt_running: bool) -> PrefixCacheReset {
        if preempt_running {
            // The last admitted first, so that they return to the waiting queue in admission order.
            while let Some(req) = self.running.pop() {
                self.preempt(req);
            }
        }
        let dropped_blocks = self.kv.reset_prefix_cache();
        PrefixCacheReset { dropped_blocks, complete: self.kv.num_used_blocks() == 0 }
    }

    /// Frees the request's blocks and puts it at the front of the waiting queue to be recomputed from scratch.
    fn preempt(&mut self, mut req: Request) {
        self.kv.free(req.id);
        req.num_computed_tokens = 0;
        // Samples still out are ignored when they come back: the request recomputes from its known tokens.
        req.num_output_placeholders = 0;
        req.status = RequestStatus::Waiting;
        self.waiting.push_front(req);
        self.num_preemptions += 1;
    }

    /// Applies a step's results, in the order steps were scheduled: caches blocks that became full and computed,
    /// appends each sampled token and checks the stop conditions. Finished requests are freed and reported.
    /// `sampled` holds one `(id, token)` per seq of `out` with `sample == true`, ideally in the same order. Entries of
    /// requests aborted, finished or preempted since `schedule()` are ignored, as is an output applied twice.
    pub fn update_from_output(
        &mut self,
        out: &SchedulerOutput,
        sampled: &[(RequestId, TokenId)],
    ) -> Vec<RequestOutput> {
        let mut outputs = Vec::with_capacity(sampled.len());
        let mut any_finished = false;
        let mut sample_cursor = 0;
        // Seqs are in running order (aborts only remove entries), so a forward walk finds each request.
        let mut run_cursor = 0;
        let bs = self.cfg.block_size;
        for seq in &out.seqs {
            let Some(idx) = find_running(&self.running, run_cursor, seq.request_id) else {
                continue;
            };
            run_cursor = idx + 1;
            let req = &mut self.running[idx];
            let end = seq.start_position + seq.token_ids.len();
            if req.status != RequestStatus::Running || end > req.num_computed_tokens {
                continue; // stale entry: the request was preempted (and recomputes) since this step
            }
            // Blocks full of computed tokens whose ids are known become prefix-cache hits.
            let computed = end.min(req.num_tokens());
            if computed / bs > seq.start_position / bs {
                self.kv.cache_computed_blocks(req, computed);
            }
            // A sample lands at position `end`: only while that is the request's next token (not preempted, rolled
            // back or applied already) and one of its samples is out.
            if !seq.sample || end != req.num_tokens() || req.num_output_placeholders == 0 {
                continue;
            }
            req.num_output_placeholders -= 1;
            let Some(token) = find_sample(sampled, &mut sample_cursor, seq.request_id) else {
                // No sample came back: recompute the last token next step rather than stall with nothing to
                // compute; steps already scheduled after this one computed from the missing id and are ignored.
                req.num_output_placeholders = 0;
                req.num_computed_tokens = req.num_tokens() - 1;
                continue;
            };
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
            let kv = &mut self.kv;
            let live = &mut self.live;
            let finished_ids = &mut self.finished_ids;
            self.running.retain(|r| {
                let done = r.status == RequestStatus::Finished;
                if done {
                    kv.free(r.id);
                    live.remove(&r.id);
                    finished_ids.push(r.id);
                }
                !done
            });
        }
        outputs
    }

    /// Hands a finished step's output back so that the next `schedule()` reuses its buffers instead of allocating.
    /// Optional: dropping the output is equally correct.
    pub fn recycle(&mut self, out: SchedulerOutput) {
        if out.seqs.len() >= self.spare_seqs.len() {
            self.spare_seqs = out.seqs;
        }
    }

    /// Checks cross-structure invariants (for tests): KV manager invariants; each running request holds a table and
    /// each waiting one none; ids are unique; between steps a running request has at least one token left to compute
    /// and never more computed tokens than its blocks hold.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.kv.check_invariants()?;
        if self.running.len() + self.waiting.len() != self.live.len() {
            return Err(format!(
                "{} running + {} waiting != {} live ids",
                self.running.len(),
                self.waiting.len(),
                self.live.len()
            ));
        }
        if self.running.len() > self.cfg.max_num_seqs {
            return Err(format!("{} running > max_num_seqs {}", self.running.len(), self.cfg.max_num_seqs));
        }
        for r in &self.running {
            if r.status != RequestStatus::Running || !self.live.contains(&r.id) {
                return Err(format!("running {} has status {:?}", r.id, r.status));
            }
            let cap = self.kv.block_table(r.id).map_or(0, |t| t.len()) * self.cfg.block_size;
            // With no sample out, a request has a token left to compute; with samples out, it may be computed up
            // to the last placeholder.
            let known = r.num_tokens_with_placeholders();
            let ahead = if r.num_output_placeholders == 0 {
                r.num_computed_tokens >= known
            } else {
                r.num_computed_tokens > known
            };
            if ahead || r.num_computed_tokens > cap {
                return Err(format!(
                    "{}: {} computed of {} tokens, capacity {cap}",
                    r.id,
                    r.num_computed_tokens,
                    r.num_tokens()
                ));
            }
        }
        for r in &self.waiting {
            if r.status != RequestStatus::Waiting || r.num_computed_tokens != 0 || !self.live.contains(&r.id) {
                return Err(format!("waiting {}: {:?}, {} computed", r.id, r.status, r.num_computed_tokens));
            }
            if self.kv.block_table(r.id).is_some() {
                return Err(format!("waiting {} holds blocks", r.id));
            }
        }
        if self.kv.num_tables() != self.running.len() {
            return Err(format!("{} block tables for {} running", self.kv.num_tables(), self.running.len()));
        }
        Ok(())
    }
}

/// The entry at `*filled` of `seqs` (a recycled one, or a new empty one), advancing `*filled`.
fn next_seq<'a>(seqs: &'a mut Vec<ScheduledSeq>, filled: &mut usize) -> &'a mut ScheduledSeq {
    if *filled == seqs.len() {
        seqs.push(ScheduledSeq {
            request_id: RequestId(0),
            token_ids: Vec::new(),
            start_position: 0,
            block_tables: Vec::new(),
            num_blocks: 0,
            slot_mappings: Vec::new(),
            sample: false,
            num_cached_tokens: 0,
            is_first_schedule: false,
        });
    }
    *filled += 1;
    &mut seqs[*filled - 1]
}

/// Rewrites `s` with `req`'s next `num_new` tokens, whose slots `tables` (one per KV cache group) cover, reusing
/// `s`'s buffers (the outer vectors are sized to the group count on first use, the inner ones are refilled), and
/// advances the request past them. Positions whose ids are not back yet are [`TokenId::PLACEHOLDER`]. The tables go
/// whole on the request's first schedule, else only the blocks appended since its previous step.
fn fill_seq(s: &mut ScheduledSeq, req: &mut Request, tables: &[RequestBlocks], num_new: usize, block_size: usize) {
    let start = req.num_computed_tokens;
    let end = start + num_new;
    let first = std::mem::replace(&mut req.first_schedule_pending, false);
    let num_blocks = tables.first().map_or(0, |t| t.blocks().len());
    let sent = if first { 0 } else { req.blocks_sent.min(num_blocks) };
    let known = req.token_ids.len();
    s.request_id = req.id;
    s.token_ids.clear();
    s.token_ids.extend_from_slice(&req.token_ids[start.min(known)..end.min(known)]);
    s.token_ids.resize(num_new, TokenId::PLACEHOLDER);
    s.start_position = start;
    s.block_tables.resize_with(tables.len(), Vec::new);
    s.slot_mappings.resize_with(tables.len(), Vec::new);
    for ((table, slots), t) in s.block_tables.iter_mut().zip(s.slot_mappings.iter_mut()).zip(tables) {
        table.clear();
        table.extend_from_slice(&t.blocks()[sent..]);
        slots.clear();
        // The tokens computed sit at or after the first block the first query reads: never a null entry.
        push_slots(slots, t.blocks(), start..end, block_size);
    }
    s.num_blocks = num_blocks;
    req.blocks_sent = num_blocks;
    s.sample = end == req.num_tokens_with_placeholders();
    s.num_cached_tokens = req.num_cached_tokens.unwrap_or(0);
    s.is_first_schedule = first;
    req.num_computed_tokens = end;
    req.num_output_placeholders += usize::from(s.sample);
}

/// Index of running request `id`, searching forward from `from` first.
fn find_running(running: &[Request], from: usize, id: RequestId) -> Option<usize> {
    let from = from.min(running.len());
    running[from..]
        .iter()
        .position(|r| r.id == id)
        .map(|p| p + from)
        .or_else(|| running[..from].iter().position(|r| r.id == id))
}

/// The sampled token of `id`: the entry at `cursor` when the order matches (the common case), else a search.
fn find_sample(sampled: &[(RequestId, TokenId)], cursor: &mut usize, id: RequestId) -> Option<TokenId> {
    if let Some(&(sid, tok)) = sampled.get(*cursor) {
        if sid == id {
            *cursor += 1;
            return Some(tok);
        }
    }
    sampled.iter().find(|(sid, _)| *sid == id).map(|&(_, tok)| tok)
}
