// norm.cl — RMSNorm per row, and RMSNorm fused with the residual add (`residual += x; out = norm(residual) * w`).
// (The per-head q/k norms of Qwen3 and Gemma 3 are part of `rope_write_kv`, kv_cache.cl.)
// One work-group of ROW_WG work-items per row; the sum of squares is a sub-group + local-memory reduction. The
// `_bf16` / `_f16` entry points write `out` rounded to that 16-bit type (the input of a 16-bit matrix multiply).
#include "prelude.h"

// Rows of up to ROW_WG x 4 x NORM_VEC values (8192 with 256 work-items) whose width is a multiple of 4 take the
// register path: every work-item loads its 4-wide pieces of the row at once (all loads in flight before any store,
// and the weight's pieces prefetched with them),
// keeps them in registers for the scaling pass and reads each input once. A row is a single work-group, so at one
// token per step the norm's time is its latency, not its bandwidth. Other rows take the strided loop.
#define NORM_VEC 8

INLINE uint norm_fast(uint hidden) { return (hidden & 3u) == 0 && hidden <= ROW_WG * 4 * NORM_VEC; }

// `residual += x` (when `x` is given) and `out = rmsnorm(residual) * w` over one row, register path.
INLINE void norm_row_vec(GLOBAL const float* x, GLOBAL float* residual, uint add, GLOBAL const float* w,
                         GLOBAL float* out, uint hidden, float eps, uint kind, LOCAL_PTR float* scratch) {
    ulong base = (ulong)group_id(0) * hidden;
    uint n4 = hidden / 4;
    float4 v[NORM_VEC];
    float ss = 0.0f;
#pragma unroll
    for (uint k = 0; k < NORM_VEC; k++) {
        uint i = local_id() + k * local_size();
        v[k] = zero4();
        if (i < n4) {
            v[k] = load4a_f32(residual, base + 4 * i);
            if (add) v[k] = add4(v[k], load4a_f32(x, base + 4 * i));
            prefetch_f32(w, 4 * i);  // the weights' loads after the reduction then hit the first-level cache
        }
    }
#pragma unroll
    for (uint k = 0; k < NORM_VEC; k++) {
        uint i = local_id() + k * local_size();
        ss += dot4(v[k], v[k]);
        if (add && i < n4) store4a_f32(residual, base + 4 * i, v[k]);
    }
    ss = wg_reduce_sum(ss, scratch);
    float r = 1.0f / sqrt(ss / (float)hidden + eps);
#pragma unroll
    for (uint k = 0; k < NORM_VEC; k++) {
        uint i = local_id() + k * local_size();
        if (i < n4) store4_act(out, base + 4 * i, mad4(load4a_f32(w, 4 * i), scale4(v[k], r), zero4()), kind);
    }
}

INLINE void rms_norm_body(GLOBAL const float* x, GLOBAL const float* w, GLOBAL float* out, GLOBAL ushort* out16,
                          uint hidden, float eps, uint kind, LOCAL_PTR float* scratch) {
    if (norm_fast(hidden)) {
        norm_row_vec(x, (GLOBAL float*)x, 0, w, out, hidden, eps, kind, scratch);
        return;
    }
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
    if (norm_fast(hidden)) {
        norm_row_vec(x, residual, 1, w, out, hidden, eps, kind, scratch);
        return;
    }
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
