// moe.cl — routed experts (mixture-of-experts MLPs): each token's experts, the (token, expert) pairs grouped by
// expert on the device, the grouped matrix multiply over the experts a step uses, and the weighted combine.
//
// A pair p is token p / top_k with its (p - token * top_k)-th expert ids[p]. Grouped, expert e's pairs (in pair
// order) fill tiles_e = ceil(count_e / MOE_TILE_M) tiles of MOE_TILE_M rows, from tile start_e = the tiles of the
// experts before e; the rest of e's last tile and every tile past the used ones are padding (MOE_NONE). So a tile
// belongs to one expert and a multiply reads each used expert's weights once per tile: at one token only its top_k
// experts' weights are read, at many tokens each expert's weights serve MOE_TILE_M rows per read. The host sizes
// the tiles for the worst case (ceil(pairs / MOE_TILE_M) + min(pairs, experts)), so the grid never depends on the
// routing (a CUDA graph captures it once).
#include "prelude.h"

#define MOE_NONE 0xffffffffu

// moe_route: logits[rows, experts] -> each row's top_k experts, most probable first (the lowest index among equal
// probabilities), into ids[r * top_k + j], and their weights: the softmax over all experts, divided by the sum of the
// chosen ones when `renormalize` (Mixtral, Qwen3-MoE's norm_topk_prob). One work-group per row: the logits staged in
// local memory, the softmax's max and sum work-group reductions, and each expert's rank in (probability desc, index
// asc) order counted by the work-item that owns it, so the experts of rank < top_k are the picks, each placed at its
// rank: every pick at once, where top_k rounds of sub-group reductions one after another cost most of a decode
// step's routing. (A NaN logit ranks nowhere; a pick it leaves empty is MOE_NONE, which every consumer skips.)
// top_k <= MOE_MAX_TOP_K <= MOE_ROUTE_WG, experts <= MOE_MAX_EXPERTS. Grid: (rows groups of MOE_ROUTE_WG).
KERNEL void moe_route(GLOBAL const float* logits, GLOBAL uint* ids, GLOBAL float* weights, uint rows, uint experts,
                      uint top_k, uint renormalize) {
    LOCAL float lv[MOE_MAX_EXPERTS];
    LOCAL float scratch[MOE_ROUTE_WG];
    LOCAL uint pick_e[MOE_MAX_TOP_K];
    LOCAL float pick_w[MOE_MAX_TOP_K];
    GRID_DEP_SYNC();
    uint r = group_id(0);
    if (r >= rows) return;  // uniform per work-group
    GLOBAL const float* l = logits + (ulong)r * experts;
    uint lid = local_id();
    uint wg = local_size();
    if (lid < top_k) {
        pick_e[lid] = MOE_NONE;
        pick_w[lid] = 0.0f;
    }
    float mx = NEG_INF;
    for (uint e = lid; e < experts; e += wg) {
        float v = l[e];
        lv[e] = v;
        mx = fmax(mx, v);
    }
    mx = wg_reduce_max(mx, scratch);  // its barriers also publish lv and the cleared picks
    float sum = 0.0f;
    for (uint e = lid; e < experts; e += wg) sum += exp(lv[e] - mx);
    sum = wg_reduce_sum(sum, scratch);
    for (uint e = lid; e < experts; e += wg) {
        float v = lv[e];
        uint rank = 0;
        for (uint o = 0; o < experts; o++) {
            float u = lv[o];
            rank += (u > v || (u == v && o < e)) ? 1u : 0u;
        }
        if (rank < top_k) {
            pick_e[rank] = e;
            pick_w[rank] = exp(v - mx) / sum;
        }
    }
    barrier_local();
    if (lid < top_k) {
        float chosen = 0.0f;
        for (uint j = 0; j < top_k; j++) chosen += pick_w[j];
        ids[(ulong)r * top_k + lid] = pick_e[lid];
        weights[(ulong)r * top_k + lid] = renormalize ? pick_w[lid] / chosen : pick_w[lid];
    }
}

