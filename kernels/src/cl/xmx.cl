// xmx.cl — out[m, n] = x[m, k] . w[n, k]^T (+ bias[n]) for bf16 weights on Intel's matrix engine (XMX): each
// sub-group of 16 work-items multiplies through intel_sub_group_bf16_bf16_matrix_mad_k16
// (cl_intel_subgroup_matrix_multiply_accumulate, `dpas.8x8` on PVC), 8 rows x 16 columns x 16 k per call. x
// (f32 activations, as everywhere on Level Zero) is rounded to bf16 (nearest even) as it is loaded; the sums are
// f32. k must be a multiple of 16 (each lane loads 16 weights of its column as 8 pairs).
//
// This source is OpenCL C only (`rserve_kernels::target`: CUDA skips it) and builds two modules:
// - `xmx` (this file): the hardware built-in. Only devices with the extension at sub-group size 16 (PVC) build it;
//   the Level Zero backend loads it there, as a PVC native binary.
// - `xmx_emu` (xmx_emu.cl: XMX_EMULATE defined, then this file): the same kernel with the built-in written in
//   sub-group shuffles and f32 multiply-adds, entry points suffixed `_emu`. It runs on the CPU runtime in CI, so the
//   tiling, the operand layouts and the edge masking of the hardware kernel are checked against the CPU reference.
//
// Operand layouts of the built-in at sub-group size 16 (M = 8, K = 16, N = 16):
// - a (short8): lane l holds A[i][l] in component i (a K column per lane, the M index in the component);
// - b (int8): lane j holds column j, component r = B[2r][j] | B[2r + 1][j] << 16. With B[kk][j] = w[n0 + j][k0 + kk]
//   that is 16 consecutive weights of one weight row, so a lane's b is one 32-byte load (`vload8` of uints);
// - acc / result (float8): lane j holds C[i][j] in component i.
//
// matmul_xmx_bf16[_emu]: work-groups of XMX_WG work-items (XMX_WG / 16 sub-groups side by side along n); a
// sub-group computes XMX_TILE_M rows x XMX_TILE_N columns (XMX_TILE_M / 8 x XMX_TILE_N / 16 accumulators).
// Grid: (ceil(n / (XMX_TILE_N * XMX_WG / 16)) x XMX_WG, ceil(m / XMX_TILE_M)). Rows past m read row m - 1 and
// store nothing; columns past n read zero weights and store nothing.
#include "prelude.h"
#if !defined(__CUDACC_RTC__) && !defined(__CUDACC__)  // OpenCL C only: NVRTC (scripts/dev) sees an empty module

#define XMX_SUB 16
#define XMX_TM (XMX_TILE_M / 8)
#define XMX_TN (XMX_TILE_N / 16)

#ifdef XMX_EMULATE
#define XMX_ENTRY(name) name##_emu
// C[i][j] += sum_kk A[i][kk] * B[kk][j]: A[i][kk] comes from lane kk's component i, B[kk][j] from this lane's pair.
INLINE float bf16_bits_f32(uint bits) { return as_float(bits << 16); }
INLINE float8 xmx_mad(short8 a, int8 b, float8 acc) {
    float8 af = (float8)(bf16_bits_f32((ushort)a.s0), bf16_bits_f32((ushort)a.s1), bf16_bits_f32((ushort)a.s2),
                         bf16_bits_f32((ushort)a.s3), bf16_bits_f32((ushort)a.s4), bf16_bits_f32((ushort)a.s5),
                         bf16_bits_f32((ushort)a.s6), bf16_bits_f32((ushort)a.s7));
    uint pairs[8] = {(uint)b.s0, (uint)b.s1, (uint)b.s2, (uint)b.s3, (uint)b.s4, (uint)b.s5, (uint)b.s6, (uint)b.s7};
    for (uint kk = 0; kk < 16; kk++) {
        uint pair = pairs[kk / 2];
        float bv = bf16_bits_f32((kk & 1) ? pair >> 16 : pair & 0xffffu);
        float8 ak = (float8)(sub_group_shuffle(af.s0, kk), sub_group_shuffle(af.s1, kk),
                             sub_group_shuffle(af.s2, kk), sub_group_shuffle(af.s3, kk),
                             sub_group_shuffle(af.s4, kk), sub_group_shuffle(af.s5, kk),
                             sub_group_shuffle(af.s6, kk), sub_group_shuffle(af.s7, kk));
        acc = mad(ak, (float8)(bv), acc);
    }
    return acc;
}
#else
#define XMX_ENTRY(name) name
float8 __attribute__((overloadable)) intel_sub_group_bf16_bf16_matrix_mad_k16(short8 a, int8 b, float8 acc);
#define xmx_mad intel_sub_group_bf16_bf16_matrix_mad_k16
#endif

