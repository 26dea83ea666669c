//! Property tests of the scheduler under random arrivals, lengths, stop tokens and aborts, driven by the fake model
//! of `support`: no block leaks, reference counts match the block tables, no shared writable slot, every step within
//! the token budget and sequence cap, every request finishes, stop rules hold, and outputs do not depend on the cache
//! size, on preemption or on prefix caching. Half the workloads run under random partial-prefill limits, which
//! `check_step` checks in every step.

mod support;

use std::collections::{HashMap, HashSet};

use proptest::prelude::*;
use rserve_scheduler::{
    BlockTables, FinishStatus, PrefillLimits, RequestId, Scheduler, SchedulerConfig, SchedulerOutput, TokenId,
};
use support::{check_kept, check_step, new_request, record, resolve_placeholders, sample_step, Outcome};

/// Small vocabulary so that sampled tokens hit stop tokens now and then.
const VOCAB: u32 = 48;
const MAX_STEPS: usize = 50_000;

#[derive(Debug, Clone)]
struct Arrival {
    step: usize,
    /// 0 or 1: start with a prefix of that shared base sequence; 2: no shared prefix.
    base: usize,
    shared_len: usize,
    tail: Vec<u32>,
    max_tokens: usize,
    min_tokens: usize,
    stop: Option<u32>,
    /// Abort this many steps after arrival (if still unfinished); `mid_step` aborts between schedule and update.
    abort_after: Option<usize>,
    mid_step: bool,
}

#[derive(Debug, Clone)]
struct Workload {
    block_size: usize,
    max_model_len: usize,
    extra_blocks: usize,
    max_num_seqs: usize,
    extra_budget: usize,
    caching: bool,
    arrivals: Vec<Arrival>,
    /// (max_num_partial_prefills, max_long_partial_prefills, long_prefill_token_threshold), clamped to valid values.
    limits: Option<(Option<usize>, Option<usize>, usize)>,
}

fn arrival() -> impl Strategy<Value = Arrival> {
    (
        0usize..30,
        0usize..3,
        0usize..64,
        prop::collection::vec(0u32..VOCAB, 0..40),
        1usize..30,
        0usize..10,
        prop::option::of(0u32..VOCAB),
        prop::option::weighted(0.2, 0usize..20),
        any::<bool>(),
    )
        .prop_map(|(step, base, shared_len, tail, max_tokens, min_tokens, stop, abort_after, mid_step)| Arrival {
            step,
            base,
            shared_len,
            tail,
            max_tokens,
            min_tokens: min_tokens.min(max_tokens),
            stop,
            abort_after,
            mid_step,
        })
}

fn workload() -> impl Strategy<Value = Workload> {
    (
        prop::sample::select(vec![1usize, 2, 4, 8, 16]),
        4usize..64,
        0usize..8,
        1usize..8,
        0usize..48,
        any::<bool>(),
        prop::collection::vec(arrival(), 1..14),
        prop::option::of((prop::option::of(1usize..4), prop::option::of(1usize..4), 0usize..40)),
    )
        .prop_map(
            |(block_size, max_model_len, extra_blocks, max_num_seqs, extra_budget, caching, arrivals, limits)| {
                Workload {
                    block_size,
                    max_model_len,
                    extra_blocks,
                    max_num_seqs,
                    extra_budget,
                    caching,
                    arrivals,
                    limits,
                }
            },
        )
}

impl Workload {
    /// Smallest cache that holds one maximum-length request, plus `extra_blocks`.
    fn config(&self) -> SchedulerConfig {
        let mut c =
            SchedulerConfig::new(self.max_model_len.div_ceil(self.block_size) + self.extra_blocks, self.max_model_len);
        c.block_size = self.block_size;
        c.max_num_seqs = self.max_num_seqs;
        c.max_num_batched_tokens = self.max_num_seqs + self.extra_budget;
        c.enable_prefix_caching = self.caching;
        if let Some((all, long, threshold)) = self.limits {
            let long = match (all, long) {
                (Some(a), Some(l)) => Some(l.min(a)),
                _ => long,
            };
            c.prefill_limits =
                PrefillLimits::resolve(all, long, Some(threshold.min(self.max_model_len)), self.max_model_len)
                    .expect("clamped limits are valid");
        }
        c
    }

    fn prompt(&self, a: &Arrival) -> Vec<u32> {
        let mut p: Vec<u32> = match a.base {
            0 => (0..a.shared_len as u32).map(|t| t % VOCAB).collect(),
            1 => (0..a.shared_len as u32).map(|t| (t * 7 + 3) % VOCAB).collect(),
            _ => Vec::new(),
        };
        p.extend(&a.tail);
        p.truncate(self.max_model_len);
        if p.is_empty() {
            p.push(1);
        }
        p
    }
}

struct Run {
    outcomes: HashMap<RequestId, Outcome>,
    aborted: HashSet<RequestId>,
    preemptions: u64,
}

