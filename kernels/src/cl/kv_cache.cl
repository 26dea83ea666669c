// kv_cache.cl — split a fused q/k/v projection: rotary embedding (rotate-half, Hugging Face layout; inv_freq[head_dim
// / 2] already holds the checkpoint's frequency scaling) of q into q_out[tokens, num_heads, head_dim], and of k; k and
// v stored into the paged cache at slot_mapping[t]. cos and sin are multiplied by `mscale` (YaRN's and LongRoPE's
// attention factor; 1 otherwise). Bit 31 of a position selects a second table of frequencies at
// inv_freq[head_dim / 2 ..] (LongRoPE's long factors, chosen per sequence by the host). qkv rows are [num_heads q
// heads | num_kv_heads k heads | num_kv_heads v heads]. With `has_norm`, each q head is first RMS-normalised with
// weight wq[head_dim] and each k head with wk (Qwen3's and Gemma 3's q_norm / k_norm): the norm lives here rather
// than in a kernel of its own because at one token a launch costs more than the arithmetic.
// The cache of one layer is [num_blocks, block_size, kv_heads, head_dim], so a slot's row starts at
// slot * (kv_heads * head_dim); `rope_write_kv` stores f32, `_bf16` / `_f16` a 16-bit cache (round to nearest
// even). One sub-group per head of the fused row (it sums the head's squares itself), ROPE_HEADS heads per
// work-group: grid (tokens x ceil(heads / ROPE_HEADS)) work-groups. The host checks every slot against the cache
// size.
#include "prelude.h"

INLINE void rope_write_kv_body(GLOBAL const float* qkv, GLOBAL const uint* positions, GLOBAL const float* inv_freq,
                               GLOBAL float* q_out, GLOBAL float* kf, GLOBAL float* vf, GLOBAL ushort* kh,
                               GLOBAL ushort* vh, GLOBAL const uint* slot_mapping, uint num_heads,
                               uint num_kv_heads, uint head_dim, float mscale, GLOBAL const float* wq,
                               GLOBAL const float* wk, float eps, uint has_norm, uint kind) {
    uint half_dim = head_dim / 2;
    uint heads = num_heads + 2 * num_kv_heads;
    uint per_token = (heads + ROPE_HEADS - 1) / ROPE_HEADS;
    uint t = group_id(0) / per_token;
    uint h0 = (group_id(0) - t * per_token) * ROPE_HEADS;
    uint h_end = min(h0 + (uint)ROPE_HEADS, heads);
    ulong kv_row = (ulong)num_kv_heads * head_dim;
    ulong slot_row = (ulong)slot_mapping[t] * kv_row;
    uint pos = positions[t];
    float p = (float)(pos & 0x7fffffffu);
    GLOBAL const float* freq = inv_freq + (pos >> 31) * half_dim;
    // The head loop is uniform per sub-group, so every lane of it reaches the reduction.
    for (uint h = h0 + sub_id(); h < h_end; h += num_subs()) {
        GLOBAL const float* src = qkv + ((ulong)t * heads + h) * head_dim;
        if (h >= num_heads + num_kv_heads) {
            ulong at = slot_row + (ulong)(h - num_heads - num_kv_heads) * head_dim;
            for (uint i = sub_lane(); i < head_dim; i += sub_size()) store_act(vf, vh, at + i, src[i], kind);
            continue;
        }
        GLOBAL const float* w = h < num_heads ? wq : wk;
        float r = 1.0f;
        if (has_norm) {
            float ss = 0.0f;
            for (uint i = sub_lane(); i < head_dim; i += sub_size()) ss += src[i] * src[i];
            ss = sub_reduce_add(ss);
            r = 1.0f / sqrt(ss / (float)head_dim + eps);
        }
        for (uint i = sub_lane(); i < half_dim; i += sub_size()) {
            float x1 = src[i];
            float x2 = src[i + half_dim];
            if (has_norm) {
                x1 = w[i] * (x1 * r);
                x2 = w[i + half_dim] * (x2 * r);
            }
            float a = p * freq[i];
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
    }
}

#define ROPE_WRITE_KV(NAME, T, KIND)                                                                               \
    KERNEL void NAME(GLOBAL const float* qkv, GLOBAL const uint* positions, GLOBAL const float* inv_freq,           \
                     GLOBAL float* q_out, GLOBAL T* k_cache, GLOBAL T* v_cache, GLOBAL const uint* slot_mapping,   \
                     uint num_heads, uint num_kv_heads, uint head_dim, float mscale, GLOBAL const float* wq,        \
                     GLOBAL const float* wk, float eps, uint has_norm) {                                            \
        GRID_DEP_SYNC();                                                                                           \
        rope_write_kv_body(qkv, positions, inv_freq, q_out, (GLOBAL float*)k_cache, (GLOBAL float*)v_cache,        \
                           (GLOBAL ushort*)k_cache, (GLOBAL ushort*)v_cache, slot_mapping, num_heads,              \
                           num_kv_heads, head_dim, mscale, wq, wk, eps, has_norm, KIND);                           \
    }
ROPE_WRITE_KV(rope_write_kv, float, 0)
ROPE_WRITE_KV(rope_write_kv_bf16, ushort, 1)
ROPE_WRITE_KV(rope_write_kv_f16, ushort, 2)
