//! Routed experts on the CPU: the reference of `Op::MoeRoute`, `MoeAlign`, `MoeMatMul` and `MoeCombine`, with the
//! same results and the same tile layout as `kernels/src/cl/moe.cl` (so the op tests compare every output), and one
//! matrix multiply per used expert over all of its rows; and of the ungrouped `MoePairGateUp` and `MoePairDown`, one
//! multiply per pair.

use candle_core::Tensor;
use rserve_kernels::launch::MOE_TILE_M;

use super::{be, elementwise, matmul, CpuBuffer};
use crate::error::Result;
use crate::{Activation, HeldExperts, MoeInput, MoeTiles};

/// Marks a padding row, an unused tile or a pair without a slot (the kernels' `MOE_NONE`).
const NONE: u32 = u32::MAX;

/// Each row's `top_k` experts (probability desc, index asc) and their softmax weights, renormalised if asked.
pub(super) fn route(
    logits: &[f32],
    ids: &mut [u32],
    weights: &mut [f32],
    [rows, experts, top_k]: [usize; 3],
    renormalize: bool,
) -> Result<()> {
    if experts == 0 || top_k == 0 || top_k > experts {
        return Err(be(format!("moe_route: top {top_k} of {experts} experts")));
    }
    if logits.len() < rows * experts || ids.len() < rows * top_k || weights.len() < rows * top_k {
        return Err(be(format!("moe_route: buffers too small for {rows} rows of {experts} experts, top {top_k}")));
    }
    for r in 0..rows {
        let l = &logits[r * experts..(r + 1) * experts];
        let mx = l.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let sum: f32 = l.iter().map(|&v| (v - mx).exp()).sum();
        let mut order: Vec<usize> = (0..experts).collect();
        // Stable: equal logits keep index order.
        order.sort_by(|&a, &b| l[b].partial_cmp(&l[a]).unwrap_or(std::cmp::Ordering::Equal));
        let (ids, weights) = (&mut ids[r * top_k..(r + 1) * top_k], &mut weights[r * top_k..(r + 1) * top_k]);
        let mut chosen = 0.0;
        for (j, &e) in order[..top_k].iter().enumerate() {
            ids[j] = e as u32;
            weights[j] = (l[e] - mx).exp() / sum;
            chosen += weights[j];
        }
        if renormalize {
            weights.iter_mut().for_each(|w| *w /= chosen);
        }
    }
    Ok(())
}

/// Groups the pairs by expert into one-expert tiles (layout: `moe.cl`).
pub(super) fn align(
    ids: &[u32],
    tiles: &MoeTiles<'_, CpuBuffer>,
    pairs: usize,
    [experts, first_expert]: [usize; 2],
) -> Result<()> {
    let (mut sorted, mut tile_expert, mut slot) =
        (tiles.sorted.u32_mut()?, tiles.tile_expert.u32_mut()?, tiles.slot.u32_mut()?);
    let rows = tiles.max_tiles * MOE_TILE_M;
    if ids.len() < pairs || sorted.len() < rows || tile_expert.len() < tiles.max_tiles || slot.len() < pairs {
        return Err(be(format!("moe_align: buffers too small for {pairs} pairs in {} tiles", tiles.max_tiles)));
    }
    let mut count = vec![0usize; experts];
    // An expert before `first_expert` wraps past the local ones, as on the device.
    let local = |e: u32| e.wrapping_sub(first_expert as u32) as usize;
    for &e in &ids[..pairs] {
        if let Some(c) = count.get_mut(local(e)) {
            *c += 1;
        }
    }
    let mut start = Vec::with_capacity(experts + 1);
    let mut t = 0;
    for c in &count {
        start.push(t);
        t += c.div_ceil(MOE_TILE_M);
    }
    start.push(t);
    sorted[..rows].fill(NONE);
    tile_expert[..tiles.max_tiles].fill(NONE);
    slot[..pairs].fill(NONE);
    for e in 0..experts {
        for tile in start[e]..start[e + 1].min(tiles.max_tiles) {
            tile_expert[tile] = e as u32;
        }
    }
    let mut next: Vec<usize> = start[..experts].iter().map(|s| s * MOE_TILE_M).collect();
    for (p, &e) in ids[..pairs].iter().enumerate() {
        if let Some(n) = next.get_mut(local(e)) {
            if *n < rows {
                sorted[*n] = p as u32;
                slot[p] = *n as u32;
            }
            *n += 1;
        }
    }
    Ok(())
}

