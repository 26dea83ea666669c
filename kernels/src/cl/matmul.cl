// matmul.cl — out[m, n] = x[m, k] . w[n, k]^T (+ bias[n]) with f32 accumulation, for f32, bf16 and f16 weights
// (x, bias and out are f32). Two shapes per dtype:
// - matmul_rows_*: few rows (decode). A sub-group walks one weight row with its lanes across k and keeps
//   GEMV_ROWS row accumulators in registers, so each weight element is read once per GEMV_ROWS rows; a sub-group
//   reduction finishes each dot product. Grid: (ceil(n / GEMV_COLS) x GEMV_WG, ceil(m / GEMV_ROWS)).
// - matmul_tiled_*: many rows (prefill). GEMM_TILE_M x GEMM_TILE_N output tiles, x and w staged through local
//   memory GEMM_TILE_K deep, 4 x 4 outputs per work-item. Grid: (ceil(n / TILE_N) x GEMM_WG, ceil(m / TILE_M)).
// - matmul_vec_bf16 / _f16: few rows (decode) of 16-bit weights with k a multiple of 8 (GPUs). A sub-group walks
//   two weight rows with one 16-byte load (8 weights) per lane per row and step, so a step of a 32-lane warp reads
//   2 x 512 contiguous bytes; up to GEMV_ROWS row accumulators per lane and row, sub-group reductions at the end. Work-groups of
//   GEMV_VEC_WG work-items cover GEMV_VEC_COLS weight rows. Grid: (ceil(n / GEMV_VEC_COLS) x GEMV_VEC_WG,
//   ceil(m / GEMV_ROWS)).
// - matmul_pdla_bf16 / _f16: few rows (decode) of 16-bit activations and weights on CUDA sm_90+, the weights
//   copied asynchronously into local memory, the first copies issued before the wait for the previous kernel.
// - matmul_wi_*: any row count on CPU devices, whose OpenCL compilers vectorise across work-items and turn
//   lane-strided loads into gathers. A work-item computes one output column for GEMV_WI_ROWS rows with explicit
//   4-wide vectors along k. Grid: (ceil(n / ELEM_WG) x ELEM_WG, ceil(m / GEMV_WI_ROWS)).
// - matmul_{rows,tiled,wi,vec}_x16_bf16 / _f16: the same kernels reading 16-bit activations in the weight's type
//   (written so by the op before: RmsNorm, GatedAct, PagedAttention), which halves the activation bytes and the
//   buffers between ops, as on CUDA.
#include "prelude.h"


#define MATMUL_ROWS(NAME, XT, XLOAD, T, LOAD)                                                               \
    KERNEL void NAME(GLOBAL const XT* x, GLOBAL const T* w, GLOBAL const float* bias, GLOBAL float* out,    \
                     uint m, uint k, uint n, uint has_bias) { GRID_DEP_SYNC();                              \
        uint r0 = group_id(1) * GEMV_ROWS;                                                                  \
        uint nr = min((uint)GEMV_ROWS, m - r0);                                                             \
        for (uint c = sub_id(); c < GEMV_COLS; c += num_subs()) {                                           \
            uint j = group_id(0) * GEMV_COLS + c;                                                           \
            if (j >= n) break;                                                                              \
            float acc[GEMV_ROWS];                                                                           \
            for (uint r = 0; r < GEMV_ROWS; r++) acc[r] = 0.0f;                                             \
            ulong wrow = (ulong)j * k;                                                                      \
            for (uint kk = sub_lane(); kk < k; kk += sub_size()) {                                          \
                float wv = LOAD(w, wrow + kk);                                                              \
                for (uint r = 0; r < GEMV_ROWS; r++)                                                        \
                    if (r < nr) acc[r] += XLOAD(x, (ulong)(r0 + r) * k + kk) * wv;                          \
            }                                                                                               \
            for (uint r = 0; r < GEMV_ROWS; r++) {                                                          \
                float sum = sub_reduce_add(acc[r]);                                                         \
                if (sub_lane() == 0 && r < nr)                                                              \
                    out[(ulong)(r0 + r) * n + j] = has_bias ? sum + bias[j] : sum;                          \
            }                                                                                               \
        }                                                                                                   \
    }

