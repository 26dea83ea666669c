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
// unnormalised output, max and sum in part_out / part_ml for `paged_attention_reduce`, or with `fuse_reduce` (the
// CUDA backend; max_parts <= ATTN_MAX_PARTITION) the last of a row's work-groups to finish combines them itself
// (`counters`: one zeroed count per (entry, head chunk), which that work-group resets). With one partition
// (max_parts == 1) the kernel writes the normalised output directly. `out` is f32 or, after `out_kind` (1 bf16,
// 2 f16), the 16-bit input of the output projection's matrix multiply.
//
// Sliding-window layers (`window` > 0; 0 means none): a row at position p sees keys p - window + 1 .. p, and its
// partitions count from the first of them, so a long context costs the window's keys, not the context's. Scores
// are multiplied by `scale` and, with `softcap` > 0, capped as softcap * tanh(score / softcap) (Gemma 2). With
// `has_sinks`, head h's learned sink logit sinks[h] joins each row's softmax denominator (gpt-oss: attention may put
// weight on no key; `attn_norm`).
//
// Cache layout per layer: [num_blocks, block_size, kv_heads, head_dim]; slot = block * block_size + offset.
// head_dim must be a multiple of 4 (4-wide loads and stores; the host checks it).
#include "prelude.h"

// The queries of the chunk's heads, dimensions d0 .. d0 + ATTN_DIM_CHUNK, into local memory (4-wide).
INLINE void stage_q(LOCAL_PTR float4* red, GLOBAL const float* q, ulong q_base, uint nh, uint head_dim, uint d0) {
    uint quads = min((uint)ATTN_DIM_CHUNK, head_dim - d0) / 4;
    for (uint i = local_id(); i < nh * quads; i += local_size()) {
        uint hh = i / quads;
        red[i] = load4a_f32(q, q_base + (ulong)hh * head_dim + d0 + 4 * (i - hh * quads));
    }
}

// acc[hh] += k . q[hh] for every head hh < nh of the chunk: one 4-wide piece `c` of a key row against the staged
// queries (`red`, `quads` pieces per head).
INLINE void add_key_dots(float* acc, float4 k4, LOCAL_PTR const float4* red, uint c, uint quads, uint nh) {
    for (uint hh = 0; hh < ATTN_HEAD_CHUNK; hh++) {
        if (hh < nh) acc[hh] += dot4(k4, red[hh * quads + c]);
    }
}

// acc[hh] += p[hh][j] * v for every head hh < nh of the chunk: one value row weighted by each head's softmax
// numerator (`scores`, ATTN_MAX_PARTITION per head).
INLINE void add_weighted_value(float4* acc, float4 v, LOCAL_PTR const float* scores, uint j, uint nh) {
    for (uint hh = 0; hh < ATTN_HEAD_CHUNK; hh++) {
        if (hh < nh) acc[hh] = axpy4(scores[hh * ATTN_MAX_PARTITION + j], v, acc[hh]);
    }
}

