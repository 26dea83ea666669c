// sampling.cl — picking tokens on the device, so a greedy step reads back one id per sequence instead of its logits.
//
// argmax_rows: out[r] = the index of the largest of x[r, 0 .. width), the lowest index among equal maxima (the CPU
// sampler's rule); NaN never wins, and a row of -inf/NaN gives 0. One work-group of ROW_WG work-items per row: a
// strided scan, then a tree reduction in local memory. Grid: (rows x ROW_WG).
#include "prelude.h"

KERNEL void argmax_rows(GLOBAL const float* x, GLOBAL uint* out, uint width) {
    GRID_DEP_SYNC();
    LOCAL float vals[ROW_WG];
    LOCAL uint idxs[ROW_WG];
    uint lid = local_id();
    uint row = group_id(0);
    GLOBAL const float* xr = x + (ulong)row * width;
    float best = NEG_INF;
    uint bi = 0xffffffffu;
    for (uint i = lid; i < width; i += local_size()) {
        float v = xr[i];
        if (v > best) {
            best = v;
            bi = i;
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
