// norm.cl — RMSNorm per row, and RMSNorm fused with the residual add (`residual += x; out = norm(residual) * w`).
// One work-group of ROW_WG work-items per row; the sum of squares is a sub-group + local-memory reduction. The
// `_bf16` / `_f16` entry points write `out` rounded to that 16-bit type (the input of a 16-bit matrix multiply).
#include "prelude.h"

INLINE void rms_norm_body(GLOBAL const float* x, GLOBAL const float* w, GLOBAL float* out, GLOBAL ushort* out16,
                          uint hidden, float eps, uint kind, LOCAL_PTR float* scratch) {
    ulong base = (ulong)group_id(0) * hidden;
    float ss = 0.0f;
    for (uint i = local_id(); i < hidden; i += local_size()) {
        float v = x[base + i];
        ss += v * v;
    }
    ss = wg_reduce_sum(ss, scratch);
    float r = 1.0f / sqrt(ss / (float)hidden + eps);
    for (uint i = local_id(); i < hidden; i += local_size()) store_act(out, out16, base + i, w[i] * (x[base + i] * r), kind);
}

INLINE void add_rms_norm_body(GLOBAL const float* x, GLOBAL float* residual, GLOBAL const float* w, GLOBAL float* out,
                              GLOBAL ushort* out16, uint hidden, float eps, uint kind, LOCAL_PTR float* scratch) {
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
    for (uint i = local_id(); i < hidden; i += local_size()) {
        store_act(out, out16, base + i, w[i] * (residual[base + i] * r), kind);
    }
}

KERNEL void rms_norm(GLOBAL const float* x, GLOBAL const float* w, GLOBAL float* out, uint hidden, float eps) {
    GRID_DEP_SYNC();
    LOCAL float scratch[ROW_WG];
    rms_norm_body(x, w, out, (GLOBAL ushort*)out, hidden, eps, 0, scratch);
}

KERNEL void rms_norm_bf16(GLOBAL const float* x, GLOBAL const float* w, GLOBAL ushort* out, uint hidden, float eps) {
    GRID_DEP_SYNC();
    LOCAL float scratch[ROW_WG];
    rms_norm_body(x, w, (GLOBAL float*)out, out, hidden, eps, 1, scratch);
}

KERNEL void rms_norm_f16(GLOBAL const float* x, GLOBAL const float* w, GLOBAL ushort* out, uint hidden, float eps) {
    GRID_DEP_SYNC();
    LOCAL float scratch[ROW_WG];
    rms_norm_body(x, w, (GLOBAL float*)out, out, hidden, eps, 2, scratch);
}

KERNEL void add_rms_norm(GLOBAL const float* x, GLOBAL float* residual, GLOBAL const float* w, GLOBAL float* out,
                         uint hidden, float eps) {
    GRID_DEP_SYNC();
    LOCAL float scratch[ROW_WG];
    add_rms_norm_body(x, residual, w, out, (GLOBAL ushort*)out, hidden, eps, 0, scratch);
}

KERNEL void add_rms_norm_bf16(GLOBAL const float* x, GLOBAL float* residual, GLOBAL const float* w, GLOBAL ushort* out,
                              uint hidden, float eps) {
    GRID_DEP_SYNC();
    LOCAL float scratch[ROW_WG];
    add_rms_norm_body(x, residual, w, (GLOBAL float*)out, out, hidden, eps, 1, scratch);
}

KERNEL void add_rms_norm_f16(GLOBAL const float* x, GLOBAL float* residual, GLOBAL const float* w, GLOBAL ushort* out,
                             uint hidden, float eps) {
    GRID_DEP_SYNC();
    LOCAL float scratch[ROW_WG];
    add_rms_norm_body(x, residual, w, (GLOBAL float*)out, out, hidden, eps, 2, scratch);
}