// moe_align: groups the pairs by expert (layout at the top): sorted[s] = the pair in row s of the tiles or MOE_NONE,
// tile_expert[t] = the expert of tile t or MOE_NONE, slot[p] = the row of pair p (MOE_NONE for an id outside the
// experts). The experts grouped are first_expert .. first_expert + experts (one rank's under expert parallelism),
// numbered from 0 in tile_expert; the pairs of other experts get no row. Rows and tiles past max_tiles are never written. One work-group: expert e is owned by work-item
// e % local_size, which counts and places its pairs while the pairs are staged through local memory a work-group's
// width at a time, so the order inside an expert is the pair order with no atomics (the same on every device).
// Grid: (1 group of ELEM_WG).
KERNEL void moe_align(GLOBAL const uint* ids, GLOBAL uint* sorted, GLOBAL uint* tile_expert, GLOBAL uint* slot,
                      uint pairs, uint experts, uint first_expert, uint max_tiles) {
    GRID_DEP_SYNC();
    LOCAL uint stage[ELEM_WG];
    LOCAL uint count[MOE_MAX_EXPERTS];
    LOCAL uint start[MOE_MAX_EXPERTS + 1];
    uint lid = local_id();
    uint wg = local_size();
    uint rows = max_tiles * MOE_TILE_M;
    for (uint p = lid; p < pairs; p += wg) slot[p] = MOE_NONE;
    for (uint e = lid; e < experts; e += wg) count[e] = 0;
    barrier_local();
    for (uint p0 = 0; p0 < pairs; p0 += wg) {
        uint n = min(wg, pairs - p0);
        if (lid < n) stage[lid] = ids[p0 + lid] - first_expert;  // others wrap past experts
        barrier_local();
        for (uint e = lid; e < experts; e += wg) {
            uint c = count[e];
            for (uint i = 0; i < n; i++) c += stage[i] == e ? 1u : 0u;
            count[e] = c;
        }
        barrier_local();
    }
    if (lid == 0) {
        uint t = 0;
        for (uint e = 0; e < experts; e++) {
            start[e] = t;
            t += (count[e] + MOE_TILE_M - 1) / MOE_TILE_M;
        }
        start[experts] = t;
    }
    barrier_local();
    uint used = min(start[experts], max_tiles);
    for (uint t = used + lid; t < max_tiles; t += wg) tile_expert[t] = MOE_NONE;
    for (uint s = used * MOE_TILE_M + lid; s < rows; s += wg) sorted[s] = MOE_NONE;
    for (uint e = lid; e < experts; e += wg) {
        for (uint t = start[e]; t < min(start[e + 1], max_tiles); t++) tile_expert[t] = e;
        for (uint s = start[e] * MOE_TILE_M + count[e]; s < min(start[e + 1] * MOE_TILE_M, rows); s++)
            sorted[s] = MOE_NONE;
        count[e] = start[e] * MOE_TILE_M;  // from here on: the next row of expert e
    }
    // count[] now belongs to each expert's owner alone; the barrier below only orders the staging.
    for (uint p0 = 0; p0 < pairs; p0 += wg) {
        uint n = min(wg, pairs - p0);
        barrier_local();
        if (lid < n) stage[lid] = ids[p0 + lid] - first_expert;  // others wrap past experts
        barrier_local();
        for (uint e = lid; e < experts; e += wg) {
            uint c = count[e];
            for (uint i = 0; i < n; i++) {
                if (stage[i] == e) {
                    if (c < rows) {
                        sorted[c] = p0 + i;
                        slot[p0 + i] = c;
                    }
                    c++;
                }
            }
            count[e] = c;
        }
    }
}

// The rows of routed-experts tile `tile` (moe_matmul_*): xrow[r] = the offset in x of row r's input row (0 for a
// row that is not real), `*nr` = one past the last real row; returns the mask of real rows (bit r: a pair whose input
// row exists: row(s) = sorted[s] / x_div when x_div > 0, else s, below x_rows).
INLINE uint moe_tile_rows(GLOBAL const uint* sorted, uint tile, uint k, uint x_div, uint x_rows, ulong* xrow,
                          uint* nr) {
    uint real = 0;
    *nr = 0;
    for (uint r = 0; r < MOE_TILE_M; r++) {
        uint s = tile * MOE_TILE_M + r;
        uint p = sorted[s];
        uint xr = x_div > 0 ? p / x_div : s;
        uint ok = p != MOE_NONE && xr < x_rows ? 1u : 0u;
        if (ok) *nr = r + 1;
        real |= ok << r;
        xrow[r] = (ulong)(ok ? xr : 0u) * k;
    }
    return real;
}

