//! Async scheduling in the runner: a step launched while the step before it is still in flight, its
//! `TokenId::PLACEHOLDER` ids fed from that step's chosen ids on the device (`Op::FeedTokens`), chooses the same
//! tokens as the same steps run one after the other with the ids from the host. SmolLM2 (float32), three sequences
//! (a prefill, then decode steps), greedy and seeded sampled rows, on the CPU and on OpenCL (Intel's CPU runtime).

mod backends;
mod common;

use common::smollm2::load_f32 as load;
use rserve_engine::backend::cpu::CpuBackend;
use rserve_engine::backend::Backend;
use rserve_engine::model::{BlockId, ScheduledSeq, TokenId};
use rserve_engine::runner::{Launch, ModelRunner, StepRunner};
use rserve_engine::sampling::{RowParams, SampledRows, StepSampling};
use rserve_scheduler::RequestId;

const BS: usize = 16;
const STEPS: usize = 12;
const PROMPTS: [&[u32]; 3] = [&[1, 504, 3458, 282], &[1, 2683, 314, 260, 1345], &[1, 28, 29, 30, 31, 32]];

/// Sequence `i`'s tokens at `start..`, in its own two blocks (whole tables every step).
fn seq(i: usize, tokens: Vec<TokenId>, start: usize) -> ScheduledSeq {
    let mut s = ScheduledSeq::new(tokens, start, BlockId::run(2 * i as u32, 2), BS);
    s.request_id = RequestId(i as u64 + 1);
    s
}

/// Row 0 greedy, rows 1 and 2 sampled with their own seeds, at output place `place`.
fn sampling(place: u64) -> StepSampling {
    let rows = [
        RowParams::GREEDY,
        RowParams { temperature: 0.9, top_p: 0.95, seed: 11, position: place, ..RowParams::GREEDY },
        RowParams { temperature: 1.0, seed: 12, position: place, ..RowParams::GREEDY },
    ];
    StepSampling { params: rows.iter().flat_map(|r| r.pack()).collect(), ..Default::default() }
}

/// Step `k` of the three sequences: the prompts (k = 0), else the token each chose in step k - 1 (`last`), or a
/// placeholder for it.
fn step(k: usize, last: Option<&[u32]>) -> Vec<ScheduledSeq> {
    (0..3)
        .map(|i| match k {
            0 => seq(i, PROMPTS[i].iter().copied().map(TokenId).collect(), 0),
            _ => {
                let t = last.map_or(TokenId::PLACEHOLDER, |l| TokenId(l[i]));
                seq(i, vec![t], PROMPTS[i].len() + k - 1)
            }
        })
        .collect()
}

fn run<B: Backend>(r: &mut ModelRunner<B>, k: usize, batch: &[ScheduledSeq]) -> Launch
where
    ModelRunner<B>: StepRunner,
{
    r.launch(batch, &sampling(k as u64)).unwrap()
}

/// Each step launched and collected before the next (ids from the host).
fn one_after_another<B: Backend>(r: &mut ModelRunner<B>) -> Vec<Vec<u32>>
where
    ModelRunner<B>: StepRunner,
{
    let mut out: Vec<Vec<u32>> = Vec::new();
    for k in 0..STEPS {
        let rows = match run(r, k, &step(k, out.last().map(Vec::as_slice))) {
            Launch::Done(rows) => rows,
            Launch::Running => r.collect(&sampling(k as u64)).unwrap(),
        };
        out.push(rows.ids);
    }
    out
}

/// Step k + 1 launched before step k is collected, its ids placeholders.
fn overlapped<B: Backend>(r: &mut ModelRunner<B>) -> Vec<Vec<u32>>
where
    ModelRunner<B>: StepRunner,
{
    assert!(r.overlaps());
    let mut out: Vec<Vec<u32>> = Vec::new();
    let mut in_flight: Option<usize> = None;
    let take = |rows: SampledRows, out: &mut Vec<Vec<u32>>| out.push(rows.ids);
    for k in 0..STEPS {
        // With the step before in flight its ids are placeholders; else they are known.
        let last = if in_flight.is_some() { None } else { out.last().map(Vec::as_slice) };
        let batch = step(k, last);
        let launched = run(r, k, &batch);
        if let Some(j) = in_flight.take() {
            take(r.collect(&sampling(j as u64)).unwrap(), &mut out);
        }
        match launched {
            Launch::Done(rows) => take(rows, &mut out),
            Launch::Running => in_flight = Some(k),
        }
    }
    if let Some(j) = in_flight {
        take(r.collect(&sampling(j as u64)).unwrap(), &mut out);
    }
    out
}

fn check<B: Backend>(make: impl Fn() -> ModelRunner<B>)
where
    ModelRunner<B>: StepRunner,
{
    let want = one_after_another(&mut make());
    let got = overlapped(&mut make());
    assert_eq!(got.len(), STEPS);
    assert_eq!(got, want, "fed on the device vs from the host");
    // The sampled rows vary (not a constant stream that any feed would reproduce).
    assert!(want.iter().map(|ids| ids[1]).collect::<std::collections::HashSet<_>>().len() > 3, "{want:?}");
}

#[test]
fn placeholders_fed_on_the_cpu_choose_the_same_tokens() {
    let (params, weights) = load();
    check(|| ModelRunner::new(CpuBackend::new(), &params, &weights, 8, BS).unwrap());
}

#[test]
fn placeholders_fed_on_opencl_choose_the_same_tokens() {
    let Some(_) = backends::opencl() else { return };
    let (params, weights) = load();
    check(|| ModelRunner::new(backends::opencl().unwrap(), &params, &weights, 8, BS).unwrap());
}

#[test]
fn a_placeholder_without_a_step_in_flight_is_an_error() {
    let (params, weights) = load();
    let mut r = ModelRunner::new(CpuBackend::new(), &params, &weights, 8, BS).unwrap();
    let e = r.launch(&step(1, None), &sampling(1)).unwrap_err();
    assert!(e.to_string().contains("no launched step samples"), "{e}");
}