#define MATMUL_TILED(NAME, XT, XLOAD, T, LOAD)                                                              \
    KERNEL void NAME(GLOBAL const XT* x, GLOBAL const T* w, GLOBAL const float* bias, GLOBAL float* out,    \
                     uint m, uint k, uint n, uint has_bias) { GRID_DEP_SYNC();                              \
        LOCAL float xs[GEMM_TILE_K * GEMM_TILE_M];                                                          \
        LOCAL float ws[GEMM_TILE_K * GEMM_TILE_N];                                                          \
        uint lid = local_id();                                                                              \
        uint tx = lid % GEMM_TX;                                                                            \
        uint ty = lid / GEMM_TX;                                                                            \
        uint n0 = group_id(0) * GEMM_TILE_N;                                                                \
        uint m0 = group_id(1) * GEMM_TILE_M;                                                                \
        float acc[4][4];                                                                                    \
        for (uint i = 0; i < 4; i++)                                                                        \
            for (uint jj = 0; jj < 4; jj++) acc[i][jj] = 0.0f;                                              \
        for (uint k0 = 0; k0 < k; k0 += GEMM_TILE_K) {                                                      \
            for (uint e = lid; e < GEMM_TILE_M * GEMM_TILE_K; e += GEMM_WG) {                               \
                uint r = e / GEMM_TILE_K;                                                                   \
                uint c = e % GEMM_TILE_K;                                                                   \
                uint gm = m0 + r;                                                                           \
                uint gk = k0 + c;                                                                           \
                xs[c * GEMM_TILE_M + r] = (gm < m && gk < k) ? XLOAD(x, (ulong)gm * k + gk) : 0.0f;         \
            }                                                                                               \
            for (uint e = lid; e < GEMM_TILE_N * GEMM_TILE_K; e += GEMM_WG) {                               \
                uint r = e / GEMM_TILE_K;                                                                   \
                uint c = e % GEMM_TILE_K;                                                                   \
                uint gn = n0 + r;                                                                           \
                uint gk = k0 + c;                                                                           \
                ws[c * GEMM_TILE_N + r] = (gn < n && gk < k) ? LOAD(w, (ulong)gn * k + gk) : 0.0f;          \
            }                                                                                               \
            barrier_local();                                                                                \
            GEMM_TILE_STEP(xs, ws, acc, tx, ty);                                                            \
            barrier_local();                                                                                \
        }                                                                                                   \
        for (uint i = 0; i < 4; i++) {                                                                      \
            uint gm = m0 + ty + i * (GEMM_TILE_M / 4);                                                      \
            for (uint jj = 0; jj < 4; jj++) {                                                               \
                uint gn = n0 + tx + jj * GEMM_TX;                                                           \
                if (gm < m && gn < n) out[(ulong)gm * n + gn] = has_bias ? acc[i][jj] + bias[gn] : acc[i][jj]; \
            }                                                                                               \
        }                                                                                                   \
    }

