// attention_decode.cl — paged attention with one query row per work-group: decode tokens, and the general fallback
// for any row (heads larger than the prefill kernel's tile). Grouped-query aware: a work-group serves up to
// ATTN_HEAD_CHUNK query heads of one kv head, so each cached key/value row is fetched once for all of them.
//
// Work list: `entries` holds (query row, sequence) per row to compute; the row's visible keys (its position + 1)
// come from the batch metadata on the device, context_lens[seq] - (query_start[seq + 1] - row) + 1, so the work
// list depends only on which rows a batch has, not on how long its contexts are (one list serves every decode step
// of a batch size, and a captured CUDA graph stays valid as contexts grow). Grid:
// (entries x ATTN_WG, num_kv_heads x head chunks, partitions). Split-KV: a context longer than `partition_size`
// (<= ATTN_MAX_PARTITION) keys is cut into partitions; each work-group scores one partition and leaves its
// unnormalised output, max and sum in part_out / part_ml for `paged_attention_reduce`. With one partition
// (max_parts == 1) the kernel writes the normalised output directly.
//
// Cache layout per layer: [num_blocks, block_size, kv_heads, head_dim]; slot = block * block_size + offset.
#include "prelude.h"

KERNEL void paged_attention_decode(GLOBAL const float* q, GLOBAL const float* k_cache, GLOBAL const float* v_cache,
                                   GLOBAL float* out, GLOBAL float* part_out, GLOBAL float* part_ml,
                                   GLOBAL const uint* entries, GLOBAL const uint* query_start,
                                   GLOBAL const uint* context_lens, GLOBAL const uint* block_tables, uint max_blocks,
                                   uint num_heads, uint num_kv_heads, uint head_dim, uint block_size,
                                   uint partition_size, uint max_parts, float scale) {
    LOCAL float scores[ATTN_HEAD_CHUNK * ATTN_MAX_PARTITION];
    LOCAL uint slots[ATTN_MAX_PARTITION];
    LOCAL float head_max[ATTN_HEAD_CHUNK];
    LOCAL float head_sum[ATTN_HEAD_CHUNK];

    uint e = group_id(0);
    uint group = num_heads / num_kv_heads;
    uint chunks = (group + ATTN_HEAD_CHUNK - 1) / ATTN_HEAD_CHUNK;
    uint kvh = group_id(1) / chunks;
    uint h0 = kvh * group + (group_id(1) - kvh * chunks) * ATTN_HEAD_CHUNK;
    uint nh = min((uint)ATTN_HEAD_CHUNK, kvh * group + group - h0);
    uint part = group_id(2);
    uint row = entries[2 * e];
    uint seq = entries[2 * e + 1];
    uint ctx = context_lens[seq] + row + 1 - query_start[seq + 1];
    uint start = part * partition_size;
    if (start >= ctx) return;  // this row has fewer partitions than the longest one (uniform per work-group)
    uint len = min(partition_size, ctx - start);
    ulong kv_row = (ulong)num_kv_heads * head_dim;
    ulong kv_off = (ulong)kvh * head_dim;
    GLOBAL const uint* table = block_tables + (ulong)seq * max_blocks;

    for (uint j = local_id(); j < len; j += local_size()) {
        uint tok = start + j;
        uint b = tok / block_size;
        slots[j] = table[b] * block_size + (tok - b * block_size);
    }
    barrier_local();

    // Scores: one sub-group per key, lanes across head_dim (unrolled, so several keys' loads are in flight).
#pragma unroll 2
    for (uint j = sub_id(); j < len; j += num_subs()) {
        GLOBAL const float* kr = k_cache + (ulong)slots[j] * kv_row + kv_off;
        for (uint hh = 0; hh < nh; hh++) {
            GLOBAL const float* qr = q + ((ulong)row * num_heads + h0 + hh) * head_dim;
            float acc = 0.0f;
            for (uint d = sub_lane(); d < head_dim; d += sub_size()) acc += qr[d] * kr[d];
            acc = sub_reduce_add(acc);
            if (sub_lane() == 0) scores[hh * ATTN_MAX_PARTITION + j] = acc * scale;
        }
    }
    barrier_local();

    // Softmax numerators in place; one sub-group per head.
    for (uint hh = sub_id(); hh < nh; hh += num_subs()) {
        LOCAL_PTR float* s = scores + hh * ATTN_MAX_PARTITION;
        float m = NEG_INF;
        for (uint j = sub_lane(); j < len; j += sub_size()) m = fmax(m, s[j]);
        m = sub_reduce_max(m);
        float sum = 0.0f;
        for (uint j = sub_lane(); j < len; j += sub_size()) {
            float p = exp(s[j] - m);
            s[j] = p;
            sum += p;
        }
        sum = sub_reduce_add(sum);
        if (sub_lane() == 0) {
            head_max[hh] = m;
            head_sum[hh] = sum;
        }
    }
    barrier_local();

    // Weighted sum of values: a work-item owns dimension d of every head of the chunk, so each value element is
    // loaded once per key for all of them (the heads of a GQA group share the kv head), with the key loop unrolled
    // so several keys' loads are in flight.
    for (uint d = local_id(); d < head_dim; d += local_size()) {
        float acc[ATTN_HEAD_CHUNK];
        for (uint hh = 0; hh < ATTN_HEAD_CHUNK; hh++) acc[hh] = 0.0f;
        GLOBAL const float* vc = v_cache + kv_off + d;
#pragma unroll 4
        for (uint j = 0; j < len; j++) {
            float v = vc[(ulong)slots[j] * kv_row];
            for (uint hh = 0; hh < ATTN_HEAD_CHUNK; hh++) {
                if (hh < nh) acc[hh] += scores[hh * ATTN_MAX_PARTITION + j] * v;
            }
        }
        for (uint hh = 0; hh < nh; hh++) {
            ulong h = h0 + hh;
            if (max_parts == 1) {
                out[((ulong)row * num_heads + h) * head_dim + d] = acc[hh] / head_sum[hh];
            } else {
                part_out[(((ulong)e * num_heads + h) * max_parts + part) * head_dim + d] = acc[hh];
            }
        }
    }
    if (max_parts > 1 && local_id() < nh) {
        ulong at = (((ulong)e * num_heads + h0 + local_id()) * max_parts + part) * 2;
        part_ml[at] = head_max[local_id()];
        part_ml[at + 1] = head_sum[local_id()];
    }
}

