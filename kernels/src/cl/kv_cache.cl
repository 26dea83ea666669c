// kv_cache.cl — write each token's k/v rows into the paged cache at slot_mapping[t]. The cache of one layer is
// [num_blocks, block_size, kv_heads, head_dim], so a slot's row starts at slot * (kv_heads * head_dim).
// Grid: (ceil(row / ELEM_WG) groups, num_tokens); the host checks every slot against the cache size.
#include "prelude.h"

KERNEL void write_kv(GLOBAL const float* k, GLOBAL const float* v, GLOBAL float* k_cache, GLOBAL float* v_cache,
                     GLOBAL const uint* slot_mapping, uint row) {
    uint i = global_id0();
    uint t = group_id(1);
    if (i < row) {
        ulong dst = (ulong)slot_mapping[t] * row + i;
        ulong src = (ulong)t * row + i;
        k_cache[dst] = k[src];
        v_cache[dst] = v[src];
    }
}
