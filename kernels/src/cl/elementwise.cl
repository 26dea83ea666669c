// elementwise.cl — SiLU-and-multiply of a fused gate/up projection (`out = silu(gate) * up`) and the row gather
// (`out[i] = x[rows[i]]`).
#include "prelude.h"

// Fused gate/up rows gate_up[rows, 2 * width] (gate columns first). Grid: (ceil(width / ELEM_WG) groups, rows). The
// `_bf16` / `_f16` entry points write `out` rounded to that 16-bit type (the input of a 16-bit matrix multiply).
INLINE void silu_mul_body(GLOBAL const float* gate_up, GLOBAL float* out, GLOBAL ushort* out16, uint width, uint kind) {
    uint i = global_id0();
    ulong r = group_id(1);
    if (i < width) {
        float g = gate_up[r * 2 * width + i];
        store_act(out, out16, r * width + i, g / (1.0f + exp(-g)) * gate_up[r * 2 * width + width + i], kind);
    }
}

KERNEL void silu_mul(GLOBAL const float* gate_up, GLOBAL float* out, uint width) {
    GRID_DEP_SYNC();
    silu_mul_body(gate_up, out, (GLOBAL ushort*)out, width, 0);
}

KERNEL void silu_mul_bf16(GLOBAL const float* gate_up, GLOBAL ushort* out, uint width) {
    GRID_DEP_SYNC();
    silu_mul_body(gate_up, (GLOBAL float*)out, out, width, 1);
}

KERNEL void silu_mul_f16(GLOBAL const float* gate_up, GLOBAL ushort* out, uint width) {
    GRID_DEP_SYNC();
    silu_mul_body(gate_up, (GLOBAL float*)out, out, width, 2);
}

// Grid: (ceil(width / ELEM_WG) groups, num_rows); the host checks rows[] against x's row count.
KERNEL void gather_rows(GLOBAL const float* x, GLOBAL const uint* rows, GLOBAL float* out, uint width) {
    GRID_DEP_SYNC();
    uint c = global_id0();
    uint r = group_id(1);
    if (c < width) out[(ulong)r * width + c] = x[(ulong)rows[r] * width + c];
}
