// elementwise.cl — SiLU-and-multiply (`out = silu(gate) * up`) and the row gather (`out[i] = x[rows[i]]`).
#include "prelude.h"

// 1-D grid over `len` values.
KERNEL void silu_mul(GLOBAL const float* gate, GLOBAL const float* up, GLOBAL float* out, uint len) {
    uint i = global_id0();
    if (i < len) {
        float g = gate[i];
        out[i] = g / (1.0f + exp(-g)) * up[i];
    }
}

// Grid: (ceil(width / ELEM_WG) groups, num_rows); the host checks rows[] against x's row count.
KERNEL void gather_rows(GLOBAL const float* x, GLOBAL const uint* rows, GLOBAL float* out, uint width) {
    uint c = global_id0();
    uint r = group_id(1);
    if (c < width) out[(ulong)r * width + c] = x[(ulong)rows[r] * width + c];
}