#define MATMUL_WI(NAME, XT, XLOAD4, XLOAD, T, LOAD4, LOAD)                                                  \
    KERNEL void NAME(GLOBAL const XT* x, GLOBAL const T* w, GLOBAL const float* bias, GLOBAL float* out,    \
                     uint m, uint k, uint n, uint has_bias) { GRID_DEP_SYNC();                              \
        uint j = global_id0();                                                                              \
        uint r0 = group_id(1) * GEMV_WI_ROWS;                                                               \
        uint nr = min((uint)GEMV_WI_ROWS, m - r0);                                                          \
        if (j >= n) return;                                                                                 \
        /* Rows past m alias row r0: computed, never stored. */                                             \
        GLOBAL const XT* x0 = x + (ulong)r0 * k;                                                            \
        GLOBAL const XT* x1 = x0 + (nr > 1 ? (ulong)k : 0);                                                 \
        GLOBAL const XT* x2 = x0 + (nr > 2 ? 2 * (ulong)k : 0);                                             \
        GLOBAL const XT* x3 = x0 + (nr > 3 ? 3 * (ulong)k : 0);                                             \
        GLOBAL const T* wr = w + (ulong)j * k;                                                              \
        float4 a0 = zero4(), a1 = zero4(), a2 = zero4(), a3 = zero4();                                      \
        uint k4 = k - k % 4;                                                                                \
        for (uint i = 0; i < k4; i += 4) {                                                                  \
            float4 wv = LOAD4(wr, i);                                                                       \
            a0 = mad4(XLOAD4(x0, i), wv, a0);                                                               \
            a1 = mad4(XLOAD4(x1, i), wv, a1);                                                               \
            a2 = mad4(XLOAD4(x2, i), wv, a2);                                                               \
            a3 = mad4(XLOAD4(x3, i), wv, a3);                                                               \
        }                                                                                                   \
        float s0 = hsum4(a0), s1 = hsum4(a1), s2 = hsum4(a2), s3 = hsum4(a3);                               \
        for (uint i = k4; i < k; i++) {                                                                     \
            float wv = LOAD(wr, i);                                                                         \
            s0 += XLOAD(x0, i) * wv;                                                                        \
            s1 += XLOAD(x1, i) * wv;                                                                        \
            s2 += XLOAD(x2, i) * wv;                                                                        \
            s3 += XLOAD(x3, i) * wv;                                                                        \
        }                                                                                                   \
        float b = has_bias ? bias[j] : 0.0f;                                                                \
        out[(ulong)r0 * n + j] = s0 + b;                                                                    \
        if (nr > 1) out[(ulong)(r0 + 1) * n + j] = s1 + b;                                                  \
        if (nr > 2) out[(ulong)(r0 + 2) * n + j] = s2 + b;                                                  \
        if (nr > 3) out[(ulong)(r0 + 3) * n + j] = s3 + b;                                                  \
    }

// One step of the 16-bit GEMVs: weights A and B (8 values of two weight rows at column kk) times the 8 activations
// at kk of each of the nr rows from r0 (f32 `x`, or with `x16` 16-bit `xh` in the weight's type), into acc0 / acc1.
// A macro, so the accumulators stay in registers.
#define GEMV_STEP8(A, B, kk)                                                                                \
    for (uint r = 0; r < GEMV_ROWS; r++) {                                                                  \
        if (r < nr) {                                                                                       \
            ulong xr = (ulong)(r0 + r) * k + (kk);                                                          \
            float4 x0, x1;                                                                                  \
            if (x16) {                                                                                      \
                f32x8 xv = is_f16 ? load8_f16(xh, xr) : load8_bf16(xh, xr);                                 \
                x0 = xv.lo;                                                                                 \
                x1 = xv.hi;                                                                                 \
            } else {                                                                                        \
                x0 = load4a_f32(x, xr);                                                                     \
                x1 = load4a_f32(x, xr + 4);                                                                 \
            }                                                                                               \
            acc0[r] += dot8((A), x0, x1);                                                                   \
            acc1[r] += dot8((B), x0, x1);                                                                   \
        }                                                                                                   \
    }

