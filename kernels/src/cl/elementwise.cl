// elementwise.cl — SiLU-and-multiply of a fused gate/up projection (`out = silu(gate) * up`) and the row gather
// (`out[i] = x[rows[i]]`).
#include "prelude.h"

// Fused gate/up rows gate_up[rows, 2 * width] (gate columns first). Grid: (ceil(width / ELEM_WG) groups, rows).
KERNEL void silu_mul(GLOBAL const float* gate_up, GLOBAL float* out, uint width) {
    uint i = global_id0();
    ulong r = group_id(1);
    if (i < width) {
        float g = gate_up[r * 2 * width + i];
        out[r * width + i] = g / (1.0f + exp(-g)) * gate_up[r * 2 * width + width + i];
    }
}

// Grid: (ceil(width / ELEM_WG) groups, num_rows); the host checks rows[] against x's row count.
KERNEL void gather_rows(GLOBAL const float* x, GLOBAL const uint* rows, GLOBAL float* out, uint width) {
    uint c = global_id0();
    uint r = group_id(1);
    if (c < width) out[(ulong)r * width + c] = x[(ulong)rows[r] * width + c];
}
