// sampling.cl — picking tokens on the device, so a greedy step reads back one id per sequence instead of its logits.
//
// argmax_rows: out[r] = the index of the largest of x[r, 0 .. width), the lowest index among equal maxima (the CPU
// sampler's rule); NaN never wins, and a row of -inf/NaN gives 0. One work-group of ARGMAX_WG work-items per row: a
// strided scan, then a tree reduction in local memory. Grid: (rows x ARGMAX_WG). Rows whose width is a multiple of 4
// are scanned 4 values per load with ARGMAX_UNROLL loads in flight per work-item (a 128k-entry row is one
// work-group's stream: the time is the loads it keeps in flight); a work-item still visits its indices in
// ascending order, so strict `>` keeps the lowest index of its maximum.
#include "prelude.h"

#define ARGMAX_UNROLL 8

INLINE float4 make_neg_inf4() {
    float4 r;
    r.x = NEG_INF;
    r.y = NEG_INF;
    r.z = NEG_INF;
    r.w = NEG_INF;
    return r;
}

KERNEL void argmax_rows(GLOBAL const float* x, GLOBAL uint* out, uint width) {
    GRID_DEP_SYNC();
    LOCAL float vals[ARGMAX_WG];
    LOCAL uint idxs[ARGMAX_WG];
    uint lid = local_id();
    uint row = group_id(0);
    GLOBAL const float* xr = x + (ulong)row * width;
    float best = NEG_INF;
    uint bi = 0xffffffffu;
    if ((width & 3u) == 0) {
        uint n4 = width / 4;
        uint step = local_size();
        for (uint i0 = lid; i0 < n4; i0 += ARGMAX_UNROLL * step) {
            float4 v[ARGMAX_UNROLL];
#pragma unroll
            for (uint u = 0; u < ARGMAX_UNROLL; u++) {
                uint i = i0 + u * step;
                v[u] = i < n4 ? load4a_f32(xr, 4 * (ulong)i) : make_neg_inf4();
            }
#pragma unroll
            for (uint u = 0; u < ARGMAX_UNROLL; u++) {
                uint i = 4 * (i0 + u * step);
                if (v[u].x > best) { best = v[u].x; bi = i; }
                if (v[u].y > best) { best = v[u].y; bi = i + 1; }
                if (v[u].z > best) { best = v[u].z; bi = i + 2; }
                if (v[u].w > best) { best = v[u].w; bi = i + 3; }
            }
        }
    } else {
        for (uint i = lid; i < width; i += local_size()) {
            float v = xr[i];
            if (v > best) {
                best = v;
                bi = i;
            }
        }
    }
    vals[lid] = best;
    idxs[lid] = bi;
    barrier_local();
    for (uint s = local_size() / 2; s > 0; s >>= 1) {
        if (lid < s) {
            float v = vals[lid + s];
            uint i = idxs[lid + s];
            if (v > vals[lid] || (v == vals[lid] && i < idxs[lid])) {
                vals[lid] = v;
                idxs[lid] = i;
            }
        }
        barrier_local();
    }
    if (lid == 0) out[row] = idxs[0] == 0xffffffffu ? 0u : idxs[0];
}

// mask_logits: x[r, t] = -inf where bit (t % 32) of mask[r * words + t / 32] is clear: a step's grammar masks
// (structured outputs), applied to the logits on the device before they are read back or greedy picks from them.
// Grid: (ceil(width / ELEM_WG) groups, rows). A row without a constraint comes with every bit set.
KERNEL void mask_logits(GLOBAL float* x, GLOBAL const uint* mask, uint width, uint words) {
    GRID_DEP_SYNC();
    uint t = global_id0();
    uint r = group_id(1);
    if (t < width && ((mask[(ulong)r * words + t / 32] >> (t % 32)) & 1u) == 0) x[(ulong)r * width + t] = NEG_INF;
}

// adjust_logits: penalties and logit bias as sparse edits (`Op::AdjustLogits`, `sampling::adjust::Edit`): edit e
// names (row, token) = (edits[2e], edits[2e + 1]) and (mul, add) = (values[2e], values[2e + 1]); the logit x becomes
// (mul != 1 ? (x > 0 ? x / mul : x * mul) : x) + add. One work-item per edit (one edit per (row, token), so no two
// work-items write the same logit); an edit outside rows x vocab is skipped. Grid: ceil(count / ELEM_WG) groups.
KERNEL void adjust_logits(GLOBAL float* logits, GLOBAL const uint* edits, GLOBAL const float* values, uint count,
                          uint vocab, uint rows) {
    GRID_DEP_SYNC();
    uint e = global_id0();
    if (e >= count) return;
    uint row = edits[2 * (ulong)e];
    uint token = edits[2 * (ulong)e + 1];
    if (row >= rows || token >= vocab) return;
    float mul = values[2 * (ulong)e];
    float add = values[2 * (ulong)e + 1];
    ulong at = (ulong)row * vocab + token;
    float x = logits[at];
    if (mul != 1.0f) x = x > 0.0f ? x / mul : x * mul;
    logits[at] = x + add;
}