// The body of matmul_vec_*: `is_f16` and `x16` (16-bit activations in `xh` instead of f32 in `x`) are constants at
// each call, so each kernel compiles to one load path. A
// sub-group streams two weight rows at once (columns c and c + num_subs() of the group's GEMV_VEC_COLS), so twice
// the loads are in flight and each activation value it reads serves both; where the group has a sub-group per
// column (16-lane sub-groups), the partner column is past the group and only the first is stored.
INLINE void matmul_vec(GLOBAL const float* x, GLOBAL const ushort* xh, GLOBAL const ushort* w,
                       GLOBAL const float* bias, GLOBAL float* out, uint m, uint k, uint n, uint has_bias, uint is_f16,
                       uint x16) {
    uint r0 = group_id(1) * GEMV_ROWS;
    uint nr = min((uint)GEMV_ROWS, m - r0);
    for (uint c = sub_id(); c < GEMV_VEC_COLS; c += 2 * num_subs()) {
        uint j0 = group_id(0) * GEMV_VEC_COLS + c;
        if (j0 >= n) break;  // uniform per sub-group
        uint j1 = j0 + num_subs();
        uint two = (c + num_subs() < GEMV_VEC_COLS && j1 < n) ? 1u : 0u;
        float acc0[GEMV_ROWS];
        float acc1[GEMV_ROWS];
        for (uint r = 0; r < GEMV_ROWS; r++) {
            acc0[r] = 0.0f;
            acc1[r] = 0.0f;
        }
        ulong w0 = (ulong)j0 * k;
        ulong w1 = (ulong)(two ? j1 : j0) * k;
        uint step = sub_size() * 8;
#pragma unroll 4
        for (uint kk = sub_lane() * 8; kk < k; kk += step) {
            f32x8 a = is_f16 ? load8_f16(w, w0 + kk) : load8_bf16(w, w0 + kk);
            f32x8 b = is_f16 ? load8_f16(w, w1 + kk) : load8_bf16(w, w1 + kk);
            GEMV_STEP8(a, b, kk)
        }
        for (uint r = 0; r < GEMV_ROWS; r++) {
            float s0 = sub_reduce_add(acc0[r]);
            float s1 = sub_reduce_add(acc1[r]);
            if (sub_lane() == 0 && r < nr) {
                out[(ulong)(r0 + r) * n + j0] = has_bias ? s0 + bias[j0] : s0;
                if (two) out[(ulong)(r0 + r) * n + j1] = has_bias ? s1 + bias[j1] : s1;
            }
        }
    }
}

KERNEL void matmul_vec_bf16(GLOBAL const float* x, GLOBAL const ushort* w, GLOBAL const float* bias, GLOBAL float* out,
                            uint m, uint k, uint n, uint has_bias) {
    GRID_DEP_SYNC();
    matmul_vec(x, (GLOBAL const ushort*)x, w, bias, out, m, k, n, has_bias, 0u, 0u);
}

KERNEL void matmul_vec_f16(GLOBAL const float* x, GLOBAL const ushort* w, GLOBAL const float* bias, GLOBAL float* out,
                           uint m, uint k, uint n, uint has_bias) {
    GRID_DEP_SYNC();
    matmul_vec(x, (GLOBAL const ushort*)x, w, bias, out, m, k, n, has_bias, 1u, 0u);
}

KERNEL void matmul_vec_x16_bf16(GLOBAL const ushort* x, GLOBAL const ushort* w, GLOBAL const float* bias,
                                GLOBAL float* out, uint m, uint k, uint n, uint has_bias) {
    GRID_DEP_SYNC();
    matmul_vec((GLOBAL const float*)x, x, w, bias, out, m, k, n, has_bias, 0u, 1u);
}

KERNEL void matmul_vec_x16_f16(GLOBAL const ushort* x, GLOBAL const ushort* w, GLOBAL const float* bias,
                               GLOBAL float* out, uint m, uint k, uint n, uint has_bias) {
    GRID_DEP_SYNC();
    matmul_vec((GLOBAL const float*)x, x, w, bias, out, m, k, n, has_bias, 1u, 1u);
}