// The end of moe_matmul_*: each real row's sum over the sub-group (every lane takes part: nr is the same for the
// whole tile), stored for the real rows. Rows at or past nr hold nothing, so a decode tile of one pair pays one
// reduction, not MOE_TILE_M.
INLINE void moe_store_rows(const float* acc, uint real, uint nr, GLOBAL float* out, uint tile, uint n, uint j) {
    for (uint r = 0; r < MOE_TILE_M; r++) {
        if (r < nr) {
            float sum = sub_reduce_add(acc[r]);
            if (sub_lane() == 0 && ((real >> r) & 1u)) out[(ulong)(tile * MOE_TILE_M + r) * n + j] = sum;
        }
    }
}

// moe_matmul_*: out[s, j] = x[row(s)] . w[e, j, :] for each real row s of each used tile t (e = tile_expert[t]);
// row(s) = sorted[s] / x_div when x_div > 0 (x holds the tokens and a pair reads its token's row: x_div = top_k), else
// s (x holds one row per slot: the activated output of the first multiply); a row at or past x_rows is skipped. w stacks the experts' [n, k] matrices
// (expert e's rows e * n .. (e + 1) * n). Padding rows and unused tiles are not written. As matmul_rows: a sub-group
// walks one weight row with its lanes across k, with MOE_TILE_M row accumulators.
// Grid: (ceil(n / GEMV_COLS) x GEMV_WG, max_tiles).
#define MOE_MATMUL(NAME, T, LOAD)                                                                              \
    KERNEL void NAME(GLOBAL const float* x, GLOBAL const T* w, GLOBAL const uint* sorted,                      \
                     GLOBAL const uint* tile_expert, GLOBAL float* out, uint k, uint n, uint x_div,            \
                     uint x_rows) {                                                                            \
        GRID_DEP_SYNC();                                                                                       \
        uint tile = group_id(1);                                                                               \
        uint e = tile_expert[tile];                                                                            \
        if (e == MOE_NONE) return;                                                                             \
        ulong xrow[MOE_TILE_M];                                                                                \
        uint nr;                                                                                               \
        uint real = moe_tile_rows(sorted, tile, k, x_div, x_rows, xrow, &nr);                                  \
        GLOBAL const T* we = w + (ulong)e * n * k;                                                             \
        for (uint c = sub_id(); c < GEMV_COLS; c += num_subs()) {                                              \
            uint j = group_id(0) * GEMV_COLS + c;                                                              \
            if (j >= n) break;                                                                                 \
            float acc[MOE_TILE_M];                                                                             \
            for (uint r = 0; r < MOE_TILE_M; r++) acc[r] = 0.0f;                                               \
            ulong wrow = (ulong)j * k;                                                                         \
            for (uint kk = sub_lane(); kk < k; kk += sub_size()) {                                             \
                float wv = LOAD(we, wrow + kk);                                                                \
                for (uint r = 0; r < MOE_TILE_M; r++)                                                          \
                    if (r < nr) acc[r] += x[xrow[r] + kk] * wv;                                                \
            }                                                                                                  \
            moe_store_rows(acc, real, nr, out, tile, n, j);                                                    \
        }                                                                                                      \
    }

MOE_MATMUL(moe_matmul_f32, float, load_f32)
MOE_MATMUL(moe_matmul_bf16, ushort, load_bf16)
MOE_MATMUL(moe_matmul_f16, ushort, load_f16)

