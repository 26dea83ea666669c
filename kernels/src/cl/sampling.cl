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
