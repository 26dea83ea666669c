//! The device-neutral op layer: each `Op` as launches of the portable kernels of `rserve-kernels`, written once for
//! every backend that launches them (OpenCL, Level Zero, CUDA). For each op it checks every buffer and every index a
//! kernel follows on the host (token ids, slots, rows, block tables), picks the entry point (by element type, from
//! the tables of `rserve_kernels::names`) and the variant (from the device's `KernelTuning`), and builds the
//! `Launch`: arguments in the order the kernel source declares them, the grid (work-items per dimension, as the
//! comment at the top of each `kernels/src/cl/*.cl` says) and the work-group size (`rserve_kernels::work_group`).
//!
//! A backend implements only `KernelDevice`: how it describes a buffer, allocates scratch, uploads indices and
//! enqueues one launch. CUDA adds one hook, `vendor_matmul` (cuBLAS), taken where the tuning says `Vendor`.
//!
//! The attention work split (`attention.rs`) depends only on the batch's rows and its partition count, so one plan
//! serves every layer of a step and every decode step of a batch until the partition count changes.

mod attention;
mod contents;
mod encoder;
mod matmul;
mod moe;
mod ops;
mod sampling;
mod tuning;

use std::cell::{Cell, RefCell};

pub use attention::{split_work, AttnPlan};
pub use contents::{elem_type, kv_pair, weight_data, with_matrix_bytes, Contents, WeightData};
pub use matmul::{check as matmul_check, MatMulCall};
pub use tuning::{KernelTuning, MatmulPath, Partition, TuningCell};

use crate::cpu::be;
use crate::error::Result;
use crate::Op;

/// One kernel argument.
#[derive(Debug)]
pub enum Arg<'a, B> {
    Buf(&'a B),
    U32(u32),
    F32(f32),
}

/// One launch: `global` work-items per dimension (dimension 0 a multiple of `local`), work-groups of `local`
/// work-items in dimension 0 (and 1 in the others). A grid with a zero dimension launches nothing.
#[derive(Debug)]
pub struct Launch<'a, B> {
    pub kernel: &'static str,
    pub args: Vec<Arg<'a, B>>,
    pub global: [usize; 3],
    pub local: usize,
}

impl<'a, B> Launch<'a, B> {
    /// A launch of `kernel` in its own work-group size (`rserve_kernels::work_group`) over `groups` work-groups in
    /// dimension 0 and `rest` in the others.
    pub fn groups(kernel: &'static str, args: Vec<Arg<'a, B>>, groups: usize, rest: [usize; 2]) -> Self {
        let local = rserve_kernels::work_group(kernel);
        Self { kernel, args, global: [groups * local, rest[0], rest[1]], local }
    }

    /// A launch of `kernel` over at least `items` work-items in dimension 0 (rounded up to whole work-groups).
    pub fn items(kernel: &'static str, args: Vec<Arg<'a, B>>, items: usize, rest: [usize; 2]) -> Self {
        let local = rserve_kernels::work_group(kernel);
        Self::groups(kernel, args, items.div_ceil(local), rest)
    }
}

/// A u32 kernel argument, refused when it does not fit.
pub fn u32_arg<'a, B>(v: usize, kernel: &str, what: &str) -> Result<Arg<'a, B>> {
    u32::try_from(v).map(Arg::U32).map_err(|_| be(format!("{kernel}: {what} = {v} does not fit in 32 bits")))
}

/// Buffer arguments, then u32 arguments (each named for the error when it does not fit in 32 bits).
pub fn arg_list<'a, B>(kernel: &str, bufs: &[&'a B], nums: &[(usize, &str)]) -> Result<Vec<Arg<'a, B>>> {
    let mut args: Vec<_> = bufs.iter().map(|b| Arg::Buf(*b)).collect();
    for &(v, what) in nums {
        args.push(u32_arg(v, kernel, what)?);
    }
    Ok(args)
}

/// The attention plan a device keeps between ops, and how often it was built (a plan is reused by every layer of
/// a step and by every decode step of a batch until its rows or partition count change).
pub struct PlanCache<B> {
    plan: RefCell<Option<AttnPlan<B>>>,
    builds: Cell<u64>,
}

impl<B> Default for PlanCache<B> {
    fn default() -> Self {
        Self { plan: RefCell::new(None), builds: Cell::new(0) }
    }
}

impl<B> PlanCache<B> {
    /// Plans built so far.
    pub fn builds(&self) -> u64 {
        self.builds.get()
    }

    /// Takes the current plan (a captured CUDA graph keeps the plan it reads).
    pub fn take(&self) -> Option<AttnPlan<B>> {
        self.plan.borrow_mut().take()
    }
}