// moe_matmul_vec_bf16 / _f16: moe_matmul_* for 16-bit weights with k a multiple of 8: each lane reads 8 weights (16
// bytes) of a row per step, as matmul_vec does, so a sub-group's step reads whole cache lines, and a sub-group walks
// MOE_VEC_ROWS weight rows at once, so each lane has that many loads in flight per step and each activation load
// serves them all (one token reads only its experts' weights: the time is memory latency, not arithmetic). Same grid.
#define MOE_VEC_ROWS 4
INLINE void moe_matmul_vec(GLOBAL const float* x, GLOBAL const ushort* w, GLOBAL const uint* sorted,
                           GLOBAL const uint* tile_expert, GLOBAL float* out, uint k, uint n, uint x_div, uint x_rows,
                           uint is_f16) {
    uint tile = group_id(1);
    uint e = tile_expert[tile];
    if (e == MOE_NONE) return;
    ulong xrow[MOE_TILE_M];
    uint nr;
    uint real = moe_tile_rows(sorted, tile, k, x_div, x_rows, xrow, &nr);
    GLOBAL const ushort* we = w + (ulong)e * n * k;
    for (uint c = sub_id() * MOE_VEC_ROWS; c < GEMV_COLS; c += num_subs() * MOE_VEC_ROWS) {
        uint j = group_id(0) * GEMV_COLS + c;
        if (j >= n) break;  // uniform per sub-group
        ulong wrow[MOE_VEC_ROWS];
        float acc[MOE_VEC_ROWS][MOE_TILE_M];
        for (uint q = 0; q < MOE_VEC_ROWS; q++) {
            wrow[q] = (ulong)min(j + q, n - 1) * k;  // rows past n re-read the last row and store nothing
            for (uint r = 0; r < MOE_TILE_M; r++) acc[q][r] = 0.0f;
        }
#pragma unroll 2
        for (uint kk = sub_lane() * 8; kk < k; kk += sub_size() * 8) {
            f32x8 a[MOE_VEC_ROWS];
            for (uint q = 0; q < MOE_VEC_ROWS; q++)
                a[q] = is_f16 ? load8_f16(we, wrow[q] + kk) : load8_bf16(we, wrow[q] + kk);
            for (uint r = 0; r < MOE_TILE_M; r++) {
                if (r < nr) {
                    float4 x0 = load4a_f32(x, xrow[r] + kk);
                    float4 x1 = load4a_f32(x, xrow[r] + kk + 4);
                    for (uint q = 0; q < MOE_VEC_ROWS; q++) acc[q][r] += dot8(a[q], x0, x1);
                }
            }
        }
        for (uint q = 0; q < MOE_VEC_ROWS; q++)
            if (j + q < n) moe_store_rows(acc[q], real, nr, out, tile, n, j + q);
    }
}

KERNEL void moe_matmul_vec_bf16(GLOBAL const float* x, GLOBAL const ushort* w, GLOBAL const uint* sorted,
                                GLOBAL const uint* tile_expert, GLOBAL float* out, uint k, uint n, uint x_div,
                                uint x_rows) {
    GRID_DEP_SYNC();
    moe_matmul_vec(x, w, sorted, tile_expert, out, k, n, x_div, x_rows, 0u);
}

KERNEL void moe_matmul_vec_f16(GLOBAL const float* x, GLOBAL const ushort* w, GLOBAL const uint* sorted,
                               GLOBAL const uint* tile_expert, GLOBAL float* out, uint k, uint n, uint x_div,
                               uint x_rows) {
    GRID_DEP_SYNC();
    moe_matmul_vec(x, w, sorted, tile_expert, out, k, n, x_div, x_rows, 1u);
}

