//! Routed experts (`kernels/src/cl/moe.cl`): checks, entry points, arguments and grids of `Op::MoeRoute`,
//! `MoeAlign`, `MoeMatMul`, `MoeCombine`, `MoeBias`, and the ungrouped `MoePairGateUp` and `MoePairDown`.
//!
//! The index buffers these ops pass between them are written on the device (`Contents::U32` with an unknown bound),
//! so the host checks their lengths and the kernels bound what they follow: a row or tile marked `MOE_NONE` is
//! skipped, an expert id outside the experts gets no slot, an input row past `x` and a slot past the tiles are
//! skipped.

use rserve_kernels::launch::{
    GEMM_TILE_M, GEMM_TILE_N, MOE_MAX_EXPERTS, MOE_MAX_TOP_K, MOE_PAIR_COLS, MOE_PAIR_ROWS, MOE_TILE_M,
};
use rserve_kernels::names;

use super::contents::elem_type;
use super::{arg_list, u32_arg, Arg, KernelDevice, Launch};
use crate::cpu::be;
use crate::error::Result;
use crate::{Activation, HeldExperts, MoeInput, MoeTiles};

pub(super) fn route<D: KernelDevice>(
    d: &D,
    [logits, ids, weights]: [&D::Buf; 3],
    [rows, experts, top_k]: [usize; 3],
    renormalize: bool,
) -> Result<()> {
    if experts == 0 || top_k == 0 || top_k > experts || top_k > MOE_MAX_TOP_K || experts > MOE_MAX_EXPERTS {
        return Err(be(format!(
            "moe_route: top {top_k} of {experts} experts (at most {MOE_MAX_TOP_K} of {MOE_MAX_EXPERTS})"
        )));
    }
    d.contents(logits).f32("moe_route logits", rows * experts)?;
    d.contents(ids).u32("moe_route ids", rows * top_k)?;
    d.contents(weights).f32("moe_route weights", rows * top_k)?;
    let kernel = names::MOE_ROUTE;
    let mut args =
        arg_list(kernel, &[logits, ids, weights], &[(rows, "rows"), (experts, "experts"), (top_k, "top_k")])?;
    args.push(Arg::U32(u32::from(renormalize)));
    d.launch(&Launch::groups(kernel, args, rows, [1, 1]))
}

/// Checks the tile buffers for `pairs` pairs (the slots) and returns the rows they cover.
fn check_tiles<D: KernelDevice>(d: &D, t: &MoeTiles<'_, D::Buf>, pairs: usize, what: &str) -> Result<usize> {
    let rows = t.max_tiles * MOE_TILE_M;
    d.contents(t.sorted).u32(&format!("{what} sorted rows"), rows)?;
    d.contents(t.tile_expert).u32(&format!("{what} tile experts"), t.max_tiles)?;
    d.contents(t.slot).u32(&format!("{what} slots"), pairs)?;
    Ok(rows)
}

pub(super) fn align<D: KernelDevice>(
    d: &D,
    ids: &D::Buf,
    tiles: &MoeTiles<'_, D::Buf>,
    pairs: usize,
    [experts, first_expert]: [usize; 2],
) -> Result<()> {
    if experts == 0 || experts > MOE_MAX_EXPERTS {
        return Err(be(format!("moe_align: {experts} experts (at most {MOE_MAX_EXPERTS})")));
    }
    d.contents(ids).u32("moe_align ids", pairs)?;
    check_tiles(d, tiles, pairs, "moe_align")?;
    let kernel = names::MOE_ALIGN;
    let args = arg_list(
        kernel,
        &[ids, tiles.sorted, tiles.tile_expert, tiles.slot],
        &[(pairs, "pairs"), (experts, "experts"), (first_expert, "first_expert"), (tiles.max_tiles, "max_tiles")],
    )?;
    d.launch(&Launch::groups(kernel, args, 1, [1, 1]))
}

