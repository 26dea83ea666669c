// attention_prefill.cl — causal attention for prefill chunks over the paged cache (the cached prefix plus the
// chunk, which rope_write_kv has already stored), variable length per sequence, flash-attention style (online softmax
// over key tiles held in local memory).
//
// A sequence's query rows x the query heads of one kv head form (token, head) pairs, ordered token-major; a tile is
// PREFILL_ROWS (64) consecutive pairs, so every GQA head of a token shares the key/value tiles. `tiles` holds
// (sequence, first pair) per tile. Grid: (tiles x PREFILL_WG, num_kv_heads). The host sends heads that are not a
// multiple of 8 or over PREFILL_MAX_HEAD_DIM to the per-row decode kernel (`rserve_kernels::prefill_tiles_head`).
// `out` is f32 or, after `out_kind` (1 bf16, 2 f16), the 16-bit input of the output projection's matrix multiply.
// `window` (> 0: a sliding-window layer; a row at position p sees keys p - window + 1 .. p, and the key loop starts
// at the tile's first visible key), `softcap` (> 0: scores capped as softcap * tanh(score / softcap)) and the
// attention sinks (`has_sinks`: sinks[h] joins the softmax denominator) as in the decode kernel.
//
// Register tiling, so local memory is not the bottleneck: the queries are staged transposed (qs[d][pair]) and each
// key tile of PREFILL_KEYS (16) keys transposed (kv[d][key]); a work-item scores 2 pairs x 2 keys, reading one
// 8-byte piece of each per dimension (2 loads for 4 multiply-adds). The probabilities are kept key-major
// (p[key][pair]) and the value tile row-major (kv[key][d]); a work-item accumulates 4 pairs x 8 dimensions of the
// output in registers, reading 16 + 32 bytes per key (3 loads for 32 multiply-adds).
#include "prelude.h"

#if PREFILL_WG != 256 || PREFILL_ROWS != 64 || PREFILL_KEYS != 16 || PREFILL_MAX_HEAD_DIM > 128
#error "attention_prefill.cl: the work-item tiling is written for 256 work-items, 64 pairs, 16 keys, heads <= 128"
#endif
#define NO_ROW 0xffffffffu
// Swizzled places of the transposed tiles: the pair (key) index is XORed with an even function of the dimension,
// so the writes of neighbouring dimensions spread over the banks, while the two neighbours a work-item reads at
// once stay adjacent and aligned.
#define QS_AT(d, r) ((d) * PREFILL_ROWS + ((r) ^ (2 * ((d) & 31))))
#define KS_AT(d, j) ((d) * PREFILL_KEYS + ((j) ^ (2 * ((d) & 7))))