// Helpers of matmul_pdla. acc0[r] (and with `two` acc1[r]) += the 8 widened weights of each row
// times activations x[r, kk .. kk + 8), for every input row r < m.
INLINE void pdl_dot_rows(float* acc0, float* acc1, f32x8 wa, f32x8 wb, GLOBAL const ushort* x, uint m, uint k,
                         uint kk, uint is_f16, uint two) {
    for (uint r = 0; r < GEMV_PDL_ROWS; r++) {
        if (r < m) {
            f32x8 xv = is_f16 ? load8_f16(x, (ulong)r * k + kk) : load8_bf16(x, (ulong)r * k + kk);
            acc0[r] += dot8(wa, xv.lo, xv.hi);
            if (two) acc1[r] += dot8(wb, xv.lo, xv.hi);
        }
    }
}

// The end of matmul_pdla: each row's sums over the sub-group, stored for weight rows j0 (and with
// `two` j1) that exist, plus the bias.
INLINE void pdl_store_rows(const float* acc0, const float* acc1, GLOBAL const float* bias, GLOBAL float* out, uint m,
                           uint n, uint has_bias, uint j0, uint j1, uint two) {
    for (uint r = 0; r < GEMV_PDL_ROWS; r++) {
        if (r < m) {  // m is uniform: the reductions are reached by the whole sub-group
            float s0 = sub_reduce_add(acc0[r]);
            float s1 = two ? sub_reduce_add(acc1[r]) : 0.0f;
            if (sub_lane() == 0 && j0 < n) out[(ulong)r * n + j0] = has_bias ? s0 + bias[j0] : s0;
            if (two && sub_lane() == 0 && j1 < n) out[(ulong)r * n + j1] = has_bias ? s1 + bias[j1] : s1;
        }
    }
}

// The body of matmul_pdla_*: up to GEMV_PDL_ROWS rows of 16-bit activations (the weight's type) times 16-bit
// weights, k a multiple of 8. A sub-group owns two neighbouring weight rows (each activation load serves both) and
// each lane reads 8 weights (16 bytes) of each row per step. The weights travel through local memory by
// asynchronous copies: each work-item keeps GEMV_ASYNC_STAGES steps of both rows in flight (`ring`: its own
// 2 x GEMV_ASYNC_STAGES slots of 16 bytes, strided by the work-group size), the first of them issued before
// GRID_DEP_SYNC(): weights are never written by an earlier kernel, so under programmatic dependent launch a
// work-group scheduled while the kernel before it drains streams its weights at once, and only the activation reads
// wait. On CUDA a copy in flight holds no register, so more work-groups fit on a multiprocessor. Each step waits for its oldest group, widens
// both rows' pieces (which completes the slot's reads) and reissues the slot GEMV_ASYNC_STAGES steps ahead; one
// group is committed per step, empty past the row's end, so the count stays uniform. Work-groups of GEMV_ASYNC_WG; grid:
// (ceil(n / (2 * subs)) x GEMV_ASYNC_WG, 1).
INLINE void matmul_pdla(GLOBAL const ushort* x, GLOBAL const ushort* w, GLOBAL const float* bias, GLOBAL float* out,
                        uint m, uint k, uint n, uint has_bias, uint is_f16, LOCAL_PTR uint4* ring) {
    uint j0 = (group_id(0) * num_subs() + sub_id()) * 2;
    uint j1 = j0 + 1;
    GLOBAL const uint4* w0 = (GLOBAL const uint4*)(w + (ulong)min(j0, n - 1) * k);  // rows past n stream the last row, store nothing
    GLOBAL const uint4* w1 = (GLOBAL const uint4*)(w + (ulong)min(j1, n - 1) * k);
    uint pieces = k / 8;  // 16-byte pieces of a row
    uint lane = sub_lane();
    LOCAL_PTR uint4* mine = ring + local_id();  // slot i of this work-item: mine[i * wg], so a sub-group's reads of
    uint wg = local_size();                      // one slot are consecutive 16-byte words (no bank conflicts)
    for (uint s = 0; s < GEMV_ASYNC_STAGES; s++) {
        uint p = s * sub_size() + lane;
        if (p < pieces) {
            async_copy16(mine + 2 * s * wg, w0 + p);
            async_copy16(mine + (2 * s + 1) * wg, w1 + p);
        }
        async_commit();
    }
    GRID_DEP_SYNC();
    float acc0[GEMV_PDL_ROWS];
    float acc1[GEMV_PDL_ROWS];
    for (uint r = 0; r < GEMV_PDL_ROWS; r++) {
        acc0[r] = 0.0f;
        acc1[r] = 0.0f;
    }
    uint steps = (pieces + sub_size() - 1) / sub_size();
    for (uint i = 0; i < steps; i++) {
        uint s = i & (GEMV_ASYNC_STAGES - 1);
        ASYNC_WAIT(GEMV_ASYNC_STAGES - 1);
        uint p = i * sub_size() + lane;
        f32x8 wa = widen8_bits(mine[2 * s * wg], is_f16);
        f32x8 wb = widen8_bits(mine[(2 * s + 1) * wg], is_f16);
        uint q = p + GEMV_ASYNC_STAGES * sub_size();
        if (q < pieces) {
            async_copy16(mine + 2 * s * wg, w0 + q);
            async_copy16(mine + (2 * s + 1) * wg, w1 + q);
        }
        async_commit();
        if (p < pieces) pdl_dot_rows(acc0, acc1, wa, wb, x, m, k, 8 * p, is_f16, 1u);
    }
    pdl_store_rows(acc0, acc1, bias, out, m, n, has_bias, j0, j1, 1u);
}

