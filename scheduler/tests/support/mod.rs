//! Shared test harness: a fake "model" whose next token depends only on the last token and its position (so results
//! do not depend on chunking, batching or preemption), a driver that runs one scheduler step, and per-step checks.
#![allow(dead_code)]

use std::collections::{HashMap, HashSet};

use rserve_scheduler::{
    BlockId, BlockTables, FinishStatus, NewRequest, RequestId, RequestOutput, Scheduler, SchedulerOutput, TokenId,
};

/// Next token of the fake model: a mix of the last computed token and its position, reduced to `vocab`.
pub fn fake_token(last: TokenId, position: usize, vocab: u32) -> TokenId {
    let mut x = (u64::from(last.0) << 32) ^ position as u64 ^ 0x5851_F42D_4C95_7F2D;
    x ^= x >> 33;
    x = x.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    x ^= x >> 33;
    TokenId((x % u64::from(vocab)) as u32)
}

/// The fake model's samples for a step: one per seq with `sample`, from the seq's last token and position.
pub fn sample_step(out: &SchedulerOutput, vocab: u32) -> Vec<(RequestId, TokenId)> {
    out.seqs
        .iter()
        .filter(|s| s.sample)
        .map(|s| {
            let last = *s.token_ids.last().expect("scheduled seqs have tokens");
            (s.request_id, fake_token(last, s.start_position + s.token_ids.len() - 1, vocab))
        })
        .collect()
}

/// The step as a runner computes it one step behind the scheduler (async scheduling): each
/// [`TokenId::PLACEHOLDER`] is the token its request sampled in the step still in flight (`in_flight`), as a runner
/// feeds it on its device. Fails for a placeholder without one.
pub fn resolve_placeholders(
    out: &SchedulerOutput,
    in_flight: &HashMap<RequestId, TokenId>,
) -> Result<SchedulerOutput, String> {
    let mut resolved = out.clone();
    for s in &mut resolved.seqs {
        for t in s.token_ids.iter_mut().filter(|t| **t == TokenId::PLACEHOLDER) {
            *t = *in_flight
                .get(&s.request_id)
                .ok_or(format!("{}: a placeholder and no sample in flight", s.request_id))?;
        }
    }
    Ok(resolved)
}

/// Token ids from bare numbers.
pub fn toks(ids: impl IntoIterator<Item = u32>) -> Vec<TokenId> {
    ids.into_iter().map(TokenId).collect()
}

/// A request with prompt and stop tokens given as bare numbers.
pub fn new_request(id: u64, prompt: Vec<u32>, max_tokens: usize, min_tokens: usize, stop: Vec<u32>) -> NewRequest {
    NewRequest {
        id: RequestId(id),
        prompt_token_ids: toks(prompt),
        max_tokens,
        min_tokens,
        stop_token_ids: toks(stop),
        skip_prefix_cache: false,
        whole_prompt: false,
    }
}

/// Checks one step's output against the scheduler's limits and the KV cache: the token budget and sequence cap, one
/// block table and slot mapping per KV cache group, equal to the manager's tables, slot mappings that follow them and
/// never point into the null block, the partial-prefill limits, and that no slot written this step is shared (by two seqs, two groups or by a
/// block another request references).
pub fn check_step(sched: &Scheduler, out: &SchedulerOutput) -> Result<(), String> {
    let cfg = sched.config();
    let bs = cfg.block_size;
    let total: usize = out.seqs.iter().map(|s| s.token_ids.len()).sum();
    if total != out.num_batched_tokens {
        return Err(format!("num_batched_tokens {} != sum {}", out.num_batched_tokens, total));
    }
    if total > cfg.max_num_batched_tokens {
        return Err(format!("{total} tokens > max_num_batched_tokens {}", cfg.max_num_batched_tokens));
    }
    if out.seqs.len() > cfg.max_num_seqs {
        return Err(format!("{} seqs > max_num_seqs {}", out.seqs.len(), cfg.max_num_seqs));
    }
    check_prefill_limits(sched, out)?;
    let mut ids = HashSet::new();
    let mut slots_seen = HashSet::new();
    for s in &out.seqs {
        if !ids.insert(s.request_id) {
            return Err(format!("{} scheduled twice", s.request_id));
        }
        let groups = sched.config().kv_groups.len();
        if s.block_tables.len() != groups || s.slot_mappings.len() != groups {
            return Err(format!(
                "{}: {} tables, {} slot mappings for {groups} groups",
                s.request_id,
                s.block_tables.len(),
                s.slot_mappings.len()
            ));
        }
        if s.token_ids.is_empty() {
            return Err(format!("{}: no tokens", s.request_id));
        }
        if s.start_position + s.token_ids.len() > cfg.max_model_len {
            return Err(format!("{}: positions past max_model_len", s.request_id));
        }
        let tables = sched.kv_cache().block_tables(s.request_id).ok_or("scheduled request without blocks")?;
        let null = sched.kv_cache().null_block();
        for (g, (table, slots)) in s.block_tables.iter().zip(&s.slot_mappings).enumerate() {
            if slots.len() != s.token_ids.len() {
                return Err(format!("{} group {g}: {} tokens, {} slots", s.request_id, s.token_ids.len(), slots.len()));
            }
            // A first schedule sends the whole table, later steps the entries appended since the previous one.
            let whole = tables[g].blocks();
            let sent = if s.is_first_schedule { whole } else { &whole[whole.len().saturating_sub(table.len())..] };
            if s.num_blocks != whole.len() || sent != table.as_slice() || table.len() != s.block_tables[0].len() {
                return Err(format!("{} group {g}: block table differs from the manager's", s.request_id));
            }
            for (k, &slot) in slots.iter().enumerate() {
                let p = s.start_position + k;
                let block = whole[p / bs];
                if Some(block) == null {
                    return Err(format!("{} group {g}: position {p} computed into the null block", s.request_id));
                }
                let want = block.0 * bs as u32 + (p % bs) as u32;
                if slot != want {
                    return Err(format!("{} group {g}: slot {slot} at position {p}, expected {want}", s.request_id));
                }
                // Slots are unique across groups too: a block belongs to one group's table at a time.
                if !slots_seen.insert(slot) {
                    return Err(format!("slot {slot} written twice in one step"));
                }
                let rc = sched.kv_cache().pool().ref_count(BlockId(slot / bs as u32));
                if rc != 1 {
                    return Err(format!("{}: writes slot {slot} of a block with {rc} references", s.request_id));
                }
            }
        }
    }
    let st = sched.stats();
    if st.num_blocks_used + st.num_blocks_free != st.num_blocks_total {
        return Err(format!("{st:?}: used + free != total"));
    }
    sched.check_invariants()
}