// Combines the partitions of each (entry, head): out = sum_p e^(m_p - M) o_p / sum_p e^(m_p - M) s_p.
// Grid: (entries x ELEM_WG, num_heads).
KERNEL void paged_attention_reduce(GLOBAL float* out, GLOBAL const float* part_out, GLOBAL const float* part_ml,
                                   GLOBAL const uint* entries, GLOBAL const uint* query_start,
                                   GLOBAL const uint* context_lens, uint num_heads, uint head_dim,
                                   uint partition_size, uint max_parts) {
    uint e = group_id(0);
    uint h = group_id(1);
    uint row = entries[2 * e];
    uint seq = entries[2 * e + 1];
    uint ctx = context_lens[seq] + row + 1 - query_start[seq + 1];
    uint parts = (ctx + partition_size - 1) / partition_size;
    ulong base = (ulong)e * num_heads + h;
    GLOBAL const float* ml = part_ml + base * max_parts * 2;
    float m = NEG_INF;
    for (uint p = 0; p < parts; p++) m = fmax(m, ml[2 * p]);
    float total = 0.0f;
    for (uint p = 0; p < parts; p++) total += exp(ml[2 * p] - m) * ml[2 * p + 1];
    for (uint d = local_id(); d < head_dim; d += local_size()) {
        float acc = 0.0f;
        for (uint p = 0; p < parts; p++) acc += exp(ml[2 * p] - m) * part_out[(base * max_parts + p) * head_dim + d];
        out[((ulong)row * num_heads + h) * head_dim + d] = acc / total;
    }
}
