// attention_prefill.cl — causal attention for prefill chunks over the paged cache (the cached prefix plus the
// chunk, which rope_write_kv has already stored), variable length per sequence, flash-attention style (online softmax
// over key tiles held in local memory).
//
// A sequence's query rows x the query heads of one kv head form (token, head) pairs, ordered token-major; a tile is
// PREFILL_ROWS consecutive pairs, so every GQA head of a token shares the key/value tiles. `tiles` holds
// (sequence, first pair) per tile. Grid: (tiles x PREFILL_WG, num_kv_heads). head_dim <= PREFILL_MAX_HEAD_DIM
// (the host uses the decode kernel per row for larger heads).
#include "prelude.h"

#define O_PER_ITEM (PREFILL_ROWS * PREFILL_MAX_HEAD_DIM / PREFILL_WG)
// Row stride of the query and key/value tiles in local memory: one more than the largest head, so the rows that
// neighbouring work-items read at the same dimension fall in different local-memory banks.
#define PSTRIDE (PREFILL_MAX_HEAD_DIM + 1)
#define NO_ROW 0xffffffffu

INLINE void prefill_body(GLOBAL const float* q, GLOBAL const float* kf, GLOBAL const ushort* kh, GLOBAL const float* vf,
                         GLOBAL const ushort* vh, uint kind, GLOBAL float* out, GLOBAL const uint* tiles,
                         GLOBAL const uint* query_start, GLOBAL const uint* context_lens,
                         GLOBAL const uint* block_tables, uint max_blocks, uint num_heads, uint num_kv_heads,
                         uint head_dim, uint block_size, float scale, LOCAL_PTR float* qs, LOCAL_PTR float* kv,
                         LOCAL_PTR float* s, LOCAL_PTR float* row_max, LOCAL_PTR float* row_sum,
                         LOCAL_PTR float* row_corr, LOCAL_PTR uint* row_pos, LOCAL_PTR uint* slots) {
    uint lid = local_id();
    uint kvh = group_id(1);
    uint seq = tiles[2 * group_id(0)];
    uint first = tiles[2 * group_id(0) + 1];
    uint group = num_heads / num_kv_heads;
    uint q0 = query_start[seq];
    uint qlen = query_start[seq + 1] - q0;
    uint ctx = context_lens[seq];
    uint npairs = qlen * group;
    uint past = ctx - qlen;  // cached keys before the chunk
    ulong kv_row = (ulong)num_kv_heads * head_dim;
    ulong kv_off = (ulong)kvh * head_dim;
    GLOBAL const uint* table = block_tables + (ulong)seq * max_blocks;
    uint last = min(first + PREFILL_ROWS, npairs) - 1;
    uint limit = past + last / group + 1;  // keys [0, limit) are visible to some row of the tile

    if (lid < PREFILL_ROWS) {
        uint p = first + lid;
        row_pos[lid] = p < npairs ? past + p / group : NO_ROW;
        row_max[lid] = NEG_INF;
        row_sum[lid] = 0.0f;
    }
    for (uint idx = lid; idx < PREFILL_ROWS * head_dim; idx += PREFILL_WG) {
        uint r = idx / head_dim;
        uint d = idx - r * head_dim;
        uint p = first + r;
        float v = 0.0f;
        if (p < npairs) {
            uint t = p / group;
            ulong h = (ulong)kvh * group + (p - t * group);
            v = q[((ulong)(q0 + t) * num_heads + h) * head_dim + d];
        }
        qs[r * PSTRIDE + d] = v;
    }
    float o[O_PER_ITEM];
    #pragma unroll
    for (uint i = 0; i < O_PER_ITEM; i++) o[i] = 0.0f;

    for (uint kb = 0; kb < limit; kb += PREFILL_KEYS) {
        uint nk = min((uint)PREFILL_KEYS, limit - kb);
        barrier_local();  // the previous tile is consumed (and, first time round, qs/row_* are written)
        if (lid < nk) {
            uint tok = kb + lid;
            uint b = tok / block_size;
            slots[lid] = table[b] * block_size + (tok - b * block_size);
        }
        barrier_local();
        for (uint idx = lid; idx < nk * head_dim; idx += PREFILL_WG) {
            uint j = idx / head_dim;
            uint d = idx - j * head_dim;
            kv[j * PSTRIDE + d] = load_kv(kf, kh, (ulong)slots[j] * kv_row + kv_off + d, kind);
        }
        barrier_local();
        for (uint idx = lid; idx < PREFILL_ROWS * PREFILL_KEYS; idx += PREFILL_WG) {
            uint r = idx / PREFILL_KEYS;
            uint j = idx % PREFILL_KEYS;
            float sc = NEG_INF;
            if (j < nk && row_pos[r] != NO_ROW && kb + j <= row_pos[r]) {
                LOCAL_PTR const float* qr = qs + r * PSTRIDE;
                LOCAL_PTR const float* kr = kv + j * PSTRIDE;
                float acc = 0.0f;
                for (uint d = 0; d < head_dim; d++) acc += qr[d] * kr[d];
                sc = acc * scale;
            }
            s[idx] = sc;
        }
        barrier_local();
        // Online softmax per row; then the value tile replaces the key tile (no one reads keys any more).
        if (lid < PREFILL_ROWS) {
            LOCAL_PTR float* sr = s + lid * PREFILL_KEYS;
            float m_old = row_max[lid];
            float m = m_old;
            for (uint j = 0; j < nk; j++) m = fmax(m, sr[j]);
            float corr = 1.0f;
            float sum = 0.0f;
            if (m == NEG_INF) {
                for (uint j = 0; j < PREFILL_KEYS; j++) sr[j] = 0.0f;  // padding row
            } else {
                corr = exp(m_old - m);
                for (uint j = 0; j < PREFILL_KEYS; j++) {
                    float p = sr[j] == NEG_INF ? 0.0f : exp(sr[j] - m);
                    sr[j] = p;
                    sum += p;
                }
            }
            row_max[lid] = m;
            row_sum[lid] = row_sum[lid] * corr + sum;
            row_corr[lid] = corr;
        }
        for (uint idx = lid; idx < nk * head_dim; idx += PREFILL_WG) {
            uint j = idx / head_dim;
            uint d = idx - j * head_dim;
            kv[j * PSTRIDE + d] = load_kv(vf, vh, (ulong)slots[j] * kv_row + kv_off + d, kind);
        }
        barrier_local();
        #pragma unroll
        for (uint i = 0; i < O_PER_ITEM; i++) {
            uint idx = lid + i * PREFILL_WG;
            if (idx < PREFILL_ROWS * head_dim) {
                uint r = idx / head_dim;
                uint d = idx - r * head_dim;
                LOCAL_PTR const float* pr = s + r * PREFILL_KEYS;
                float acc = o[i] * row_corr[r];
                for (uint j = 0; j < nk; j++) acc += pr[j] * kv[j * PSTRIDE + d];
                o[i] = acc;
            }
        }
    }
    #pragma unroll
    for (uint i = 0; i < O_PER_ITEM; i++) {
        uint idx = lid + i * PREFILL_WG;
        if (idx < PREFILL_ROWS * head_dim) {
            uint r = idx / head_dim;
            uint d = idx - r * head_dim;
            uint p = first + r;
            if (p < npairs) {
                uint t = p / group;
                ulong h = (ulong)kvh * group + (p - t * group);
                out[((ulong)(q0 + t) * num_heads + h) * head_dim + d] = o[i] / row_sum[r];
            }
        }
    }
}