// ---------------------------------------------------------------- sample_rows / row_logprobs (SAMPLE_WG per row)

#define SAMPLE_NONE 0xffffffffu
// Work-items per segment of the chunk-sum scan of sample_rows (SAMPLE_WG / SAMPLE_SEG segments).
#define SAMPLE_SEG 32u

// The first output word of Philox4x32-10 for `counter` under `key` (engine/src/sampling/philox.rs).
INLINE uint philox_word0(uint c0, uint c1, uint c2, uint c3, uint k0, uint k1) {
    for (uint i = 0; i < 10; i++) {
        ulong p0 = (ulong)0xD2511F53u * c0;
        ulong p1 = (ulong)0xCD9E8D57u * c2;
        uint n0 = (uint)(p1 >> 32) ^ c1 ^ k0;
        uint n1 = (uint)p1;
        uint n2 = (uint)(p0 >> 32) ^ c3 ^ k1;
        uint n3 = (uint)p0;
        c0 = n0;
        c1 = n1;
        c2 = n2;
        c3 = n3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    return c0;
}

// philox::uniform: 24 random bits of round `round` at output position (pos_lo, pos_hi) of the seed (seed_lo,
// seed_hi), in [0, 1).
INLINE float philox_uniform(uint seed_lo, uint seed_hi, uint pos_lo, uint pos_hi, uint round) {
    return (float)(philox_word0(pos_lo, pos_hi, round, 0u, seed_lo, seed_hi) >> 8) * (1.0f / 16777216.0f);
}

// A token's sampling weight exp((l - max) / T) (0 for a non-finite logit), 0 below the min-p floor.
INLINE float sample_weight(float l, float mx, float inv_t, float floor) {
    float w = fabs(l) < -NEG_INF ? exp((l - mx) * inv_t) : 0.0f;
    return w >= floor ? w : 0.0f;
}

// The work-group's argmax of l[0 .. vocab) by argmax_rows' rule (lowest index among equal maxima, NaN never wins,
// 0 for a row without a number above -inf), returned to every work-item. fbuf / ubuf: SAMPLE_WG entries each.
INLINE uint sample_argmax(GLOBAL const float* l, uint vocab, LOCAL_PTR float* fbuf, LOCAL_PTR uint* ubuf) {
    uint lid = local_id();
    float best = NEG_INF;
    uint bi = SAMPLE_NONE;
    for (uint i = lid; i < vocab; i += local_size()) {
        float v = l[i];
        if (v > best) {
            best = v;
            bi = i;
        }
    }
    barrier_local();
    fbuf[lid] = best;
    ubuf[lid] = bi;
    barrier_local();
    for (uint s = local_size() / 2; s > 0; s >>= 1) {
        if (lid < s) {
            float v = fbuf[lid + s];
            uint i = ubuf[lid + s];
            if (v > fbuf[lid] || (v == fbuf[lid] && i < ubuf[lid])) {
                fbuf[lid] = v;
                ubuf[lid] = i;
            }
        }
        barrier_local();
    }
    uint r = ubuf[0];
    barrier_local();
    return r == SAMPLE_NONE ? 0u : r;
}

// sample_rows: ids[r] = the token row r of `logits` draws under its SAMPLE_PARAM_WORDS words of `params`
// (sampling::RowParams::pack: temperature, top_k, top_p, min_p, seed lo/hi, position lo/hi), by exactly the
// algorithm of the CPU's sampling::draw::sample_row (rejection rounds over shrinking candidate sets, uniforms from
// Philox4x32-10); float sums in another order, so a draw can differ from the CPU's at a rounding boundary, its
// distribution cannot. `logits` is only read: the weights are recomputed on each pass. Greedy rows (temperature
// below 1e-5, or top_k 1) take argmax_rows' token. One work-group of SAMPLE_WG work-items per row; a draw splits
// the row into one contiguous chunk per work-item (index order), scans the chunk sums (segments of SAMPLE_SEG
// work-items, each scanned serially, then the segment totals), and the one work-item whose range holds the target
// re-scans its chunk. Grid: (rows x SAMPLE_WG).
KERNEL void sample_rows(GLOBAL const float* logits, GLOBAL const uint* params, GLOBAL uint* ids, uint vocab) {
    GRID_DEP_SYNC();
    LOCAL float fbuf[SAMPLE_WG];
    LOCAL uint ubuf[SAMPLE_WG];
    LOCAL float segs[SAMPLE_WG / SAMPLE_SEG + 1];
    LOCAL uint pick[2];
    uint lid = local_id();
    uint n = local_size();
    uint row = group_id(0);
    GLOBAL const float* l = logits + (ulong)row * vocab;
    GLOBAL const uint* p = params + (ulong)row * SAMPLE_PARAM_WORDS;
    float temperature = bits_to_f32(p[0]);
    uint top_k = p[1];
    float top_p = bits_to_f32(p[2]);
    float min_p = bits_to_f32(p[3]);
    uint result = SAMPLE_NONE;
    if (!(temperature < 1e-5f || top_k == 1u)) {
        float mx = NEG_INF;
        for (uint i = lid; i < vocab; i += n) {
            float v = l[i];
            if (fabs(v) < -NEG_INF && v > mx) mx = v;
        }
        mx = wg_reduce_max(mx, fbuf);
        if (mx != NEG_INF) {
            float inv_t = 1.0f / temperature;
            // top-p is measured against the whole distribution, before min-p takes tokens out.
            float total = 0.0f;
            if (top_p < 1.0f) {
                float s = 0.0f;
                for (uint i = lid; i < vocab; i += n) s += sample_weight(l[i], mx, inv_t, 0.0f);
                total = wg_reduce_sum(s, fbuf);
            }
            float floor = min_p > 0.0f ? min_p : 0.0f;
            bool use_k = !(top_k == 0u || top_k >= vocab);
            bool use_p = top_p < 1.0f;
            float mass_limit = top_p * total;
            uint chunk = (vocab + n - 1) / n;
            uint c0 = lid * chunk < vocab ? lid * chunk : vocab;
            uint c1 = vocab - c0 > chunk ? c0 + chunk : vocab;
            uint nseg = n / SAMPLE_SEG;
            uint seg = lid / SAMPLE_SEG;
            float pivot = 0.0f;
            for (uint round = 0; round < SAMPLE_MAX_ROUNDS; round++) {
                float u = philox_uniform(p[4], p[5], p[6], p[7], round);
                // This work-item's chunk: the sum of the weights above the pivot.
                float s = 0.0f;
                for (uint i = c0; i < c1; i++) {
                    float w = sample_weight(l[i], mx, inv_t, floor);
                    s += w > pivot ? w : 0.0f;
                }
                fbuf[lid] = s;
                barrier_local();
                // Inclusive scan of each segment (serially, one work-item a segment), its last non-empty chunk.
                if (lid < nseg) {
                    float run = 0.0f;
                    uint last = SAMPLE_NONE;
                    for (uint k = lid * SAMPLE_SEG; k < (lid + 1) * SAMPLE_SEG; k++) {
                        float v = fbuf[k];
                        if (v > 0.0f) last = k;
                        run += v;
                        fbuf[k] = run;
                    }
                    segs[lid] = run;
                    ubuf[lid] = last;
                }
                barrier_local();
                // Exclusive scan of the segment totals; the last non-empty chunk of the row.
                if (lid == 0) {
                    float run = 0.0f;
                    uint owner = SAMPLE_NONE;
                    for (uint j = 0; j < nseg; j++) {
                        float v = segs[j];
                        segs[j] = run;
                        run += v;
                        if (ubuf[j] != SAMPLE_NONE) owner = ubuf[j];
                    }
                    segs[nseg] = run;
                    pick[0] = SAMPLE_NONE;
                    pick[1] = owner;
                }
                barrier_local();
                float tot = segs[nseg];
                if (!(tot > 0.0f)) break;
                float target = u * tot;
                // The chunk's range [excl, incl) of the running sum: the same additions as its neighbours', so the
                // ranges tile [0, tot) exactly.
                float excl = (lid & (SAMPLE_SEG - 1)) == 0 ? segs[seg] : segs[seg] + fbuf[lid - 1];
                float incl = segs[seg] + fbuf[lid];
                bool mine = (excl <= target && target < incl) || (target >= tot && lid == pick[1]);
                if (mine) {
                    float acc = excl;
                    uint last = SAMPLE_NONE;
                    uint got = SAMPLE_NONE;
                    for (uint i = c0; i < c1; i++) {
                        float w = sample_weight(l[i], mx, inv_t, floor);
                        if (w > pivot) {
                            acc += w;
                            last = i;
                            if (acc > target) {
                                got = i;
                                break;
                            }
                        }
                    }
                    // Rounding: the chunk's weights summed one by one fell short of its range; its last candidate.
                    pick[0] = got != SAMPLE_NONE ? got : last;
                }
                barrier_local();
                uint sidx = pick[0];
                if (sidx == SAMPLE_NONE) break;
                if (!use_k && !use_p) {
                    result = sidx;
                    break;
                }
                float ws = sample_weight(l[sidx], mx, inv_t, floor);
                float count = 0.0f;
                float mass = 0.0f;
                for (uint i = lid; i < vocab; i += n) {
                    float w = sample_weight(l[i], mx, inv_t, floor);
                    if (w > ws) {
                        count += 1.0f;
                        mass += w;
                    }
                }
                count = wg_reduce_sum(count, fbuf);
                mass = wg_reduce_sum(mass, fbuf);
                if ((!use_k || count < (float)top_k) && (!use_p || mass < mass_limit)) {
                    result = sidx;
                    break;
                }
                pivot = ws;
            }
        }
    }
    if (result == SAMPLE_NONE) result = sample_argmax(l, vocab, fbuf, ubuf);
    if (lid == 0) ids[row] = result;
}

// row_logprobs: for each row r with want[r] != 0xffffffff (sampling::NO_LOGPROBS): lse = the row's log-sum-exp,
// values[r * W] = logits[r, ids[r]] - lse (W = 1 + LOGPROBS_MAX_TOP), then the want[r] (at most LOGPROBS_MAX_TOP)
// highest logits, highest first, ties to the lower id, NaN never: top_ids[r * LOGPROBS_MAX_TOP + j] and
// values[r * W + 1 + j] = logit - lse (sampling::logprobs::top). One work-group of SAMPLE_WG per row: each
// work-item holds the best of its (strided) tokens after the last pick in (value desc, id asc) order; a round is a
// work-group arg-max of those, and only the work-item that held the winner looks for its next one.
KERNEL void row_logprobs(GLOBAL const float* logits, GLOBAL const uint* ids, GLOBAL const uint* want,
                         GLOBAL float* values, GLOBAL uint* top_ids, uint vocab) {
    GRID_DEP_SYNC();
    LOCAL float fbuf[SAMPLE_WG];
    LOCAL uint ubuf[SAMPLE_WG];
    uint lid = local_id();
    uint n = local_size();
    uint row = group_id(0);
    uint nw = want[row];
    if (nw == 0xffffffffu) return;
    if (nw > LOGPROBS_MAX_TOP) nw = LOGPROBS_MAX_TOP;
    GLOBAL const float* l = logits + (ulong)row * vocab;
    GLOBAL float* vals = values + (ulong)row * (1 + LOGPROBS_MAX_TOP);
    GLOBAL uint* tops = top_ids + (ulong)row * LOGPROBS_MAX_TOP;
    float mx = NEG_INF;
    for (uint i = lid; i < vocab; i += n) {
        float v = l[i];
        if (v > mx) mx = v;
    }
    mx = wg_reduce_max(mx, fbuf);
    float lse = NEG_INF;
    if (mx != NEG_INF) {
        float s = 0.0f;
        for (uint i = lid; i < vocab; i += n) s += exp(l[i] - mx);
        lse = mx + log(wg_reduce_sum(s, fbuf));
    }
    if (lid == 0) {
        uint id = ids[row];
        vals[0] = id < vocab ? l[id] - lse : bits_to_f32(0x7fc00000u);
    }
    // This work-item's best token (the lowest id of its highest value; NaN never).
    float bv = NEG_INF;
    uint bi = SAMPLE_NONE;
    for (uint i = lid; i < vocab; i += n) {
        float v = l[i];
        if (v == v && (bi == SAMPLE_NONE || v > bv)) {
            bv = v;
            bi = i;
        }
    }
    for (uint j = 0; j < nw; j++) {
        fbuf[lid] = bv;
        ubuf[lid] = bi;
        barrier_local();
        for (uint s = n / 2; s > 0; s >>= 1) {
            if (lid < s) {
                float v = fbuf[lid + s];
                uint i = ubuf[lid + s];
                uint ci = ubuf[lid];
                if (i != SAMPLE_NONE && (ci == SAMPLE_NONE || v > fbuf[lid] || (v == fbuf[lid] && i < ci))) {
                    fbuf[lid] = v;
                    ubuf[lid] = i;
                }
            }
            barrier_local();
        }
        float wv = fbuf[0];
        uint wi = ubuf[0];
        barrier_local();
        if (wi == SAMPLE_NONE) break;
        if (lid == 0) {
            tops[j] = wi;
            vals[1 + j] = wv - lse;
        }
        if (bi == wi) {
            // The next of this work-item's tokens in (value desc, id asc) order after the pick.
            bv = NEG_INF;
            bi = SAMPLE_NONE;
            for (uint i = lid; i < vocab; i += n) {
                float v = l[i];
                if ((v < wv || (v == wv && i > wi)) && (bi == SAMPLE_NONE || v > bv)) {
                    bv = v;
                    bi = i;
                }
            }
        }
    }
}