// f32 -> bf16 bits, rounded to nearest even (activations are finite).
INLINE short f32_bf16_bits(float f) {
    uint u = as_uint(f);
    return (short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// The A operand of rows r0 .. r0 + 8 at k0: this lane's k column (k0 + lane), rows past m repeat row m - 1.
INLINE short8 xmx_load_a(GLOBAL const float* x, uint m, uint k, uint r0, uint k0, uint lane) {
    GLOBAL const float* p = x + k0 + lane;
    short v[8];
    for (uint i = 0; i < 8; i++) v[i] = f32_bf16_bits(p[(ulong)min(r0 + i, m - 1) * k]);
    return (short8)(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
}

// The B operand of columns c0 .. c0 + 16 at k0: this lane's weight row c0 + lane, 16 weights as 8 pairs; zero past n.
INLINE int8 xmx_load_b(GLOBAL const ushort* w, uint n, uint k, uint c0, uint k0, uint lane) {
    uint c = c0 + lane;
    if (c >= n) return (int8)(0);
    return as_int8(vload8(0, (GLOBAL const uint*)(w + (ulong)c * k + k0)));
}

__attribute__((intel_reqd_sub_group_size(XMX_SUB)))
KERNEL void XMX_ENTRY(matmul_xmx_bf16)(GLOBAL const float* x, GLOBAL const ushort* w, GLOBAL const float* bias,
                                       GLOBAL float* out, uint m, uint k, uint n, uint has_bias) {
    GRID_DEP_SYNC();
    uint lane = sub_lane();
    uint r0 = group_id(1) * XMX_TILE_M;
    uint c0 = (group_id(0) * (XMX_WG / XMX_SUB) + sub_id()) * XMX_TILE_N;
    if (c0 >= n) return;  // uniform per sub-group; no barrier follows
    float8 acc[XMX_TM][XMX_TN];
    for (uint i = 0; i < XMX_TM; i++)
        for (uint j = 0; j < XMX_TN; j++) acc[i][j] = (float8)(0.0f);
    for (uint k0 = 0; k0 < k; k0 += 16) {
        int8 b[XMX_TN];
        for (uint j = 0; j < XMX_TN; j++) b[j] = xmx_load_b(w, n, k, c0 + 16 * j, k0, lane);
        for (uint i = 0; i < XMX_TM; i++) {
            short8 a = xmx_load_a(x, m, k, r0 + 8 * i, k0, lane);
            for (uint j = 0; j < XMX_TN; j++) acc[i][j] = xmx_mad(a, b[j], acc[i][j]);
        }
    }
    for (uint j = 0; j < XMX_TN; j++) {
        uint c = c0 + 16 * j + lane;
        if (c >= n) continue;
        float bv = has_bias ? bias[c] : 0.0f;
        for (uint i = 0; i < XMX_TM; i++) {
            float v[8];
            vstore8(acc[i][j], 0, v);
            for (uint e = 0; e < 8; e++) {
                uint r = r0 + 8 * i + e;
                if (r < m) out[(ulong)r * n + c] = v[e] + bv;
            }
        }
    }
}
#endif
