// embedding.cl — token embedding gather: out[t, :] = table[ids[t], :] * scale as f32, for f32, bf16 and f16 tables
// (`scale`: Gemma's sqrt(hidden) normalizer, 1 for other models).
// Grid: (ceil(hidden / ELEM_WG) groups, num_tokens); the host checks ids < vocab before launching.
#include "prelude.h"

#define EMBEDDING(NAME, T, LOAD)                                                                        \
    KERNEL void NAME(GLOBAL const T* table, GLOBAL const uint* ids, GLOBAL float* out, uint hidden,     \
                     float scale) { GRID_DEP_SYNC();                                                           \
        uint i = global_id0();                                                                          \
        uint t = group_id(1);                                                                           \
        if (i < hidden) out[(ulong)t * hidden + i] = LOAD(table, (ulong)ids[t] * hidden + i) * scale;   \
    }

EMBEDDING(embedding_f32, float, load_f32)
EMBEDDING(embedding_bf16, ushort, load_bf16)
EMBEDDING(embedding_f16, ushort, load_f16)