/// How the workload is driven.
#[derive(Debug, Clone, Copy)]
struct Drive {
    /// Apply the arrivals' aborts.
    aborts: bool,
    /// Hand every output back to the scheduler so later steps reuse its buffers.
    recycle: bool,
    /// Async scheduling: each step is scheduled before the previous step's output is applied (its samples are fed
    /// to the placeholders as a runner does on its device).
    ahead: bool,
}

/// Runs the workload to the end, checking every step.
fn run(w: &Workload, cfg: SchedulerConfig, d: Drive) -> Result<Run, String> {
    let Drive { aborts: with_aborts, recycle, ahead } = d;
    let mut sched = Scheduler::new(cfg).map_err(|e| e.to_string())?;
    let mut outcomes: HashMap<RequestId, Outcome> = HashMap::new();
    let mut aborted = HashSet::new();
    let mut arrived_at: HashMap<RequestId, usize> = HashMap::new();
    let last_arrival = w.arrivals.iter().map(|a| a.step).max().unwrap_or(0);
    // What a runner keeps of the block-table deltas: each scheduled request's whole tables, equal to the manager's.
    let mut kept = BlockTables::default();
    let mut in_flight: Option<(SchedulerOutput, Vec<(RequestId, TokenId)>)> = None;
    for step in 0..MAX_STEPS {
        for (k, a) in w.arrivals.iter().enumerate() {
            if a.step == step {
                let id = RequestId(k as u64);
                let stop = a.stop.into_iter().collect();
                sched
                    .add_request(new_request(id.0, w.prompt(a), a.max_tokens, a.min_tokens, stop))
                    .map_err(|e| e.to_string())?;
                arrived_at.insert(id, step);
                outcomes.insert(id, Outcome::default());
            }
        }
        let due = |mid: bool| -> Vec<RequestId> {
            if !with_aborts {
                return Vec::new();
            }
            w.arrivals
                .iter()
                .enumerate()
                .filter(|(_, a)| a.mid_step == mid && a.abort_after.is_some_and(|d| a.step + d == step))
                .map(|(k, _)| RequestId(k as u64))
                .collect()
        };
        for id in due(false) {
            if sched.abort(id) {
                aborted.insert(id);
            }
        }
        let out = sched.schedule();
        check_step(&sched, &out).map_err(|e| format!("step {step}: {e}"))?;
        check_kept(&sched, &out, &mut kept).map_err(|e| format!("step {step}: {e}"))?;
        let mid = due(true);
        for &id in &mid {
            if sched.abort(id) {
                aborted.insert(id);
            }
        }
        let samples_out: HashMap<RequestId, TokenId> = in_flight
            .as_ref()
            .map(|(_, s): &(SchedulerOutput, Vec<_>)| s.iter().copied().collect())
            .unwrap_or_default();
        let sampled = sample_step(&resolve_placeholders(&out, &samples_out)?, VOCAB);
        if sampled.len() != out.num_samples() {
            return Err("sample count mismatch".into());
        }
        // Without async scheduling a step's output is applied before the next is scheduled; with it, the previous
        // step's output is applied now, while this one is "on the device".
        let (applied, applied_samples) = match ahead {
            false => (out, sampled),
            true => match in_flight.replace((out, sampled)) {
                Some(prev) => prev,
                None => continue,
            },
        };
        let results = sched.update_from_output(&applied, &applied_samples);
        if let Some(r) = results.iter().find(|r| aborted.contains(&r.request_id)) {
            return Err(format!("step {step}: output for aborted {}", r.request_id));
        }
        record(&results, &mut outcomes)?;
        if recycle {
            sched.recycle(applied);
        }
        sched.check_invariants().map_err(|e| format!("step {step} after update: {e}"))?;
        if ahead && !sched.has_unfinished() {
            // The step still in flight computes only for ended requests: its output changes nothing.
            if let Some((out, sampled)) = in_flight.take() {
                if !sched.update_from_output(&out, &sampled).is_empty() {
                    return Err(format!("step {step}: output after every request ended"));
                }
            }
        }
        if step >= last_arrival && !sched.has_unfinished() {
            let st = sched.stats();
            if st.num_blocks_used != 0 || st.num_blocks_free != st.num_blocks_total {
                return Err(format!("blocks leaked after all requests ended: {st:?}"));
            }
            if st.num_running + st.num_waiting != 0 {
                return Err(format!("requests left: {st:?}"));
            }
            // The next step tells the runner of the last ends.
            kept.forget(sched.schedule().finished_ids);
            if !kept.is_empty() {
                return Err(format!("the runner keeps the tables of {} ended requests", kept.len()));
            }
            return Ok(Run { outcomes, aborted, preemptions: st.num_preemptions });
        }
    }
    Err(format!("requests did not finish within {MAX_STEPS} steps: {:?}", sched.stats()))
}

