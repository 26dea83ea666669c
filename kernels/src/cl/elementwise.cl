// elementwise.cl — the gated activation of a fused gate/up projection (`out = act(gate) * up`, SiLU or GELU-tanh;
// gpt-oss's clamped SwiGLU),
// logit soft-capping (`x = cap * tanh(x / cap)`) and the row gather (`out[i] = x[rows[i]]`).
#include "prelude.h"

// Fused gate/up rows gate_up[rows, 2 * width] (gate columns first). Grid: (ceil(width / ELEM_WG) groups, rows). The
// `_bf16` / `_f16` entry points write `out` rounded to that 16-bit type (the input of a 16-bit matrix multiply).
// The activations (`act`): `gated` in prelude.h.
INLINE void gated_act_body(GLOBAL const float* gate_up, GLOBAL float* out, GLOBAL ushort* out16, uint width, uint act,
                           uint kind) {
    uint i = global_id0();
    ulong r = group_id(1);
    if (i < width) {
        float g = gate_up[r * 2 * width + i];
        float u = gate_up[r * 2 * width + width + i];
        float a = gated(g, u, act);
        store_act(out, out16, r * width + i, a, kind);
    }
}

KERNEL void gated_act(GLOBAL const float* gate_up, GLOBAL float* out, uint width, uint act) {
    GRID_DEP_SYNC();
    gated_act_body(gate_up, out, (GLOBAL ushort*)out, width, act, 0);
}

KERNEL void gated_act_bf16(GLOBAL const float* gate_up, GLOBAL ushort* out, uint width, uint act) {
    GRID_DEP_SYNC();
    gated_act_body(gate_up, (GLOBAL float*)out, out, width, act, 1);
}

KERNEL void gated_act_f16(GLOBAL const float* gate_up, GLOBAL ushort* out, uint width, uint act) {
    GRID_DEP_SYNC();
    gated_act_body(gate_up, (GLOBAL float*)out, out, width, act, 2);
}

// x[rows, width] = cap * tanh(x / cap), in place (Gemma 2's final logit soft-capping). Grid: (ceil(width / ELEM_WG)
// groups, rows).
KERNEL void soft_cap(GLOBAL float* x, uint width, float cap) {
    GRID_DEP_SYNC();
    uint i = global_id0();
    ulong r = group_id(1);
    if (i < width) x[r * width + i] = cap * tanh(x[r * width + i] / cap);
}

// Grid: ceil(count / ELEM_WG) groups. Async scheduling's feed: a step's input ids take the ids the previous step
// sampled on the device; from[i] past prev_len (u32::MAX) keeps the host's id.
KERNEL void feed_tokens(GLOBAL uint* ids, GLOBAL const uint* prev, GLOBAL const uint* from, uint count, uint prev_len) {
    GRID_DEP_SYNC();
    uint i = global_id0();
    if (i < count) {
        uint f = from[i];
        if (f < prev_len) ids[i] = prev[f];
    }
}

// Grid: (ceil(width / ELEM_WG) groups, num_rows); the host checks rows[] against x's row count.
KERNEL void gather_rows(GLOBAL const float* x, GLOBAL const uint* rows, GLOBAL float* out, uint width) {
    GRID_DEP_SYNC();
    uint c = global_id0();
    uint r = group_id(1);
    if (c < width) out[(ulong)r * width + c] = x[(ulong)rows[r] * width + c];
}