#define PREFILL_KERNEL(NAME, T, KIND)                                                                               \
    KERNEL void NAME(GLOBAL const float* q, GLOBAL const T* k_cache, GLOBAL const T* v_cache, GLOBAL float* out,     \
                     GLOBAL const uint* tiles, GLOBAL const uint* query_start, GLOBAL const uint* context_lens,      \
                     GLOBAL const uint* block_tables, uint max_blocks, uint num_heads, uint num_kv_heads,           \
                     uint head_dim, uint block_size, float scale) { GRID_DEP_SYNC();                                \
        LOCAL float qs[PREFILL_ROWS * PSTRIDE];                                                                     \
        LOCAL float kv[PREFILL_KEYS * PSTRIDE];                                                                     \
        LOCAL float s[PREFILL_ROWS * PREFILL_KEYS];                                                                 \
        LOCAL float row_max[PREFILL_ROWS];                                                                          \
        LOCAL float row_sum[PREFILL_ROWS];                                                                          \
        LOCAL float row_corr[PREFILL_ROWS];                                                                         \
        LOCAL uint row_pos[PREFILL_ROWS];                                                                           \
        LOCAL uint slots[PREFILL_KEYS];                                                                             \
        prefill_body(q, (GLOBAL const float*)k_cache, (GLOBAL const ushort*)k_cache, (GLOBAL const float*)v_cache,  \
                     (GLOBAL const ushort*)v_cache, KIND, out, tiles, query_start, context_lens, block_tables,      \
                     max_blocks, num_heads, num_kv_heads, head_dim, block_size, scale, qs, kv, s, row_max, row_sum, \
                     row_corr, row_pos, slots);                                                                     \
    }
// The f32 cache, and 16-bit caches (bf16, f16) whose values are widened to f32 as they are loaded.
PREFILL_KERNEL(paged_attention_prefill, float, 0)
PREFILL_KERNEL(paged_attention_prefill_bf16, ushort, 1)
PREFILL_KERNEL(paged_attention_prefill_f16, ushort, 2)