/// What a backend provides to run the kernels.
pub trait KernelDevice {
    type Buf;
    /// What `b` holds.
    fn contents<'b>(&self, b: &'b Self::Buf) -> &'b Contents;
    /// An f32 buffer the kernels overwrite before reading.
    fn scratch_f32(&self, len: usize) -> Result<Self::Buf>;
    /// A u32 buffer holding `data` (with its host copy).
    fn upload_indices(&self, data: &[u32]) -> Result<Self::Buf>;
    /// Appends one launch; launches run in the order they are appended.
    fn launch(&self, l: &Launch<'_, Self::Buf>) -> Result<()>;
    /// Where the current attention plan is kept.
    fn plans(&self) -> &PlanCache<Self::Buf>;
    /// The device's variant choices.
    fn tuning(&self) -> KernelTuning;
    /// The device library's matrix multiply (`MatmulPath::Vendor`).
    fn vendor_matmul(&self, call: &MatMulCall<'_, Self::Buf>) -> Result<()> {
        let _ = call;
        Err(be("matmul: this device has no vendor matrix multiply"))
    }
}

/// Runs `op` as kernel launches on `d`.
pub fn run<D: KernelDevice>(d: &D, op: Op<'_, D::Buf>) -> Result<()> {
    match op {
        Op::Embedding { table, ids, out, num_tokens, hidden, scale } => {
            ops::embedding(d, table, ids, out, [num_tokens, hidden], scale)
        }
        Op::RmsNorm { x, weight, out, rows, hidden, eps } => {
            ops::rms_norm(d, x, None, weight, out, [rows, hidden], eps)
        }
        Op::AddRmsNorm { x, residual, weight, out, rows, hidden, eps } => {
            ops::rms_norm(d, x, Some(residual), weight, out, [rows, hidden], eps)
        }
        Op::MatMul { x, w, bias, out, m, k, n } => matmul::matmul(d, &MatMulCall { x, w, bias, out, m, k, n }),
        Op::RopeWriteKv { io, qk_norm, num_tokens, num_heads, num_kv_heads, head_dim, block_size: _, mscale } => {
            ops::rope_write_kv(d, &io, qk_norm.as_ref(), num_tokens, [num_heads, num_kv_heads, head_dim], mscale)
        }
        Op::GatedAct { gate_up, out, rows, width, act } => ops::gated_act(d, gate_up, out, [rows, width], act),
        Op::SoftCap { x, rows, width, cap } => ops::soft_cap(d, x, [rows, width], cap),
        Op::GatherRows { x, rows, out, num_rows, width } => ops::gather_rows(d, x, rows, out, num_rows, width),
        Op::LayerNorm { x, residual, weight, bias, out, rows, hidden, eps } => {
            encoder::layer_norm(d, [x, weight, bias, out], residual, [rows, hidden], eps)
        }
        Op::Gelu { x, out, len } => encoder::gelu(d, x, out, len),
        Op::EncoderAttention { qkv, query_start, out, num_seqs, num_tokens, num_heads, head_dim, scale } => {
            encoder::encoder_attention(d, [qkv, query_start, out], [num_seqs, num_tokens, num_heads, head_dim], scale)
        }
        Op::FeedTokens { ids, prev, from, count, prev_len } => ops::feed_tokens(d, [ids, prev, from], count, prev_len),
        Op::MaskLogits { logits, mask, rows, vocab } => ops::mask_logits(d, logits, mask, rows, vocab),
        Op::AdjustLogits { logits, edits, values, count, rows, vocab } => {
            sampling::adjust_logits(d, [logits, edits, values], [count, rows, vocab])
        }
        Op::ArgmaxRows { x, out, rows, width } => sampling::argmax_rows(d, [x, out], [rows, width]),
        Op::SampleRows { logits, params, ids, rows, vocab } => {
            sampling::sample_rows(d, [logits, params, ids], [rows, vocab])
        }
        Op::RowLogprobs { logits, ids, want, values, top_ids, rows, vocab } => {
            sampling::row_logprobs(d, [logits, ids, want, values, top_ids], [rows, vocab])
        }
        Op::MoeRoute { logits, ids, weights, rows, experts, top_k, renormalize } => {
            moe::route(d, [logits, ids, weights], [rows, experts, top_k], renormalize)
        }
        Op::MoeAlign { ids, tiles, pairs, experts, first_expert } => {
            moe::align(d, ids, tiles, pairs, [experts, first_expert])
        }
        Op::MoeMatMul { x, w, tiles, input, out, k, n } => moe::matmul(d, [x, w, out], tiles, input, [k, n]),
        Op::MoeBias { x, bias, tiles, width } => moe::bias(d, [x, bias], tiles, width),
        Op::MoeCombine { y, tiles, weights, out, rows, top_k, width } => {
            moe::combine(d, [y, weights, out], tiles, [rows, top_k, width])
        }
        Op::MoePairGateUp { x, w, bias, ids, out, tokens, top_k, k, width, held, act } => {
            moe::pair_gate_up(d, &moe::PairCall { x, w, bias, ids, out, tokens, top_k, k, n: width, held }, act)
        }
        Op::MoePairDown { x, w, bias, ids, weights, out, tokens, top_k, k, n, held } => {
            moe::pair_down(d, &moe::PairCall { x, w, bias, ids, out, tokens, top_k, k, n, held }, weights)
        }
        Op::PagedAttention { q, k_cache, v_cache, out, meta, shape, sinks } => {
            attention::paged_attention(d, [q, k_cache, v_cache, out], sinks, meta, &shape)
        }
    }
}
