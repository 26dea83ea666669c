// rope.cl — rotary embedding in place on x[tokens, heads, head_dim], rotate-half (Hugging Face) layout.
// inv_freq[head_dim / 2] already holds any llama3 scaling. One work-item per (token, head, pair); 1-D grid.
#include "prelude.h"

KERNEL void rope(GLOBAL float* x, GLOBAL const uint* positions, GLOBAL const float* inv_freq, uint num_tokens,
                 uint num_heads, uint head_dim) {
    uint half_dim = head_dim / 2;
    ulong id = (ulong)group_id(0) * local_size() + local_id();
    ulong per_token = (ulong)num_heads * half_dim;
    if (id >= per_token * num_tokens) return;
    uint t = (uint)(id / per_token);
    uint rem = (uint)(id - (ulong)t * per_token);
    uint h = rem / half_dim;
    uint i = rem - h * half_dim;
    float a = (float)positions[t] * inv_freq[i];
    float c = cos(a);
    float s = sin(a);
    ulong base = ((ulong)t * num_heads + h) * head_dim;
    float x1 = x[base + i];
    float x2 = x[base + i + half_dim];
    x[base + i] = x1 * c - x2 * s;
    x[base + i + half_dim] = x2 * c + x1 * s;
}