/// The grouped multiply: each used expert's rows (its consecutive tiles) in one matrix multiply.
pub(super) fn matmul(
    x: &[f32],
    w: &Tensor,
    tiles: &MoeTiles<'_, CpuBuffer>,
    input: MoeInput,
    out: &mut [f32],
    [k, n]: [usize; 2],
) -> Result<()> {
    let (sorted, tile_expert) = (tiles.sorted.u32()?, tiles.tile_expert.u32()?);
    let rows = tiles.max_tiles * MOE_TILE_M;
    let w_rows = w.dim(0)?;
    if w.rank() != 2 || w.dim(1)? != k || n == 0 || !w_rows.is_multiple_of(n) {
        return Err(be(format!("moe_matmul: weight {:?} is not experts x [{n}, {k}]", w.dims())));
    }
    if sorted.len() < rows || tile_expert.len() < tiles.max_tiles || out.len() < rows * n {
        return Err(be(format!("moe_matmul: buffers too small for {} tiles of [{n}]", tiles.max_tiles)));
    }
    let experts = w_rows / n;
    let mut t = 0;
    while t < tiles.max_tiles {
        let e = tile_expert[t];
        if e == NONE {
            t += 1;
            continue;
        }
        let first = t;
        while t < tiles.max_tiles && tile_expert[t] == e {
            t += 1;
        }
        if e as usize >= experts {
            return Err(be(format!("moe_matmul: expert {e} of {experts}")));
        }
        // The expert's real rows (padding only at the end of its last tile).
        let slots: Vec<usize> = (first * MOE_TILE_M..t * MOE_TILE_M).filter(|&s| sorted[s] != NONE).collect();
        let mut xs = Vec::with_capacity(slots.len() * k);
        for &s in &slots {
            let row = match input {
                MoeInput::Tokens { top_k, .. } => sorted[s] as usize / top_k.max(1),
                MoeInput::Slots => s,
            };
            let src = x.get(row * k..(row + 1) * k).ok_or_else(|| be(format!("moe_matmul: input row {row}")))?;
            xs.extend_from_slice(src);
        }
        let we = w.narrow(0, e as usize * n, n)?;
        let mut ys = vec![0f32; slots.len() * n];
        matmul::matmul(&xs, &we, None, &mut ys, slots.len(), k, n)?;
        for (i, &s) in slots.iter().enumerate() {
            out[s * n..(s + 1) * n].copy_from_slice(&ys[i * n..(i + 1) * n]);
        }
    }
    Ok(())
}

/// `out[t] = sum_j weights[t, j] * y[slot of pair (t, j)]`.
pub(super) fn combine(
    y: &[f32],
    slot: &[u32],
    weights: &[f32],
    out: &mut [f32],
    [rows, top_k, width]: [usize; 3],
) -> Result<()> {
    if slot.len() < rows * top_k || weights.len() < rows * top_k || out.len() < rows * width {
        return Err(be(format!("moe_combine: buffers too small for {rows} rows of top {top_k}")));
    }
    for t in 0..rows {
        let o = &mut out[t * width..(t + 1) * width];
        o.fill(0.0);
        for j in 0..top_k {
            let s = slot[t * top_k + j];
            if s == NONE {
                continue;
            }
            let src = y
                .get(s as usize * width..(s as usize + 1) * width)
                .ok_or_else(|| be(format!("moe_combine: slot {s} outside y")))?;
            let wt = weights[t * top_k + j];
            o.iter_mut().zip(src).for_each(|(o, v)| *o += wt * v);
        }
    }
    Ok(())
}

/// `Op::MoeBias`: each used tile's rows get their expert's bias row.
pub(super) fn bias(x: &mut [f32], bias: &[f32], tiles: &MoeTiles<'_, CpuBuffer>, width: usize) -> Result<()> {
    let tile_expert = tiles.tile_expert.u32()?;
    let rows = tiles.max_tiles * MOE_TILE_M;
    if x.len() < rows * width || tile_expert.len() < tiles.max_tiles {
        return Err(be(format!("moe_bias: buffers too small for {} tiles of width {width}", tiles.max_tiles)));
    }
    for (s, row) in x[..rows * width].chunks_mut(width).enumerate() {
        let e = tile_expert[s / MOE_TILE_M];
        if e == NONE {
            continue;
        }
        let b = bias
            .get(e as usize * width..(e as usize + 1) * width)
            .ok_or_else(|| be(format!("moe_bias: expert {e} outside the bias")))?;
        row.iter_mut().zip(b).for_each(|(x, b)| *x += b);
    }
    Ok(())
}