INLINE void prefill_body(GLOBAL const float* q, GLOBAL const float* kf, GLOBAL const ushort* kh, GLOBAL const float* vf,
                         GLOBAL const ushort* vh, uint kind, GLOBAL float* out, uint out_kind, GLOBAL const uint* tiles,
                         GLOBAL const uint* query_start, GLOBAL const uint* context_lens,
                         GLOBAL const uint* block_tables, uint max_blocks, uint num_heads, uint num_kv_heads,
                         uint head_dim, uint block_size, float scale, uint window, float softcap,
                         GLOBAL const float* sinks, uint has_sinks, LOCAL_PTR float* qs, LOCAL_PTR float* kv,
                         LOCAL_PTR float* ps, LOCAL_PTR float* row_max, LOCAL_PTR float* row_sum,
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
    uint first_pos = past + first / group;
    uint lo = window != 0u && first_pos + 1 > window ? first_pos + 1 - window : 0u;  // and none before lo

    if (lid < PREFILL_ROWS) {
        uint p = first + lid;
        row_pos[lid] = p < npairs ? past + p / group : NO_ROW;
        row_max[lid] = NEG_INF;
        row_sum[lid] = 0.0f;
    }
    // Queries, transposed: qs[QS_AT(d, pair)] (global reads run along d).
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
        qs[QS_AT(d, r)] = v;
    }
    // Score work-item: pairs 2 * sr, + 1 and keys 2 * sk, + 1. Output work-item: pairs 4 * orow .. + 3 and
    // dimensions 8 * od .. + 7 (work-items past the head's dimensions only help with loads).
    uint sk = lid % 8;
    uint sr = lid / 8;
    uint od = lid % 16;
    uint orow = lid / 16;
    uint has_d = 8 * od < head_dim;
    float o[4][8];
    for (uint i = 0; i < 4; i++)
        for (uint c = 0; c < 8; c++) o[i][c] = 0.0f;

    for (uint kb = (lo / PREFILL_KEYS) * PREFILL_KEYS; kb < limit; kb += PREFILL_KEYS) {
        uint nk = min((uint)PREFILL_KEYS, limit - kb);
        barrier_local();  // the previous tile is consumed (and, first time round, qs/row_* are written)
        if (lid < PREFILL_KEYS) {
            uint j = lid < nk ? lid : 0;  // rows past nk repeat key 0: loaded, never used
            uint tok = kb + j;
            uint b = tok / block_size;
            slots[lid] = table[b] * block_size + (tok - b * block_size);
        }
        barrier_local();
        // Keys, transposed: kv[KS_AT(d, key)].
        for (uint idx = lid; idx < PREFILL_KEYS * head_dim; idx += PREFILL_WG) {
            uint j = idx / head_dim;
            uint d = idx - j * head_dim;
            kv[KS_AT(d, j)] = load_kv(kf, kh, (ulong)slots[j] * kv_row + kv_off + d, kind);
        }
        barrier_local();
        {
            float a00 = 0.0f, a01 = 0.0f, a10 = 0.0f, a11 = 0.0f;
            for (uint d = 0; d < head_dim; d++) {
                float2 qq = lload2(qs, QS_AT(d, 2 * sr));
                float2 kk = lload2(kv, KS_AT(d, 2 * sk));
                a00 += qq.x * kk.x;
                a01 += qq.x * kk.y;
                a10 += qq.y * kk.x;
                a11 += qq.y * kk.y;
            }
            float a[2][2] = {{a00, a01}, {a10, a11}};
            for (uint i = 0; i < 2; i++) {
                uint r = 2 * sr + i;
                for (uint c = 0; c < 2; c++) {
                    uint j = 2 * sk + c;
                    uint ok = j < nk && row_pos[r] != NO_ROW && kb + j <= row_pos[r] &&
                              (window == 0u || kb + j + window > row_pos[r]);
                    float sc = a[i][c] * scale;
                    if (softcap > 0.0f) sc = softcap * tanh(sc / softcap);
                    ps[j * PREFILL_ROWS + r] = ok ? sc : NEG_INF;
                }
            }
        }
        barrier_local();
        // Online softmax per pair (key-major probabilities); then the value tile replaces the key tile.
        if (lid < PREFILL_ROWS) {
            float m_old = row_max[lid];
            float m = m_old;
            for (uint j = 0; j < PREFILL_KEYS; j++) m = fmax(m, ps[j * PREFILL_ROWS + lid]);
            float corr = 1.0f;
            float sum = 0.0f;
            if (m == NEG_INF) {
                for (uint j = 0; j < PREFILL_KEYS; j++) ps[j * PREFILL_ROWS + lid] = 0.0f;  // nothing visible yet
            } else {
                corr = exp(m_old - m);
                for (uint j = 0; j < PREFILL_KEYS; j++) {
                    float sc = ps[j * PREFILL_ROWS + lid];
                    float p = sc == NEG_INF ? 0.0f : exp(sc - m);
                    ps[j * PREFILL_ROWS + lid] = p;
                    sum += p;
                }
            }
            row_max[lid] = m;
            row_sum[lid] = row_sum[lid] * corr + sum;
            row_corr[lid] = corr;
        }
        for (uint idx = lid; idx < PREFILL_KEYS * head_dim; idx += PREFILL_WG) {
            uint j = idx / head_dim;
            uint d = idx - j * head_dim;
            kv[j * head_dim + d] = load_kv(vf, vh, (ulong)slots[j] * kv_row + kv_off + d, kind);
        }
        barrier_local();
        if (has_d) {
            for (uint i = 0; i < 4; i++) {
                float cr = row_corr[4 * orow + i];
                for (uint c = 0; c < 8; c++) o[i][c] *= cr;
            }
            for (uint j = 0; j < nk; j++) {
                float4 p4 = lload4(ps, j * PREFILL_ROWS + 4 * orow);
                float4 v0 = lload4(kv, j * head_dim + 8 * od);
                float4 v1 = lload4(kv, j * head_dim + 8 * od + 4);
                float pr[4] = {p4.x, p4.y, p4.z, p4.w};
                float vv[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
                for (uint i = 0; i < 4; i++)
                    for (uint c = 0; c < 8; c++) o[i][c] += pr[i] * vv[c];
            }
        }
    }
    if (has_d) {
        for (uint i = 0; i < 4; i++) {
            uint r = 4 * orow + i;
            uint p = first + r;
            if (p < npairs) {
                uint t = p / group;
                ulong h = (ulong)kvh * group + (p - t * group);
                ulong dst = ((ulong)(q0 + t) * num_heads + h) * head_dim + 8 * od;
                float inv = attn_norm(row_max[r], row_sum[r], has_sinks ? sinks[h] : NEG_INF);
                for (uint c = 0; c < 8; c++) store_act(out, (GLOBAL ushort*)out, dst + c, o[i][c] * inv, out_kind);
            }
        }
    }
}