pub(super) fn matmul<D: KernelDevice>(
    d: &D,
    [x, w, out]: [&D::Buf; 3],
    tiles: &MoeTiles<'_, D::Buf>,
    input: MoeInput,
    [k, n]: [usize; 2],
) -> Result<()> {
    let (dtype, w_rows, cols) = d.contents(w).matrix("moe_matmul weight")?;
    if cols != k || n == 0 || !w_rows.is_multiple_of(n) {
        return Err(be(format!("moe_matmul: weight [{w_rows}, {cols}] is not experts x [{n}, {k}]")));
    }
    let rows = tiles.max_tiles * MOE_TILE_M;
    d.contents(tiles.sorted).u32("moe_matmul sorted rows", rows)?;
    d.contents(tiles.tile_expert).u32("moe_matmul tile experts", tiles.max_tiles)?;
    let (x_div, x_rows) = match input {
        MoeInput::Tokens { top_k, tokens } if top_k > 0 => (top_k, tokens),
        MoeInput::Tokens { .. } => return Err(be("moe_matmul: top_k 0")),
        MoeInput::Slots => (0, rows),
    };
    d.contents(x).f32("moe_matmul x", x_rows * k)?;
    d.contents(out).f32("moe_matmul out", rows * n)?;
    let ty = elem_type(dtype);
    let tiled = tiled(tiles.max_tiles, w_rows / n);
    // 16-bit weights whose rows split into 8-value pieces take the 16-byte loads (rows kernel).
    let vec = ty != rserve_kernels::ElemType::F32 && k.is_multiple_of(8);
    let kernel = ty.pick(match (tiled, vec) {
        (true, _) => &names::MOE_MATMUL_TILED,
        (false, true) => &names::MOE_MATMUL_VEC,
        (false, false) => &names::MOE_MATMUL,
    });
    let mut args = arg_list(
        kernel,
        &[x, w, tiles.sorted, tiles.tile_expert, out],
        &[(k, "k"), (n, "n"), (x_div, "top_k"), (x_rows, "x rows")],
    )?;
    if tiled {
        args.push(u32_arg(tiles.max_tiles, kernel, "max_tiles")?);
        let supers = tiles.max_tiles.div_ceil(GEMM_TILE_M / MOE_TILE_M);
        return d.launch(&Launch::groups(kernel, args, n.div_ceil(GEMM_TILE_N), [supers, 1]));
    }
    let cols = n.div_ceil(rserve_kernels::launch::GEMV_COLS);
    d.launch(&Launch::groups(kernel, args, cols, [tiles.max_tiles, 1]))
}

/// The local-memory tiled multiply pays when an expert's pairs fill several tiles: at least two full tiles per
/// expert on average (`max_tiles` = ceil(pairs / MOE_TILE_M) + min(pairs, experts) >= 3 x experts; prefill). Below,
/// the sub-group rows kernel (decode) reads each expert's weights once per tile anyway.
fn tiled(max_tiles: usize, experts: usize) -> bool {
    max_tiles >= 3 * experts.max(1)
}

pub(super) fn combine<D: KernelDevice>(
    d: &D,
    [y, weights, out]: [&D::Buf; 3],
    tiles: &MoeTiles<'_, D::Buf>,
    [rows, top_k, width]: [usize; 3],
) -> Result<()> {
    let slots = check_tiles(d, tiles, rows * top_k, "moe_combine")?;
    d.contents(y).f32("moe_combine y", slots * width)?;
    d.contents(weights).f32("moe_combine weights", rows * top_k)?;
    d.contents(out).f32("moe_combine out", rows * width)?;
    let kernel = names::MOE_COMBINE;
    let args =
        arg_list(kernel, &[y, tiles.slot, weights, out], &[(width, "width"), (top_k, "top_k"), (slots, "slots")])?;
    d.launch(&Launch::items(kernel, args, width, [rows, 1]))
}

pub(super) fn bias<D: KernelDevice>(
    d: &D,
    [x, bias]: [&D::Buf; 2],
    tiles: &MoeTiles<'_, D::Buf>,
    width: usize,
) -> Result<()> {
    let rows = tiles.max_tiles * MOE_TILE_M;
    d.contents(x).f32("moe_bias x", rows * width)?;
    d.contents(tiles.tile_expert).u32("moe_bias tile experts", tiles.max_tiles)?;
    // One row per expert; the tiles' experts index it as they index the multiply's weights (moe_align's bound).
    if !d.contents(bias).f32("moe_bias bias", width)?.is_multiple_of(width) {
        return Err(be(format!("moe_bias: the bias is not whole rows of {width}")));
    }
    let kernel = names::MOE_BIAS;
    let args = arg_list(kernel, &[x, bias, tiles.tile_expert], &[(width, "width")])?;
    d.launch(&Launch::items(kernel, args, width, [rows, 1]))
}