/// What both ungrouped ops read: the input rows, the held experts' stacked weights and biases, the routed ids.
pub(super) struct PairInputs<'a> {
    pub x: &'a [f32],
    pub w: &'a Tensor,
    pub bias: Option<&'a [f32]>,
    pub ids: &'a [u32],
    pub held: HeldExperts,
}

impl PairInputs<'_> {
    /// Checks the weight (`held.count x [rows_per_expert, k]`), ids, bias and `x_rows` rows of x.
    fn check(&self, what: &str, [pairs, k, rows_per_expert, x_rows]: [usize; 4]) -> Result<()> {
        let (w, count) = (self.w, self.held.count);
        if w.rank() != 2 || w.dim(1)? != k || w.dim(0)? != count * rows_per_expert {
            return Err(be(format!("{what}: weight {:?} is not {count} x [{rows_per_expert}, {k}]", w.dims())));
        }
        let short_bias = self.bias.is_some_and(|b| b.len() < count * rows_per_expert);
        if self.ids.len() < pairs || short_bias || self.x.len() < x_rows * k {
            return Err(be(format!("{what}: ids, bias or input too small for {pairs} pairs")));
        }
        Ok(())
    }

    /// The held expert of pair `p` (`ids[p] - held.first`, if below `held.count`).
    fn expert(&self, p: usize) -> Option<usize> {
        let e = (self.ids[p] as usize).wrapping_sub(self.held.first);
        (e < self.held.count).then_some(e)
    }
}

/// `Op::MoePairGateUp`: each held pair's gate and up rows, bias and activation.
pub(super) fn pair_gate_up(
    i: &PairInputs<'_>,
    out: &mut [f32],
    [tokens, top_k, k, width]: [usize; 4],
    act: Activation,
) -> Result<()> {
    let pairs = tokens * top_k;
    i.check("moe_pair_gate_up", [pairs, k, 2 * width, tokens])?;
    if out.len() < pairs * width {
        return Err(be(format!("moe_pair_gate_up: output too small for {pairs} pairs of {width}")));
    }
    let mut gu = vec![0f32; 2 * width];
    for p in 0..pairs {
        let Some(e) = i.expert(p) else { continue };
        let b = i.bias.map(|b| &b[e * 2 * width..(e + 1) * 2 * width]);
        let xt = &i.x[p / top_k * k..(p / top_k + 1) * k];
        matmul::matmul(xt, &i.w.narrow(0, e * 2 * width, 2 * width)?, b, &mut gu, 1, k, 2 * width)?;
        elementwise::gated_act(&gu, &mut out[p * width..(p + 1) * width], 1, width, act)?;
    }
    Ok(())
}

/// `Op::MoePairDown`: each token's held pairs through their experts' down rows, summed with the routing weights.
pub(super) fn pair_down(
    i: &PairInputs<'_>,
    weights: &[f32],
    out: &mut [f32],
    [tokens, top_k, k, n]: [usize; 4],
) -> Result<()> {
    let pairs = tokens * top_k;
    i.check("moe_pair_down", [pairs, k, n, pairs])?;
    if weights.len() < pairs || out.len() < tokens * n {
        return Err(be(format!("moe_pair_down: buffers too small for {tokens} tokens of top {top_k}")));
    }
    let mut y = vec![0f32; n];
    for t in 0..tokens {
        let o = &mut out[t * n..(t + 1) * n];
        o.fill(0.0);
        for (p, &s) in weights.iter().enumerate().take((t + 1) * top_k).skip(t * top_k) {
            let Some(e) = i.expert(p) else { continue };
            let b = i.bias.map(|b| &b[e * n..(e + 1) * n]);
            matmul::matmul(&i.x[p * k..(p + 1) * k], &i.w.narrow(0, e * n, n)?, b, &mut y, 1, k, n)?;
            o.iter_mut().zip(&y).for_each(|(o, v)| *o += s * v);
        }
    }
    Ok(())
}