#define MATMUL_PDLA(NAME, IS_F16)                                                                               \
    KERNEL void NAME(GLOBAL const ushort* x, GLOBAL const ushort* w, GLOBAL const float* bias, GLOBAL float* out, \
                     uint m, uint k, uint n, uint has_bias) {                                                   \
        LOCAL uint4 ring[GEMV_ASYNC_WG * 2 * GEMV_ASYNC_STAGES];                                                \
        matmul_pdla(x, w, bias, out, m, k, n, has_bias, IS_F16, ring);                                          \
    }
MATMUL_PDLA(matmul_pdla_bf16, 0u)
MATMUL_PDLA(matmul_pdla_f16, 1u)

MATMUL_ROWS(matmul_rows_f32, float, load_f32, float, load_f32)
MATMUL_ROWS(matmul_rows_bf16, float, load_f32, ushort, load_bf16)
MATMUL_ROWS(matmul_rows_f16, float, load_f32, ushort, load_f16)
MATMUL_ROWS(matmul_rows_x16_bf16, ushort, load_bf16, ushort, load_bf16)
MATMUL_ROWS(matmul_rows_x16_f16, ushort, load_f16, ushort, load_f16)
MATMUL_TILED(matmul_tiled_f32, float, load_f32, float, load_f32)
MATMUL_TILED(matmul_tiled_bf16, float, load_f32, ushort, load_bf16)
MATMUL_TILED(matmul_tiled_f16, float, load_f32, ushort, load_f16)
MATMUL_TILED(matmul_tiled_x16_bf16, ushort, load_bf16, ushort, load_bf16)
MATMUL_TILED(matmul_tiled_x16_f16, ushort, load_f16, ushort, load_f16)
MATMUL_WI(matmul_wi_f32, float, load4_f32, load_f32, float, load4_f32, load_f32)
MATMUL_WI(matmul_wi_bf16, float, load4_f32, load_f32, ushort, load4_bf16, load_bf16)
MATMUL_WI(matmul_wi_f16, float, load4_f32, load_f32, ushort, load4_f16, load_f16)
MATMUL_WI(matmul_wi_x16_bf16, ushort, load4_bf16, load_bf16, ushort, load4_bf16, load_bf16)
MATMUL_WI(matmul_wi_x16_f16, ushort, load4_f16, load_f16, ushort, load4_f16, load_f16)
