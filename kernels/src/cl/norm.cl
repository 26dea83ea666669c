// norm.cl — RMSNorm per row, and RMSNorm fused with the residual add (`residual += x; out = norm(residual) * w`).
// One work-group of ROW_WG work-items per row; the sum of squares is a sub-group + local-memory reduction.
#include "prelude.h"

KERNEL void rms_norm(GLOBAL const float* x, GLOBAL const float* w, GLOBAL float* out, uint hidden, float eps) {
    LOCAL float scratch[ROW_WG];
    ulong base = (ulong)group_id(0) * hidden;
    float ss = 0.0f;
    for (uint i = local_id(); i < hidden; i += local_size()) {
        float v = x[base + i];
        ss += v * v;
    }
    ss = wg_reduce_sum(ss, scratch);
    float r = 1.0f / sqrt(ss / (float)hidden + eps);
    for (uint i = local_id(); i < hidden; i += local_size()) out[base + i] = w[i] * (x[base + i] * r);
}

KERNEL void add_rms_norm(GLOBAL const float* x, GLOBAL float* residual, GLOBAL const float* w, GLOBAL float* out,
                         uint hidden, float eps) {
    LOCAL float scratch[ROW_WG];
    ulong base = (ulong)group_id(0) * hidden;
    float ss = 0.0f;
    for (uint i = local_id(); i < hidden; i += local_size()) {
        float v = residual[base + i] + x[base + i];
        residual[base + i] = v;
        ss += v * v;
    }
    ss = wg_reduce_sum(ss, scratch);
    float r = 1.0f / sqrt(ss / (float)hidden + eps);
    // Each work-item reads back only the elements it wrote above.
    for (uint i = local_id(); i < hidden; i += local_size()) out[base + i] = w[i] * (residual[base + i] * r);
}