/// The partial-prefill limits of the config in one step (call between `schedule()` and `update_from_output()`): at
/// most `max_num_partial_prefills` seqs of requests with more than one token left, at most
/// `max_long_partial_prefills` of them with a prompt above the threshold, no prefill chunk above the threshold.
pub fn check_prefill_limits(sched: &Scheduler, out: &SchedulerOutput) -> Result<(), String> {
    let limits = sched.config().prefill_limits;
    let (mut prefills, mut long) = (0, 0);
    for s in &out.seqs {
        let req = sched.request(s.request_id).ok_or_else(|| format!("{} scheduled but not live", s.request_id))?;
        let remaining = req.num_tokens() - s.start_position;
        if remaining <= 1 {
            continue;
        }
        prefills += 1;
        long += usize::from(limits.is_long(req.num_prompt_tokens()));
        if s.token_ids.len() > limits.max_chunk() {
            return Err(format!(
                "{}: prefill chunk of {} > threshold {}",
                s.request_id,
                s.token_ids.len(),
                limits.max_chunk()
            ));
        }
    }
    if limits.max_num_partial_prefills.is_some_and(|m| prefills > m) {
        return Err(format!("{prefills} prefills in one step, limit {limits:?}"));
    }
    if limits.max_long_partial_prefills.is_some_and(|m| long > m) {
        return Err(format!("{long} long prefills in one step, limit {limits:?}"));
    }
    Ok(())
}

/// What happened to one request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    pub tokens: Vec<TokenId>,
    pub finish: Option<FinishStatus>,
}

/// Runs one checked step with the fake model; records outputs into `outcomes`.
pub fn step(
    sched: &mut Scheduler,
    vocab: u32,
    outcomes: &mut HashMap<RequestId, Outcome>,
) -> Result<SchedulerOutput, String> {
    let out = sched.schedule();
    check_step(sched, &out)?;
    let sampled = sample_step(&out, vocab);
    let results = sched.update_from_output(&out, &sampled);
    record(&results, outcomes)?;
    sched.check_invariants()?;
    Ok(out)
}

pub fn record(results: &[RequestOutput], outcomes: &mut HashMap<RequestId, Outcome>) -> Result<(), String> {
    for r in results {
        let o = outcomes.entry(r.request_id).or_default();
        if o.finish.is_some() {
            return Err(format!("{} produced output after finishing", r.request_id));
        }
        if let Some(t) = r.new_token {
            o.tokens.push(t);
        }
        o.finish = r.finished;
    }
    Ok(())
}

/// Applies a step's block-table deltas to `kept` (after forgetting the requests that ended or were preempted) and
/// checks each scheduled request's kept tables against the manager's: equal, but where the manager has since
/// replaced an entry that left a sliding window with the null block.
pub fn check_kept(sched: &Scheduler, out: &SchedulerOutput, kept: &mut BlockTables) -> Result<(), String> {
    kept.forget(out.finished_ids.iter().chain(&out.preempted).copied());
    kept.apply(&out.seqs).map_err(|e| e.to_string())?;
    let null = sched.kv_cache().null_block();
    for s in &out.seqs {
        let whole = sched.kv_cache().block_tables(s.request_id).ok_or("scheduled request without blocks")?;
        let tables = kept.of(s);
        if tables.len() != whole.len() {
            return Err(format!("{}: {} groups kept for {}", s.request_id, tables.len(), whole.len()));
        }
        for (g, (k, w)) in tables.iter().zip(whole).enumerate() {
            let same = k.len() == w.len() && k.iter().zip(w.blocks()).all(|(a, b)| a == b || Some(*b) == null);
            if !same {
                return Err(format!("{} group {g}: kept {k:?}, the manager has {:?}", s.request_id, w.blocks()));
            }
        }
    }
    Ok(())
}