// moe_matmul_tiled_*: the grouped multiply for many pairs per expert (prefill): a work-group computes a
// GEMM_TILE_M x GEMM_TILE_N block of out over the MOE_SUPER = GEMM_TILE_M / MOE_TILE_M consecutive tiles it covers,
// with matmul_tiled's local-memory tiles and 4 x 4 outputs per work-item, once per run of tiles of one expert among
// them (the other rows masked: a block is usually one expert's, the runs only split where experts meet). An expert
// with many pairs is then read once per GEMM_TILE_M rows instead of once per MOE_TILE_M. Rows, inputs and padding as
// moe_matmul_*. Grid: (ceil(n / GEMM_TILE_N) x GEMM_WG, ceil(max_tiles / MOE_SUPER)).
#define MOE_SUPER (GEMM_TILE_M / MOE_TILE_M)
#define MOE_MATMUL_TILED(NAME, T, LOAD)                                                                        \
    KERNEL void NAME(GLOBAL const float* x, GLOBAL const T* w, GLOBAL const uint* sorted,                      \
                     GLOBAL const uint* tile_expert, GLOBAL float* out, uint k, uint n, uint x_div,            \
                     uint x_rows, uint max_tiles) {                                                            \
        GRID_DEP_SYNC();                                                                                       \
        LOCAL float xs[GEMM_TILE_K * GEMM_TILE_M];                                                             \
        LOCAL float ws[GEMM_TILE_K * GEMM_TILE_N];                                                             \
        LOCAL uint xrow[GEMM_TILE_M];                                                                          \
        uint lid = local_id();                                                                                 \
        uint tx = lid % GEMM_TX;                                                                                \
        uint ty = lid / GEMM_TX;                                                                                \
        uint n0 = group_id(0) * GEMM_TILE_N;                                                                   \
        uint t0 = group_id(1) * MOE_SUPER;                                                                     \
        uint s0 = t0 * MOE_TILE_M;                                                                             \
        for (uint r = lid; r < GEMM_TILE_M; r += GEMM_WG) {                                                    \
            uint p = t0 + r / MOE_TILE_M < max_tiles ? sorted[s0 + r] : MOE_NONE;                              \
            uint xr = x_div > 0 ? p / x_div : s0 + r;                                                          \
            xrow[r] = p != MOE_NONE && xr < x_rows ? xr : MOE_NONE;                                            \
        }                                                                                                      \
        barrier_local();                                                                                       \
        uint done = 0;                                                                                         \
        while (done < MOE_SUPER && t0 + done < max_tiles) {                                                    \
            uint ex = tile_expert[t0 + done];                                                                  \
            uint run = 1;                                                                                      \
            while (done + run < MOE_SUPER && t0 + done + run < max_tiles && tile_expert[t0 + done + run] == ex) \
                run++;                                                                                         \
            uint lo = done * MOE_TILE_M;                                                                       \
            uint hi = (done + run) * MOE_TILE_M;                                                               \
            done += run;                                                                                       \
            if (ex == MOE_NONE) continue;                                                                      \
            GLOBAL const T* we = w + (ulong)ex * n * k;                                                        \
            float acc[4][4];                                                                                   \
            for (uint i = 0; i < 4; i++)                                                                       \
                for (uint jj = 0; jj < 4; jj++) acc[i][jj] = 0.0f;                                             \
            for (uint k0 = 0; k0 < k; k0 += GEMM_TILE_K) {                                                     \
                for (uint el = lid; el < GEMM_TILE_M * GEMM_TILE_K; el += GEMM_WG) {                           \
                    uint r = el / GEMM_TILE_K;                                                                 \
                    uint c = el % GEMM_TILE_K;                                                                 \
                    uint gk = k0 + c;                                                                          \
                    uint xr = xrow[r];                                                                         \
                    uint live = r >= lo && r < hi && xr != MOE_NONE && gk < k;                                 \
                    xs[c * GEMM_TILE_M + r] = live ? x[(ulong)xr * k + gk] : 0.0f;                             \
                }                                                                                              \
                for (uint el = lid; el < GEMM_TILE_N * GEMM_TILE_K; el += GEMM_WG) {                           \
                    uint r = el / GEMM_TILE_K;                                                                 \
                    uint c = el % GEMM_TILE_K;                                                                 \
                    uint gn = n0 + r;                                                                          \
                    uint gk = k0 + c;                                                                          \
                    ws[c * GEMM_TILE_N + r] = (gn < n && gk < k) ? LOAD(we, (ulong)gn * k + gk) : 0.0f;        \
                }                                                                                              \
                barrier_local();                                                                               \
                GEMM_TILE_STEP(xs, ws, acc, tx, ty);                                                           \
                barrier_local();                                                                               \
            }                                                                                                  \
            for (uint i = 0; i < 4; i++) {                                                                     \
                uint r = ty + i * (GEMM_TILE_M / 4);                                                           \
                if (r < lo || r >= hi || xrow[r] == MOE_NONE) continue;                                        \
                for (uint jj = 0; jj < 4; jj++) {                                                              \
                    uint gn = n0 + tx + jj * GEMM_TX;                                                           \
                    if (gn < n) out[(ulong)(s0 + r) * n + gn] = acc[i][jj];                                    \
                }                                                                                              \
            }                                                                                                  \
        }                                                                                                      \
    }