/// Finish rules for every request that was not aborted.
fn check_outcomes(w: &Workload, r: &Run) -> Result<(), String> {
    for (k, a) in w.arrivals.iter().enumerate() {
        let id = RequestId(k as u64);
        if r.aborted.contains(&id) {
            continue;
        }
        let o = &r.outcomes[&id];
        let prompt_len = w.prompt(a).len();
        let n = o.tokens.len();
        if n == 0 || n > a.max_tokens {
            return Err(format!("{id}: {n} tokens for max_tokens {}", a.max_tokens));
        }
        // The first eligible stop token must end the request; none may appear earlier (from min_tokens on).
        let first_stop = o.tokens.iter().enumerate().position(|(i, t)| i + 1 >= a.min_tokens && Some(t.0) == a.stop);
        let length_hit = n == a.max_tokens || prompt_len + n >= w.max_model_len;
        match o.finish {
            None => return Err(format!("{id} never finished")),
            Some(FinishStatus::Length) => {
                if !length_hit {
                    return Err(format!("{id}: Length after {n} tokens (prompt {prompt_len})"));
                }
                if first_stop.is_some_and(|i| i + 1 < n) {
                    return Err(format!("{id}: ran past a stop token"));
                }
            }
            Some(FinishStatus::StopToken(t)) => {
                if Some(t.0) != a.stop || first_stop != Some(n - 1) || length_hit {
                    return Err(format!("{id}: StopToken({t}) with tokens {:?}, {a:?}", o.tokens));
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_under_random_traffic(w in workload()) {
        let r = run(&w, w.config(), Drive { aborts: true, recycle: w.caching, ahead: false }).map_err(TestCaseError::fail)?;
        check_outcomes(&w, &r).map_err(TestCaseError::fail)?;
        let r = run(&w, w.config(), Drive { aborts: true, recycle: w.caching, ahead: true }).map_err(TestCaseError::fail)?;
        check_outcomes(&w, &r).map_err(TestCaseError::fail)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Without aborts, every request's tokens equal those of a run on a cache large enough that nothing is ever
    /// preempted, with prefix caching off.
    #[test]
    fn outputs_do_not_depend_on_cache_size_preemption_or_caching(w in workload()) {
        let tight = run(&w, w.config(), Drive { aborts: false, recycle: true, ahead: false }).map_err(TestCaseError::fail)?;
        check_outcomes(&w, &tight).map_err(TestCaseError::fail)?;
        let mut roomy_cfg = w.config();
        roomy_cfg.num_blocks = w.arrivals.len() * w.max_model_len.div_ceil(w.block_size) + 1;
        roomy_cfg.enable_prefix_caching = false;
        let roomy = run(&w, roomy_cfg, Drive { aborts: false, recycle: false, ahead: false }).map_err(TestCaseError::fail)?;
        prop_assert_eq!(roomy.preemptions, 0);
        // Async scheduling (one step ahead, tight cache) computes the same tokens.
        let ahead = run(&w, w.config(), Drive { aborts: false, recycle: true, ahead: true }).map_err(TestCaseError::fail)?;
        for k in 0..w.arrivals.len() {
            let id = RequestId(k as u64);
            prop_assert_eq!(&tight.outcomes[&id], &roomy.outcomes[&id], "request {}", id);
            prop_assert_eq!(&ahead.outcomes[&id], &roomy.outcomes[&id], "request {} (async scheduling)", id);
        }
    }
}

/// The random workloads above must actually exercise preemption and prefix hits; this fixed one checks that the
/// harness sees both (so the properties are not vacuous).
#[test]
fn harness_sees_preemptions_and_prefix_hits() {
    let arrivals = (0..6)
        .map(|k| Arrival {
            step: k,
            base: k % 2,
            shared_len: 20,
            tail: vec![k as u32; 3],
            max_tokens: 20,
            min_tokens: 0,
            stop: None,
            abort_after: None,
            mid_step: false,
        })
        .collect();
    let w = Workload {
        block_size: 4,
        max_model_len: 48,
        extra_blocks: 2,
        max_num_seqs: 4,
        extra_budget: 8,
        caching: true,
        arrivals,
        limits: None,
    };
    let r = run(&w, w.config(), Drive { aborts: false, recycle: true, ahead: false }).unwrap();
    check_outcomes(&w, &r).unwrap();
    assert!(r.preemptions > 0);
    let r = run(&w, w.config(), Drive { aborts: false, recycle: true, ahead: true }).unwrap();
    check_outcomes(&w, &r).unwrap();
    assert!(r.preemptions > 0, "async scheduling preempts too");
    let mut sched = Scheduler::new(w.config()).unwrap();
    sched.add_request(new_request(0, w.prompt(&w.arrivals[0]), 1, 0, vec![])).unwrap();
    while sched.has_unfinished() {
        let out = sched.schedule();
        let s = sample_step(&out, VOCAB);
        sched.update_from_output(&out, &s);
    }
    sched.add_request(new_request(2, w.prompt(&w.arrivals[2]), 1, 0, vec![])).unwrap();
    let out = sched.schedule();
    assert_eq!(out.seqs[0].start_position, 20, "arrivals 0 and 2 share 20 tokens = 5 full blocks");
}
