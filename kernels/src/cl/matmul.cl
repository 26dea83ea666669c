// matmul.cl — out[m, n] = x[m, k] . w[n, k]^T (+ bias[n]) with f32 accumulation, for f32, bf16 and f16 weights
// (x, bias and out are f32). Two shapes per dtype:
// - matmul_rows_*: few rows (decode). A sub-group walks one weight row with its lanes across k and keeps
//   GEMV_ROWS row accumulators in registers, so each weight element is read once per GEMV_ROWS rows; a sub-group
//   reduction finishes each dot product. Grid: (ceil(n / GEMV_COLS) x GEMV_WG, ceil(m / GEMV_ROWS)).
// - matmul_tiled_*: many rows (prefill). GEMM_TILE_M x GEMM_TILE_N output tiles, x and w staged through local
//   memory GEMM_TILE_K deep, 4 x 4 outputs per work-item. Grid: (ceil(n / TILE_N) x GEMM_WG, ceil(m / TILE_M)).
#include "prelude.h"

#define GEMM_TX (GEMM_TILE_N / 4)  // work-items across a tile's columns; GEMM_WG == GEMM_TX * GEMM_TILE_M / 4

#define MATMUL_ROWS(NAME, T, LOAD)                                                                          \
    KERNEL void NAME(GLOBAL const float* x, GLOBAL const T* w, GLOBAL const float* bias, GLOBAL float* out, \
                     uint m, uint k, uint n, uint has_bias) {                                               \
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
                    if (r < nr) acc[r] += x[(ulong)(r0 + r) * k + kk] * wv;                                 \
            }                                                                                               \
            for (uint r = 0; r < GEMV_ROWS; r++) {                                                          \
                float sum = sub_reduce_add(acc[r]);                                                         \
                if (sub_lane() == 0 && r < nr)                                                              \
                    out[(ulong)(r0 + r) * n + j] = has_bias ? sum + bias[j] : sum;                          \
            }                                                                                               \
        }                                                                                                   \
    }

#define MATMUL_TILED(NAME, T, LOAD)                                                                         \
    KERNEL void NAME(GLOBAL const float* x, GLOBAL const T* w, GLOBAL const float* bias, GLOBAL float* out, \
                     uint m, uint k, uint n, uint has_bias) {                                               \
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
                xs[c * GEMM_TILE_M + r] = (gm < m && gk < k) ? x[(ulong)gm * k + gk] : 0.0f;                \
            }                                                                                               \
            for (uint e = lid; e < GEMM_TILE_N * GEMM_TILE_K; e += GEMM_WG) {                               \
                uint r = e / GEMM_TILE_K;                                                                   \
                uint c = e % GEMM_TILE_K;                                                                   \
                uint gn = n0 + r;                                                                           \
                uint gk = k0 + c;                                                                           \
                ws[c * GEMM_TILE_N + r] = (gn < n && gk < k) ? LOAD(w, (ulong)gn * k + gk) : 0.0f;          \
            }                                                                                               \
            barrier_local();                                                                                \
            for (uint kk = 0; kk < GEMM_TILE_K; kk++) {                                                     \
                float a[4];                                                                                 \
                float b[4];                                                                                 \
                for (uint i = 0; i < 4; i++) a[i] = xs[kk * GEMM_TILE_M + ty + i * (GEMM_TILE_M / 4)];      \
                for (uint jj = 0; jj < 4; jj++) b[jj] = ws[kk * GEMM_TILE_N + tx + jj * GEMM_TX];           \
                for (uint i = 0; i < 4; i++)                                                                \
                    for (uint jj = 0; jj < 4; jj++) acc[i][jj] += a[i] * b[jj];                             \
            }                                                                                               \
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

MATMUL_ROWS(matmul_rows_f32, float, load_f32)
MATMUL_ROWS(matmul_rows_bf16, ushort, load_bf16)
MATMUL_ROWS(matmul_rows_f16, ushort, load_f16)
MATMUL_TILED(matmul_tiled_f32, float, load_f32)
MATMUL_TILED(matmul_tiled_bf16, ushort, load_bf16)
MATMUL_TILED(matmul_tiled_f16, ushort, load_f16)