MOE_MATMUL_TILED(moe_matmul_tiled_f32, float, load_f32)
MOE_MATMUL_TILED(moe_matmul_tiled_bf16, ushort, load_bf16)
MOE_MATMUL_TILED(moe_matmul_tiled_f16, ushort, load_f16)

// moe_combine: out[t, c] = sum over j of weights[t * top_k + j] * y[slot[t * top_k + j], c] (pairs without a slot,
// or with one at or past `slots`, add nothing). Grid: (ceil(width / ELEM_WG) groups, rows).
KERNEL void moe_combine(GLOBAL const float* y, GLOBAL const uint* slot, GLOBAL const float* weights, GLOBAL float* out,
                        uint width, uint top_k, uint slots) {
    GRID_DEP_SYNC();
    uint c = global_id0();
    ulong t = group_id(1);
    if (c >= width) return;
    float acc = 0.0f;
    for (uint j = 0; j < top_k; j++) {
        uint s = slot[t * top_k + j];
        if (s < slots) acc += weights[t * top_k + j] * y[(ulong)s * width + c];
    }
    out[t * width + c] = acc;
}

// moe_bias: x[s, c] += bias[e, c] for every row s of a used tile, e its tile's expert (padding rows too: no multiply
// or combine reads them); the experts' biases stacked `[experts, width]` (gpt-oss's gate/up and down biases). Grid:
// (ceil(width / ELEM_WG) groups, max_tiles * MOE_TILE_M).
KERNEL void moe_bias(GLOBAL float* x, GLOBAL const float* bias, GLOBAL const uint* tile_expert, uint width) {
    GRID_DEP_SYNC();
    uint c = global_id0();
    ulong s = group_id(1);
    uint e = tile_expert[s / MOE_TILE_M];
    if (c >= width || e == MOE_NONE) return;
    x[s * width + c] += bias[(ulong)e * width + c];
}

// ---------------------------------------------------------------- a few tokens, without grouping (decode)
// At a few tokens per step the pairs are few and mostly of distinct experts, so grouping them buys nothing and
// costs launches: moe_pair_gate_up_* multiplies each pair's token by its expert's gate and up rows and applies the
// activation in one kernel, and moe_pair_down_* multiplies each token's activated pairs by their experts' down rows
// and sums them with the routing weights in another (route, gate/up, down: three launches for the whole MLP, where
// the tiles take six). A pair whose expert is not one of the `experts` held from `first_expert` (expert
// parallelism: another rank's) is skipped by both, so its activation row is never written or read.
//
// Weights of any type, read eight at a time: `wt` 0 f32, 1 bf16, 2 f16 (a constant per entry point). The 8-value
// pieces need k a multiple of 8 (so every row starts 16-byte aligned); otherwise `k8` is 0 and the rows are read one
// value per lane.
INLINE f32x8 moe_load8(GLOBAL const ushort* w, ulong i, uint wt) {
    if (wt == 0) {
        f32x8 r;
        r.lo = load4a_f32((GLOBAL const float*)w, i);
        r.hi = load4a_f32((GLOBAL const float*)w, i + 4);
        return r;
    }
    return wt == 1 ? load8_bf16(w, i) : load8_f16(w, i);
}

INLINE float moe_load1(GLOBAL const ushort* w, ulong i, uint wt) {
    return wt == 0 ? ((GLOBAL const float*)w)[i] : wt == 1 ? load_bf16(w, i) : load_f16(w, i);
}