#define PREFILL_KERNEL(NAME, T, KIND)                                                                               \
    KERNEL void NAME(GLOBAL const float* q, GLOBAL const T* k_cache, GLOBAL const T* v_cache, GLOBAL float* out,     \
                     GLOBAL const uint* tiles, GLOBAL const uint* query_start, GLOBAL const uint* context_lens,      \
                     GLOBAL const uint* block_tables, uint max_blocks, uint num_heads, uint num_kv_heads,           \
                     uint head_dim, uint block_size, float scale, uint out_kind, uint window, float softcap,        \
                     GLOBAL const float* sinks, uint has_sinks) {                                                   \
        GRID_DEP_SYNC();                                                                                            \
        LOCAL float qs[PREFILL_ROWS * PREFILL_MAX_HEAD_DIM];                                                        \
        LOCAL float kv[PREFILL_KEYS * PREFILL_MAX_HEAD_DIM];                                                        \
        LOCAL float ps[PREFILL_ROWS * PREFILL_KEYS];                                                                \
        LOCAL float row_max[PREFILL_ROWS];                                                                          \
        LOCAL float row_sum[PREFILL_ROWS];                                                                          \
        LOCAL float row_corr[PREFILL_ROWS];                                                                         \
        LOCAL uint row_pos[PREFILL_ROWS];                                                                           \
        LOCAL uint slots[PREFILL_KEYS];                                                                             \
        prefill_body(q, (GLOBAL const float*)k_cache, (GLOBAL const ushort*)k_cache, (GLOBAL const float*)v_cache,  \
                     (GLOBAL const ushort*)v_cache, KIND, out, out_kind, tiles, query_start, context_lens,          \
                     block_tables, max_blocks, num_heads, num_kv_heads, head_dim, block_size, scale, window, softcap,  \
                     sinks, has_sinks, qs, kv, ps, row_max, row_sum, row_corr, row_pos, slots);                     \
    }
// The f32 cache, and 16-bit caches (bf16, f16) whose values are widened to f32 as they are loaded.
PREFILL_KERNEL(paged_attention_prefill, float, 0)
PREFILL_KERNEL(paged_attention_prefill_bf16, ushort, 1)
PREFILL_KERNEL(paged_attention_prefill_f16, ushort, 2)
