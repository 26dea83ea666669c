// encoder.cl — the encoder (BERT-style) ops: LayerNorm with a bias and an optional residual added first, the exact
// (erf) GELU, and bidirectional attention within each sequence of a flattened batch over the fused q/k/v rows.
// All f32 in and out.
#include "prelude.h"

// out = layernorm(x + residual) * w + b per row of `hidden` values (biased variance); `add` 0: no residual (x
// stands in for it, never read). Grid: rows work-groups of ROW_WG. `out` holds the row's sums while they are
// reduced; each work-item reads back only the elements it wrote.
KERNEL void layer_norm(GLOBAL const float* x, GLOBAL const float* residual, GLOBAL const float* w,
                       GLOBAL const float* b, GLOBAL float* out, uint hidden, float eps, uint add) {
    GRID_DEP_SYNC();
    LOCAL float scratch[ROW_WG];
    ulong base = (ulong)group_id(0) * hidden;
    float s = 0.0f;
    for (uint i = local_id(); i < hidden; i += local_size()) {
        float v = x[base + i];
        if (add) v += residual[base + i];
        out[base + i] = v;
        s += v;
    }
    float mean = wg_reduce_sum(s, scratch) / (float)hidden;
    float ss = 0.0f;
    for (uint i = local_id(); i < hidden; i += local_size()) {
        float d = out[base + i] - mean;
        ss += d * d;
    }
    float inv = 1.0f / sqrt(wg_reduce_sum(ss, scratch) / (float)hidden + eps);
    for (uint i = local_id(); i < hidden; i += local_size()) {
        out[base + i] = ((out[base + i] - mean) * inv) * w[i] + b[i];
    }
}

// out[i] = x[i] * (1 + erf(x[i] / sqrt(2))) / 2 over `len` values. Grid: ceil(len / ELEM_WG) work-groups.
KERNEL void gelu(GLOBAL const float* x, GLOBAL float* out, uint len) {
    GRID_DEP_SYNC();
    uint i = global_id0();
    if (i < len) {
        float v = x[i];
        out[i] = 0.5f * v * (1.0f + erf_f32(v * 0.70710678118654752f));
    }
}

// Output dimensions a work-item of encoder_attention accumulates per pass (heads up to ENC_ATTN_WG x this take one
// pass; larger ones score the keys again per pass).
#define ENC_ATTN_DIMS 2

// q . k over `n` values; `vec`: n a multiple of 4 (and both rows 16-byte aligned).
INLINE float enc_dot(GLOBAL const float* a, GLOBAL const float* b, uint n, uint vec) {
    if (vec) {
        float4 acc = zero4();
        for (uint d = 0; d < n; d += 4) acc = mad4(load4a_f32(a, d), load4a_f32(b, d), acc);
        return hsum4(acc);
    }
    float s = 0.0f;
    for (uint d = 0; d < n; d++) s += a[d] * b[d];
    return s;
}

// qkv[tokens, 3 * heads * head_dim] (each token's q heads, k heads, v heads); query_start[num_seqs + 1] u32 row
// offsets (the host bounds them by the token count); out[tokens, heads * head_dim]. Grid: (tokens work-groups of
// ENC_ATTN_WG, heads): a work-group per (query row, head) finds its sequence by binary search in query_start and
// runs an online softmax over the sequence's keys, ENC_ATTN_WG keys a step (a score per work-item, then each
// work-item sums its output dimensions over the step's keys).
KERNEL void encoder_attention(GLOBAL const float* qkv, GLOBAL const uint* query_start, GLOBAL float* out,
                              uint num_seqs, uint num_heads, uint head_dim, float scale) {
    GRID_DEP_SYNC();
    LOCAL float scratch[ENC_ATTN_WG];
    LOCAL float probs[ENC_ATTN_WG];
    uint row = group_id(0);
    uint h = group_id(1);
    uint lid = local_id();
    // The row's sequence: the last s < num_seqs with query_start[s] <= row.
    uint lo = 0;
    uint hi = num_seqs;
    while (hi - lo > 1) {
        uint mid = lo + (hi - lo) / 2;
        if (query_start[mid] <= row) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    uint t0 = query_start[lo];
    uint t1 = query_start[lo + 1];
    ulong width = (ulong)num_heads * head_dim;
    ulong stride = 3 * width;
    GLOBAL const float* q = qkv + row * stride + (ulong)h * head_dim;
    GLOBAL const float* k = qkv + width + (ulong)h * head_dim;
    GLOBAL const float* v = qkv + 2 * width + (ulong)h * head_dim;
    GLOBAL float* o = out + row * width + (ulong)h * head_dim;
    uint vec = (head_dim & 3u) == 0;
    for (uint d0 = 0; d0 < head_dim; d0 += ENC_ATTN_WG * ENC_ATTN_DIMS) {
        float m = NEG_INF;
        float l = 0.0f;
        float acc[ENC_ATTN_DIMS];
#pragma unroll
        for (uint c = 0; c < ENC_ATTN_DIMS; c++) acc[c] = 0.0f;
        for (uint j0 = t0; j0 < t1; j0 += ENC_ATTN_WG) {
            uint j = j0 + lid;
            float s = j < t1 ? enc_dot(q, k + j * stride, head_dim, vec) * scale : NEG_INF;
            float m_new = fmax(m, wg_reduce_max(s, scratch));
            float p = j < t1 ? exp(s - m_new) : 0.0f;
            probs[lid] = p;  // visible to the work-group after the reduction's barrier
            float alpha = exp(m - m_new);
            l = l * alpha + wg_reduce_sum(p, scratch);
            m = m_new;
            uint n = t1 - j0 < ENC_ATTN_WG ? t1 - j0 : ENC_ATTN_WG;
#pragma unroll
            for (uint c = 0; c < ENC_ATTN_DIMS; c++) acc[c] *= alpha;
            for (uint jj = 0; jj < n; jj++) {
                float pj = probs[jj];
                GLOBAL const float* vj = v + (ulong)(j0 + jj) * stride;
#pragma unroll
                for (uint c = 0; c < ENC_ATTN_DIMS; c++) {
                    uint d = d0 + c * ENC_ATTN_WG + lid;
                    if (d < head_dim) acc[c] += pj * vj[d];
                }
            }
            // The next step writes probs only after its first reduction's barrier, past every read above.
        }
        float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
        for (uint c = 0; c < ENC_ATTN_DIMS; c++) {
            uint d = d0 + c * ENC_ATTN_WG + lid;
            if (d < head_dim) o[d] = acc[c] * inv;
        }
    }
}