// acc[q] += the sub-group lane's share of x[0 .. k) . w[rows[q] ..] for q < MOE_PAIR_ROWS (4: moe_pair_gate_up's
// rows), rows[q] the offset of a weight row; all loads of a step are independent, so each lane has MOE_PAIR_ROWS
// 16-byte loads in flight per step.
INLINE void moe_pair_dots(GLOBAL const float* x, GLOBAL const ushort* w, const ulong* rows, float* acc, uint k,
                          uint wt) {
    uint lane = sub_lane();
    uint step = sub_size();
    uint k8 = (k & 7u) == 0 ? k : 0u;
#pragma unroll 2
    for (uint kk = lane * 8; kk < k8; kk += step * 8) {
        f32x8 a[MOE_PAIR_ROWS];
        for (uint q = 0; q < MOE_PAIR_ROWS; q++) a[q] = moe_load8(w, rows[q] + kk, wt);
        float4 x0 = load4a_f32(x, kk);
        float4 x1 = load4a_f32(x, kk + 4);
        for (uint q = 0; q < MOE_PAIR_ROWS; q++) acc[q] += dot8(a[q], x0, x1);
    }
    for (uint kk = k8 + lane; kk < k; kk += step) {
        float xv = x[kk];
        for (uint q = 0; q < MOE_PAIR_ROWS; q++) acc[q] += moe_load1(w, rows[q] + kk, wt) * xv;
    }
}

// moe_pair_gate_up_*: out[p, j] = act(x[t] . w[e, j] + bias[e, j]) * (x[t] . w[e, width + j] + bias[e, width + j])
// for pair p = group_id(1) (token t = p / top_k, expert e = ids[p] - first_expert), w the experts' fused gate/up
// matrices stacked `[experts * 2 * width, k]` (gate rows first), bias `[experts, 2 * width]` when has_bias. A
// work-group owns MOE_PAIR_COLS columns; a sub-group two of them at a time (their gate and up rows: MOE_PAIR_ROWS
// rows, each activation load serving all four). Grid: (ceil(width / MOE_PAIR_COLS) x MOE_PAIR_WG, pairs).
INLINE void moe_pair_gate_up(GLOBAL const float* x, GLOBAL const ushort* w, GLOBAL const float* bias,
                             GLOBAL const uint* ids, GLOBAL float* out, uint k, uint width, uint top_k,
                             uint first_expert, uint experts, uint act, uint has_bias, uint wt) {
    uint p = group_id(1);
    uint e = ids[p] - first_expert;  // another rank's expert wraps past `experts`
    if (e >= experts) return;
    GLOBAL const float* xt = x + (ulong)(p / top_k) * k;
    ulong base = (ulong)e * 2 * width;
    for (uint c = sub_id() * 2; c < MOE_PAIR_COLS; c += num_subs() * 2) {
        uint j = group_id(0) * MOE_PAIR_COLS + c;
        if (j >= width) break;  // uniform per sub-group
        uint j1 = min(j + 1, width - 1);  // a last odd column re-reads column j and stores nothing
        ulong rows[MOE_PAIR_ROWS];
        float acc[MOE_PAIR_ROWS];
        rows[0] = (base + j) * k;
        rows[1] = (base + j1) * k;
        rows[2] = (base + width + j) * k;
        rows[3] = (base + width + j1) * k;
        for (uint i = 0; i < MOE_PAIR_ROWS; i++) acc[i] = 0.0f;
        moe_pair_dots(xt, w, rows, acc, k, wt);
        float g0 = sub_reduce_add(acc[0]);
        float g1 = sub_reduce_add(acc[1]);
        float u0 = sub_reduce_add(acc[2]);
        float u1 = sub_reduce_add(acc[3]);
        if (sub_lane() == 0) {
            if (has_bias) {
                g0 += bias[base + j];
                g1 += bias[base + j1];
                u0 += bias[base + width + j];
                u1 += bias[base + width + j1];
            }
            out[(ulong)p * width + j] = gated(g0, u0, act);
            if (j + 1 < width) out[(ulong)p * width + j + 1] = gated(g1, u1, act);
        }
    }
}

