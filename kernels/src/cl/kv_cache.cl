// kv_cache.cl — split a fused q/k/v projection: rotary embedding (rotate-half, Hugging Face layout; inv_freq[head_dim
// / 2] already holds the checkpoint's frequency scaling) of q into q_out[tokens, num_heads, head_dim], and of k; k and
// v stored into the paged cache at slot_mapping[t]. cos and sin are multiplied by `mscale` (YaRN's and LongRoPE's
// attention factor; 1 otherwise). Bit 31 of a position selects a second table of frequencies at
// inv_freq[head_dim / 2 ..] (LongRoPE's long factors, chosen per sequence by the host). qkv rows are [num_heads q heads | num_kv_heads k heads | num_kv_heads v heads].
// The cache of one layer is [num_blocks, block_size, kv_heads, head_dim], so a slot's row starts at
// slot * (kv_heads * head_dim); `rope_write_kv` stores f32, `_bf16` / `_f16` a 16-bit cache (round to nearest
// even). One work-item per (token, head of the fused row, pair (i, i + head_dim / 2)); 1-D grid.
// The host checks every slot against the cache size.
#include "prelude.h"

INLINE void rope_write_kv_body(GLOBAL const float* qkv, GLOBAL const uint* positions, GLOBAL const float* inv_freq,
                               GLOBAL float* q_out, GLOBAL float* kf, GLOBAL float* vf, GLOBAL ushort* kh,
                               GLOBAL ushort* vh, GLOBAL const uint* slot_mapping, uint num_tokens, uint num_heads,
                               uint num_kv_heads, uint head_dim, float mscale, uint kind) {
    uint half_dim = head_dim / 2;
    uint heads = num_heads + 2 * num_kv_heads;
    ulong per_token = (ulong)heads * half_dim;
    ulong id = (ulong)group_id(0) * local_size() + local_id();
    if (id >= per_token * num_tokens) return;
    uint t = (uint)(id / per_token);
    uint rem = (uint)(id - (ulong)t * per_token);
    uint h = rem / half_dim;
    uint i = rem - h * half_dim;
    GLOBAL const float* src = qkv + ((ulong)t * heads + h) * head_dim;
    float x1 = src[i];
    float x2 = src[i + half_dim];
    ulong kv_row = (ulong)num_kv_heads * head_dim;
    ulong slot_row = (ulong)slot_mapping[t] * kv_row;
    if (h >= num_heads + num_kv_heads) {
        ulong at = slot_row + (ulong)(h - num_heads - num_kv_heads) * head_dim + i;
        store_act(vf, vh, at, x1, kind);
        store_act(vf, vh, at + half_dim, x2, kind);
        return;
    }
    uint pos = positions[t];
    float a = (float)(pos & 0x7fffffffu) * inv_freq[(pos >> 31) * half_dim + i];
    float c = cos(a) * mscale;
    float s = sin(a) * mscale;
    float y1 = x1 * c - x2 * s;
    float y2 = x2 * c + x1 * s;
    if (h < num_heads) {
        GLOBAL float* dst = q_out + ((ulong)t * num_heads + h) * head_dim;
        dst[i] = y1;
        dst[i + half_dim] = y2;
    } else {
        ulong at = slot_row + (ulong)(h - num_heads) * head_dim + i;
        store_act(kf, kh, at, y1, kind);
        store_act(kf, kh, at + half_dim, y2, kind);
    }
}

#define ROPE_WRITE_KV(NAME, T, KIND)                                                                               \
    KERNEL void NAME(GLOBAL const float* qkv, GLOBAL const uint* positions, GLOBAL const float* inv_freq,           \
                     GLOBAL float* q_out, GLOBAL T* k_cache, GLOBAL T* v_cache, GLOBAL const uint* slot_mapping,   \
                     uint num_tokens, uint num_heads, uint num_kv_heads, uint head_dim, float mscale) {             \
        GRID_DEP_SYNC();                                                                                           \
        rope_write_kv_body(qkv, positions, inv_freq, q_out, (GLOBAL float*)k_cache, (GLOBAL float*)v_cache,        \
                           (GLOBAL ushort*)k_cache, (GLOBAL ushort*)v_cache, slot_mapping, num_tokens, num_heads,  \
                           num_kv_heads, head_dim, mscale, KIND);                                                  \
    }
ROPE_WRITE_KV(rope_write_kv, float, 0)
ROPE_WRITE_KV(rope_write_kv_bf16, ushort, 1)
ROPE_WRITE_KV(rope_write_kv_f16, ushort, 2)