INLINE void decode_body(GLOBAL const float* q, GLOBAL const float* kf, GLOBAL const ushort* kh, GLOBAL const float* vf,
                        GLOBAL const ushort* vh, uint kind, GLOBAL float* out, GLOBAL float* part_out,
                        GLOBAL float* part_ml, GLOBAL uint* counters, GLOBAL const uint* entries, GLOBAL const uint* query_start,
                        GLOBAL const uint* context_lens, GLOBAL const uint* block_tables, uint max_blocks,
                        uint num_heads, uint num_kv_heads, uint head_dim, uint block_size, uint partition_size,
                        uint max_parts, float scale, uint out_kind, uint fuse_reduce, uint lat, uint window,
                        float softcap, GLOBAL const float* sinks, uint has_sinks, LOCAL_PTR float* scores,
                        LOCAL_PTR uint* slots,
                        LOCAL_PTR float* head_max, LOCAL_PTR float* head_sum, LOCAL_PTR float4* red) {
    uint e = group_id(0);
    uint group = num_heads / num_kv_heads;
    uint chunks = (group + ATTN_HEAD_CHUNK - 1) / ATTN_HEAD_CHUNK;
    uint kvh = group_id(1) / chunks;
    uint h0 = kvh * group + (group_id(1) - kvh * chunks) * ATTN_HEAD_CHUNK;
    uint nh = min((uint)ATTN_HEAD_CHUNK, kvh * group + group - h0);
    uint part = group_id(2);
    uint row = entries[2 * e];
    uint seq = entries[2 * e + 1];
    uint start = part * partition_size;
    GLOBAL const uint* table = block_tables + (ulong)seq * max_blocks;
    // The block of this work-item's first key, read together with the context length (it depends only on the
    // sequence): one memory round trip fewer before the keys.
    uint b_first = (start + local_id()) / block_size;
    uint blk_first = b_first < max_blocks ? table[b_first] : 0u;
    uint ctx = context_lens[seq] + row + 1 - query_start[seq + 1];
    uint lo = window != 0u && ctx > window ? ctx - window : 0u;  // the row's first visible key
    start += lo;
    if (start >= ctx) return;  // this row has fewer partitions than the longest one (uniform per work-group)
    uint len = min(partition_size, ctx - start);
    ulong kv_row = (ulong)num_kv_heads * head_dim;
    ulong kv_off = (ulong)kvh * head_dim;
    ulong q_base = ((ulong)row * num_heads + h0) * head_dim;

    for (uint j = local_id(); j < len; j += local_size()) {
        uint tok = start + j;
        uint b = tok / block_size;
        slots[j] = (j == local_id() && lo == 0u ? blk_first : table[b]) * block_size + (tok - b * block_size);
    }
    stage_q(red, q, q_base, nh, head_dim, 0);  // in flight together with the block-table loads
    barrier_local();

    // With `lat` (the latency variant, a constant of each entry point): the value pass's first ATTN_LOADS rows of
    // each work-item (first dimension chunk) are issued now, so they are in flight together with the key loads and
    // the value pass starts without a memory round trip; both passes then keep ATTN_LOADS loads in flight per
    // work-item. It costs registers (80 against 64 for the bf16 cache on sm_90), so the CUDA backend takes it for
    // few rows only, where the kernel waits on memory latency, not on bandwidth.
    uint vquads = min((uint)ATTN_DIM_CHUNK, head_dim) / 4;
    uint vgroups = local_size() / vquads;
    uint vg = local_id() / vquads;
    ulong vcol = kv_off + 4 * (local_id() - vg * vquads);
    float4 vpre[ATTN_LOADS];
    if (lat) {
#pragma unroll
        for (uint u = 0; u < ATTN_LOADS; u++) {
            uint j = vg + u * vgroups;
            vpre[u] = (vg < vgroups && j < len) ? load4_kv_raw(vf, vh, vcol + (ulong)slots[j] * kv_row, kind) : zero4();
        }
    }

    // Scores: T work-items per key (T a power of two, at most 8, as many as the work-group has to spare), each
    // summing every T-th 4-wide piece of the key row against the query of every head of the chunk, staged in local
    // memory. A key row is thus read once for all heads, and neighbouring work-items read neighbouring 16 bytes of
    // it. The T partial sums land in scores[hh][t * len + j] and are added up by the softmax below.
    uint T = 1;
    while (T < 8 && 2 * T * len <= local_size()) T *= 2;
    uint t = local_id() - (local_id() / T) * T;
    uint key_step = local_size() / T;
    for (uint d0 = 0; d0 < head_dim; d0 += ATTN_DIM_CHUNK) {
        uint quads = min((uint)ATTN_DIM_CHUNK, head_dim - d0) / 4;
        if (d0 > 0) {
            stage_q(red, q, q_base, nh, head_dim, d0);
            barrier_local();
        }
        for (uint j = local_id() / T; j < len; j += key_step) {
            ulong kr = (ulong)slots[j] * kv_row + kv_off + d0;
            float acc[ATTN_HEAD_CHUNK];
            for (uint hh = 0; hh < ATTN_HEAD_CHUNK; hh++) acc[hh] = 0.0f;
            if (lat) {
                // ATTN_LOADS pieces of the key row in flight at once, then their dot products.
                for (uint c0 = t; c0 < quads; c0 += T * ATTN_LOADS) {
                    float4 kraw[ATTN_LOADS];
#pragma unroll
                    for (uint u = 0; u < ATTN_LOADS; u++) {
                        uint c = c0 + u * T;
                        kraw[u] = c < quads ? load4_kv_raw(kf, kh, kr + 4 * c, kind) : zero4();
                    }
#pragma unroll
                    for (uint u = 0; u < ATTN_LOADS; u++) {
                        uint c = c0 + u * T;
                        if (c < quads) add_key_dots(acc, kv_widen(kraw[u], kind), red, c, quads, nh);
                    }
                }
            } else {
                for (uint c = t; c < quads; c += T) {
                    add_key_dots(acc, load4_kv(kf, kh, kr + 4 * c, kind), red, c, quads, nh);
                }
            }
            for (uint hh = 0; hh < nh; hh++) {
                uint at = hh * ATTN_MAX_PARTITION + t * len + j;
                scores[at] = d0 == 0 ? acc[hh] : scores[at] + acc[hh];
            }
        }
        barrier_local();  // scores complete for this chunk; red is restaged by the next one
    }

    // Softmax numerators in place; one sub-group per head. The first pass adds up the T partial sums of each key.
    for (uint hh = sub_id(); hh < nh; hh += num_subs()) {
        LOCAL_PTR float* s = scores + hh * ATTN_MAX_PARTITION;
        float m = NEG_INF;
        for (uint j = sub_lane(); j < len; j += sub_size()) {
            float v = s[j];
            for (uint tt = 1; tt < T; tt++) v += s[tt * len + j];
            v *= scale;
            if (softcap > 0.0f) v = softcap * tanh(v / softcap);
            s[j] = v;
            m = fmax(m, v);
        }
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

    // Weighted sum of values, ATTN_DIM_CHUNK dimensions at a time: a work-item owns 4 consecutive dimensions of
    // every head of the chunk (each value element is loaded once, 4-wide, for all heads of the GQA group) and a
    // stride of the keys; the key groups are then summed through local memory.
    for (uint d0 = 0; d0 < head_dim; d0 += ATTN_DIM_CHUNK) {
        uint quads = min((uint)ATTN_DIM_CHUNK, head_dim - d0) / 4;
        uint groups = local_size() / quads;
        uint g = local_id() / quads;
        uint c = local_id() - g * quads;
        float4 acc[ATTN_HEAD_CHUNK];
        for (uint hh = 0; hh < ATTN_HEAD_CHUNK; hh++) acc[hh] = zero4();
        if (g < groups) {
            ulong vc = kv_off + d0 + 4 * c;
            if (lat) {
                uint jb = g;
                if (d0 == 0) {  // the rows loaded before the key pass
#pragma unroll
                    for (uint u = 0; u < ATTN_LOADS; u++) {
                        uint j = g + u * groups;
                        if (j < len) add_weighted_value(acc, kv_widen(vpre[u], kind), scores, j, nh);
                    }
                    jb = g + ATTN_LOADS * groups;
                }
                for (; jb < len; jb += ATTN_LOADS * groups) {
                    float4 vraw[ATTN_LOADS];
#pragma unroll
                    for (uint u = 0; u < ATTN_LOADS; u++) {
                        uint j = jb + u * groups;
                        vraw[u] = j < len ? load4_kv_raw(vf, vh, vc + (ulong)slots[j] * kv_row, kind) : zero4();
                    }
#pragma unroll
                    for (uint u = 0; u < ATTN_LOADS; u++) {
                        uint j = jb + u * groups;
                        if (j < len) add_weighted_value(acc, kv_widen(vraw[u], kind), scores, j, nh);
                    }
                }
            } else {
#pragma unroll 4
                for (uint j = g; j < len; j += groups) {
                    add_weighted_value(acc, load4_kv(vf, vh, vc + (ulong)slots[j] * kv_row, kind), scores, j, nh);
                }
            }
        }
        for (uint s = 0; s < groups; s++) {
            if (g == s) {
                for (uint hh = 0; hh < ATTN_HEAD_CHUNK; hh++) {
                    if (hh < nh) red[hh * quads + c] = s == 0 ? acc[hh] : add4(red[hh * quads + c], acc[hh]);
                }
            }
            barrier_local();
        }
        for (uint i = local_id(); i < nh * quads; i += local_size()) {
            uint hh = i / quads;
            uint cc = i - hh * quads;
            ulong h = h0 + hh;
            float4 v = red[i];
            if (max_parts == 1) {
                float norm = attn_norm(head_max[hh], head_sum[hh], has_sinks ? sinks[h] : NEG_INF);
                store4_act(out, ((ulong)row * num_heads + h) * head_dim + d0 + 4 * cc, scale4(v, norm), out_kind);
            } else {
                store4a_f32(part_out, (((ulong)e * num_heads + h) * max_parts + part) * head_dim + d0 + 4 * cc, v);
            }
        }
        barrier_local();  // red is reused by the next dimension chunk
    }
    if (max_parts > 1 && local_id() < nh) {
        ulong at = (((ulong)e * num_heads + h0 + local_id()) * max_parts + part) * 2;
        part_ml[at] = head_max[local_id()];
        part_ml[at + 1] = head_sum[local_id()];
    }
    if (max_parts == 1 || fuse_reduce == 0) return;

    // Fused reduction: publish this partition, count it, and let the row's last work-group combine them all.
    global_fence();
    barrier_local();
    uint parts = (ctx - lo + partition_size - 1) / partition_size;
    if (local_id() == 0) {
        GLOBAL uint* c = counters + (ulong)e * (num_kv_heads * chunks) + group_id(1);
        uint done = counter_add(c, 1u) + 1u;
        slots[0] = done == parts ? 1u : 0u;
        if (done == parts) *c = 0u;  // every partition has counted: ready for the next launch
    }
    barrier_local();
    if (slots[0] == 0u) return;  // uniform per work-group
    global_fence();
    // Weights of the partitions per head (one sub-group per head), then the weighted sum of their outputs.
    for (uint hh = sub_id(); hh < nh; hh += num_subs()) {
        ulong base = ((ulong)e * num_heads + h0 + hh) * max_parts * 2;
        float m = NEG_INF;
        for (uint p = sub_lane(); p < parts; p += sub_size()) m = fmax(m, load_coherent(part_ml, base + 2 * p));
        m = sub_reduce_max(m);
        float total = 0.0f;
        for (uint p = sub_lane(); p < parts; p += sub_size()) {
            float w = exp(load_coherent(part_ml, base + 2 * p) - m);
            scores[hh * ATTN_MAX_PARTITION + p] = w;
            total += w * load_coherent(part_ml, base + 2 * p + 1);
        }
        total = sub_reduce_add(total);
        if (sub_lane() == 0) {
            head_max[hh] = m;
            head_sum[hh] = total;
        }
    }
    barrier_local();
    for (uint i = local_id(); i < nh * head_dim; i += local_size()) {
        uint hh = i / head_dim;
        uint d = i - hh * head_dim;
        ulong h = h0 + hh;
        ulong base = ((ulong)e * num_heads + h) * max_parts * head_dim + d;
        float acc = 0.0f;
        for (uint p = 0; p < parts; p++) acc += scores[hh * ATTN_MAX_PARTITION + p] * load_coherent(part_out, base + (ulong)p * head_dim);
        float norm = attn_norm(head_max[hh], head_sum[hh], has_sinks ? sinks[h] : NEG_INF);
        store_act(out, (GLOBAL ushort*)out, ((ulong)row * num_heads + h) * head_dim + d, acc * norm, out_kind);
    }
}

#define DECODE_KERNEL(NAME, T, KIND, LAT)                                                                          \
    KERNEL void NAME(GLOBAL const float* q, GLOBAL const T* k_cache, GLOBAL const T* v_cache, GLOBAL float* out,     \
                     GLOBAL float* part_out, GLOBAL float* part_ml, GLOBAL uint* counters, GLOBAL const uint* entries, \
                     GLOBAL const uint* query_start, GLOBAL const uint* context_lens, GLOBAL const uint* block_tables, \
                     uint max_blocks, uint num_heads, uint num_kv_heads, uint head_dim, uint block_size,            \
                     uint partition_size, uint max_parts, float scale, uint out_kind, uint fuse_reduce,             \
                     uint window, float softcap, GLOBAL const float* sinks, uint has_sinks) {                       \
        GRID_DEP_SYNC();                                                                                            \
        LOCAL float scores[ATTN_HEAD_CHUNK * ATTN_MAX_PARTITION];                                                   \
        LOCAL uint slots[ATTN_MAX_PARTITION];                                                                       \
        LOCAL float head_max[ATTN_HEAD_CHUNK];                                                                      \
        LOCAL float head_sum[ATTN_HEAD_CHUNK];                                                                      \
        LOCAL float4 red[ATTN_HEAD_CHUNK * ATTN_DIM_CHUNK / 4];                                                     \
        decode_body(q, (GLOBAL const float*)k_cache, (GLOBAL const ushort*)k_cache, (GLOBAL const float*)v_cache,   \
                    (GLOBAL const ushort*)v_cache, KIND, out, part_out, part_ml, counters, entries, query_start,     \
                    context_lens, block_tables, max_blocks, num_heads, num_kv_heads, head_dim, block_size,          \
                    partition_size, max_parts, scale, out_kind, fuse_reduce, LAT, window, softcap, sinks,           \
                    has_sinks, scores, slots, head_max, head_sum, red);                                             \
    }
// The f32 cache, and 16-bit caches (bf16, f16) whose values are widened to f32 as they are loaded.
DECODE_KERNEL(paged_attention_decode, float, 0, 0)
DECODE_KERNEL(paged_attention_decode_bf16, ushort, 1, 0)
DECODE_KERNEL(paged_attention_decode_f16, ushort, 2, 0)
// The latency variant of each (`lat`): the CUDA backend's decode kernel for few rows.
DECODE_KERNEL(paged_attention_decode_lat, float, 0, 1)
DECODE_KERNEL(paged_attention_decode_lat_bf16, ushort, 1, 1)
DECODE_KERNEL(paged_attention_decode_lat_f16, ushort, 2, 1)

// Combines the partitions of each (entry, head): out = sum_p e^(m_p - M) o_p / sum_p e^(m_p - M) s_p, in one pass
// over the partitions with a running maximum (each step's loads do not wait for the step before, so they overlap).
// Grid: (entries x ELEM_WG, num_heads). `out` as in the decode kernel (`out_kind`); `window` and the sinks as there.
KERNEL void paged_attention_reduce(GLOBAL float* out, GLOBAL const float* part_out, GLOBAL const float* part_ml,
                                   GLOBAL const uint* entries, GLOBAL const uint* query_start,
                                   GLOBAL const uint* context_lens, uint num_heads, uint head_dim,
                                   uint partition_size, uint max_parts, uint out_kind, uint window,
                                   GLOBAL const float* sinks, uint has_sinks) {
    GRID_DEP_SYNC();
    uint e = group_id(0);
    uint h = group_id(1);
    uint row = entries[2 * e];
    uint seq = entries[2 * e + 1];
    uint ctx = context_lens[seq] + row + 1 - query_start[seq + 1];
    uint lo = window != 0u && ctx > window ? ctx - window : 0u;
    uint parts = (ctx - lo + partition_size - 1) / partition_size;
    ulong base = (ulong)e * num_heads + h;
    GLOBAL const float* ml = part_ml + base * max_parts * 2;
    for (uint d = local_id(); d < head_dim; d += local_size()) {
        float m = NEG_INF;
        float total = 0.0f;
        float acc = 0.0f;
#pragma unroll 8
        for (uint p = 0; p < parts; p++) {
            float mp = ml[2 * p];  // a partition's maximum is finite: it has at least one key
            float sp = ml[2 * p + 1];
            float op = part_out[(base * max_parts + p) * head_dim + d];
            float mn = fmax(m, mp);
            float a = exp(m - mn);
            float b = exp(mp - mn);
            total = total * a + sp * b;
            acc = acc * a + op * b;
            m = mn;
        }
        float norm = attn_norm(m, total, has_sinks ? sinks[h] : NEG_INF);
        store_act(out, (GLOBAL ushort*)out, ((ulong)row * num_heads + h) * head_dim + d, acc * norm, out_kind);
    }
}