// moe_pair_down_*: out[t, j] = sum over q < top_k of weights[p] * (a[p] . w[e, j] + bias[e, j]) for token t =
// group_id(1), p = t * top_k + q its pairs (those of held experts; e = ids[p] - first_expert), a the activated pairs
// `[pairs, k]` of moe_pair_gate_up, w the experts' down matrices stacked `[experts * n, k]`, bias `[experts, n]`
// when has_bias. A work-group owns MOE_PAIR_ROWS output columns, and its sub-groups share the token's experts (sub-group
// s takes experts s, s + num_subs(), ...; the routing weight applied to its lanes' partial sums): so the short
// rows of a down projection (k = the expert width) are read by all sub-groups at once, not one expert after another.
// The sub-groups' sums meet in `part` (MOE_PAIR_WG x MOE_PAIR_ROWS floats of local memory).
// Grid: (ceil(n / MOE_PAIR_ROWS) x MOE_PAIR_WG, tokens).
INLINE void moe_pair_down(GLOBAL const float* a, GLOBAL const ushort* w, GLOBAL const float* bias,
                          GLOBAL const uint* ids, GLOBAL const float* weights, GLOBAL float* out, uint k, uint n,
                          uint top_k, uint first_expert, uint experts, uint has_bias, uint wt, LOCAL_PTR float* part) {
    uint t = group_id(1);
    uint j = group_id(0) * MOE_PAIR_ROWS;
    float acc[MOE_PAIR_ROWS];
    float b[MOE_PAIR_ROWS];
    for (uint i = 0; i < MOE_PAIR_ROWS; i++) {
        acc[i] = 0.0f;
        b[i] = 0.0f;
    }
    for (uint q = sub_id(); q < top_k; q += num_subs()) {
        uint p = t * top_k + q;
        uint e = ids[p] - first_expert;
        if (e >= experts) continue;  // uniform per sub-group: another rank's expert
        float s = weights[p];
        ulong rows[MOE_PAIR_ROWS];
        float d[MOE_PAIR_ROWS];
        for (uint i = 0; i < MOE_PAIR_ROWS; i++) {
            rows[i] = ((ulong)e * n + min(j + i, n - 1)) * k;
            d[i] = 0.0f;
        }
        moe_pair_dots(a + (ulong)p * k, w, rows, d, k, wt);
        for (uint i = 0; i < MOE_PAIR_ROWS; i++) {
            acc[i] += s * d[i];
            if (has_bias) b[i] += s * bias[(ulong)e * n + min(j + i, n - 1)];
        }
    }
    for (uint i = 0; i < MOE_PAIR_ROWS; i++) {
        float sum = sub_reduce_add(acc[i]);
        if (sub_lane() == 0) part[sub_id() * MOE_PAIR_ROWS + i] = sum + b[i];
    }
    barrier_local();
    uint i = local_id();
    if (i < MOE_PAIR_ROWS && j + i < n) {
        float sum = 0.0f;
        for (uint g = 0; g < num_subs(); g++) sum += part[g * MOE_PAIR_ROWS + i];
        out[(ulong)t * n + j + i] = sum;
    }
}

#define MOE_PAIR(GATE_UP, DOWN, WT)                                                                                      \
    KERNEL void GATE_UP(GLOBAL const float* x, GLOBAL const ushort* w, GLOBAL const float* bias, GLOBAL const uint* ids, \
                        GLOBAL float* out, uint k, uint width, uint top_k, uint first_expert, uint experts, uint act,    \
                        uint has_bias) {                                                                                 \
        GRID_DEP_SYNC();                                                                                                 \
        moe_pair_gate_up(x, w, bias, ids, out, k, width, top_k, first_expert, experts, act, has_bias, WT);               \
    }                                                                                                                    \
    KERNEL void DOWN(GLOBAL const float* a, GLOBAL const ushort* w, GLOBAL const float* bias, GLOBAL const uint* ids,    \
                     GLOBAL const float* weights, GLOBAL float* out, uint k, uint n, uint top_k, uint first_expert,      \
                     uint experts, uint has_bias) {                                                                      \
        LOCAL float part[MOE_PAIR_WG * MOE_PAIR_ROWS];                                                                   \
        GRID_DEP_SYNC();                                                                                                 \
        moe_pair_down(a, w, bias, ids, weights, out, k, n, top_k, first_expert, experts, has_bias, WT, part);            \
    }
MOE_PAIR(moe_pair_gate_up_f32, moe_pair_down_f32, 0u)
MOE_PAIR(moe_pair_gate_up_bf16, moe_pair_down_bf16, 1u)
MOE_PAIR(moe_pair_gate_up_f16, moe_pair_down_f16, 2u)