/// The shapes of one ungrouped routed-experts op (`Op::MoePairGateUp`, `Op::MoePairDown`).
pub(super) struct PairCall<'a, B> {
    pub x: &'a B,
    pub w: &'a B,
    pub bias: Option<&'a B>,
    pub ids: &'a B,
    pub out: &'a B,
    pub tokens: usize,
    pub top_k: usize,
    /// The input width of each weight row.
    pub k: usize,
    /// The output columns (gate/up: the activation's width; down: the hidden size).
    pub n: usize,
    pub held: HeldExperts,
}

impl<B> PairCall<'_, B> {
    /// Checks the shared buffers (the weight as `held.count x [rows_per_expert, k]`, ids, x of `x_rows` rows, the
    /// bias of `rows_per_expert` values an expert) and returns the weight's dtype.
    fn check<D: KernelDevice<Buf = B>>(
        &self,
        d: &D,
        what: &str,
        rows_per_expert: usize,
        x_rows: usize,
    ) -> Result<rserve_kernels::ElemType> {
        let HeldExperts { first, count } = self.held;
        if self.top_k == 0 || count == 0 || self.n == 0 || self.k == 0 {
            return Err(be(format!("{what}: top {} of {count} experts, {} x {}", self.top_k, self.n, self.k)));
        }
        let (dtype, w_rows, cols) = d.contents(self.w).matrix(&format!("{what} weight"))?;
        if cols != self.k || w_rows != count * rows_per_expert {
            return Err(be(format!(
                "{what}: weight [{w_rows}, {cols}] is not {count} x [{rows_per_expert}, {}]",
                self.k
            )));
        }
        d.contents(self.ids).u32(&format!("{what} ids"), self.tokens * self.top_k)?;
        d.contents(self.x).f32(&format!("{what} x"), x_rows * self.k)?;
        if let Some(bias) = self.bias {
            d.contents(bias).f32(&format!("{what} bias"), count * rows_per_expert)?;
        }
        u32_arg::<B>(first + count, what, "first expert + experts")?;
        Ok(elem_type(dtype))
    }

    /// Buffers then numbers, as the `moe_pair_*` kernels take them (the bias, or the output in its place: never read
    /// without one).
    fn args<'b>(&'b self, kernel: &str, bufs: &[&'b B], nums: &[(usize, &str)]) -> Result<Vec<Arg<'b, B>>> {
        let mut all = vec![self.x, self.w, self.bias.unwrap_or(self.out), self.ids];
        all.extend_from_slice(bufs);
        all.push(self.out);
        let mut args = arg_list(kernel, &all, nums)?;
        args.push(u32_arg(self.held.first, kernel, "first expert")?);
        args.push(u32_arg(self.held.count, kernel, "experts")?);
        Ok(args)
    }
}

pub(super) fn pair_gate_up<D: KernelDevice>(d: &D, c: &PairCall<'_, D::Buf>, act: Activation) -> Result<()> {
    let pairs = c.tokens * c.top_k;
    let ty = c.check(d, "moe_pair_gate_up", 2 * c.n, c.tokens)?;
    d.contents(c.out).f32("moe_pair_gate_up out", pairs * c.n)?;
    let kernel = ty.pick(&names::MOE_PAIR_GATE_UP);
    let mut args = c.args(kernel, &[], &[(c.k, "k"), (c.n, "width"), (c.top_k, "top_k")])?;
    args.push(Arg::U32(act.kernel_id()));
    args.push(Arg::U32(u32::from(c.bias.is_some())));
    d.launch(&Launch::groups(kernel, args, c.n.div_ceil(MOE_PAIR_COLS), [pairs, 1]))
}

pub(super) fn pair_down<D: KernelDevice>(d: &D, c: &PairCall<'_, D::Buf>, weights: &D::Buf) -> Result<()> {
    let pairs = c.tokens * c.top_k;
    let ty = c.check(d, "moe_pair_down", c.n, pairs)?;
    d.contents(weights).f32("moe_pair_down weights", pairs)?;
    d.contents(c.out).f32("moe_pair_down out", c.tokens * c.n)?;
    let kernel = ty.pick(&names::MOE_PAIR_DOWN);
    let mut args = c.args(kernel, &[weights], &[(c.k, "k"), (c.n, "n"), (c.top_k, "top_k")])?;
    args.push(Arg::U32(u32::from(c.bias.is_some())));
    d.launch(&Launch::groups(kernel, args, c.n.div_ceil(MOE_PAIR_ROWS), [c.tokens, 1]))
}
