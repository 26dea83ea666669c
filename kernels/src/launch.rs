//! Launch constants shared by the kernel sources and the backends that launch them: work-group sizes, tile shapes
//! and local-memory capacities. `build.rs` includes this file and passes every constant to the kernel compiler as
//! `-D NAME=value`, so the kernels and the host can never disagree.
//!
//! Every constant here is a capacity, not a model shape: head dims, block sizes and sequence lengths stay kernel
//! arguments, so no model fails with "kernel not compiled".

/// Work-group size of the row kernels (RMSNorm, LayerNorm).
pub const ROW_WG: usize = 256;
/// Work-group size of the 1-D / 2-D elementwise kernels (embedding, rope_write_kv, silu, gelu, gather).
pub const ELEM_WG: usize = 256;
/// Heads of a fused q/k/v row per work-group of `rope_write_kv` (one sub-group a head: ELEM_WG / 32 on CUDA).
pub const ROPE_HEADS: usize = 8;
/// Work-group size of the paged attention kernel that takes one query row per work-group (decode).
pub const ATTN_WG: usize = 128;
/// Query heads of one GQA group handled by one decode work-group (larger groups use more work-groups).
pub const ATTN_HEAD_CHUNK: usize = 8;
/// Most keys one decode work-group scores (its local score buffer); longer contexts are split into partitions of
/// at most this many keys and combined by the reduce kernel (split-KV).
pub const ATTN_MAX_PARTITION: usize = 256;
/// Dimensions of a head the decode kernel's value pass sums at a time (its local reduction buffer holds
/// ATTN_HEAD_CHUNK x this many floats); larger heads take several passes.
pub const ATTN_DIM_CHUNK: usize = 256;
/// Loads of 4 key or value elements a work-item of the latency variant of the decode attention
/// (`paged_attention_decode_lat*`) keeps in flight; its first value loads are issued with the key loads.
pub const ATTN_LOADS: usize = 4;
/// Work-group size of the encoder attention kernel (`encoder_attention`, one work-group per (query row, head)):
/// keys scored per step of its online softmax.
pub const ENC_ATTN_WG: usize = 64;
/// Work-group size of the prefill attention kernel.
pub const PREFILL_WG: usize = 256;
/// (query token, head) pairs per prefill work-group.
pub const PREFILL_ROWS: usize = 64;
/// Keys per tile of the prefill kernel's loop over the context.
pub const PREFILL_KEYS: usize = 16;
/// Largest head dim the tiled prefill kernel holds in local memory; larger heads use the per-row kernel.
pub const PREFILL_MAX_HEAD_DIM: usize = 128;
/// Work-group size of the skinny matmul (few rows, sub-group per weight row).
pub const GEMV_WG: usize = 64;
/// Weight rows (output columns) per skinny-matmul work-group.
pub const GEMV_COLS: usize = 16;
/// Input rows per skinny-matmul work-group (their accumulators live in registers).
pub const GEMV_ROWS: usize = 8;
/// Work-group size of the vectorised skinny matmul (16-bit weights, one 16-byte load per lane per step).
pub const GEMV_VEC_WG: usize = 256;
/// Weight rows (output columns) per vectorised skinny-matmul work-group: one per sub-group of 16 lanes (Intel),
/// two per 32-lane warp (NVIDIA).
pub const GEMV_VEC_COLS: usize = 16;
/// Most rows of the prefetching skinny matmul (`matmul_pdla_*`: 16-bit activations and weights, CUDA sm_90+).
pub const GEMV_PDL_ROWS: usize = 4;
/// Work-group size of the asynchronous-copy skinny matmul (`matmul_pdla_*`): its local ring is GEMV_ASYNC_WG x 2
/// rows x GEMV_ASYNC_STAGES steps x 16 bytes (16 KiB).
pub const GEMV_ASYNC_WG: usize = 128;
/// Steps of 16-byte copies (of each of its two rows) a work-item of `matmul_pdla_*` keeps in flight; a power of two.
pub const GEMV_ASYNC_STAGES: usize = 4;
/// Work-group size of `argmax_rows` (one work-group per row: a 128k-entry row of logits is a few loads per
/// work-item).
pub const ARGMAX_WG: usize = 1024;
/// Work-group size of `sample_rows` and `row_logprobs` (one work-group per row of logits).
pub const SAMPLE_WG: usize = 1024;
/// u32 words of one row's sampling parameters (`sample_rows`): temperature, top_p and min_p as f32 bits, top_k, the
/// seed's low and high words, the output position's low and high words.
pub const SAMPLE_PARAM_WORDS: usize = 8;
/// Rejection rounds `sample_rows` tries before it takes the row's most likely token (each round removes the drawn
/// token and every less likely one from the candidates, so a round past this is practically never reached).
pub const SAMPLE_MAX_ROUNDS: usize = 64;
/// Most top log-probs a row returns (OpenAI's limit on `top_logprobs`).
pub const LOGPROBS_MAX_TOP: usize = 20;
/// Input rows per work-item of the work-item matmul (CPU devices); its accumulators are named, not an array.
pub const GEMV_WI_ROWS: usize = 4;
/// Work-group size of the tiled matmul (16 x 16 work-items, 4 x 4 outputs each).
pub const GEMM_WG: usize = 256;
/// Output tile of the tiled matmul: rows of x.
pub const GEMM_TILE_M: usize = 64;
/// Output tile of the tiled matmul: rows of w (output columns).
pub const GEMM_TILE_N: usize = 64;
/// Depth of one local-memory stage of the tiled matmul.
pub const GEMM_TILE_K: usize = 16;

/// Work-group size of the XMX matmul (`xmx.cl`): sub-groups of 16 side by side along the output columns.
pub const XMX_WG: usize = 64;
/// Rows of x one sub-group of the XMX matmul multiplies (a multiple of 8, the matrix built-in's M).
pub const XMX_TILE_M: usize = 32;
/// Output columns one sub-group of the XMX matmul computes (a multiple of 16, the built-in's N).
pub const XMX_TILE_N: usize = 32;

/// Rows of one routed-experts tile (`moe.cl`): the pairs of one expert that share each read of its weights.
pub const MOE_TILE_M: usize = 8;
/// Most experts a mixture-of-experts layer may have (`moe_align` counts them in local memory).
pub const MOE_MAX_EXPERTS: usize = 512;
/// Most experts a token may be routed to (`moe_route` places its picks in local memory).
pub const MOE_MAX_TOP_K: usize = 32;
/// Work-group size of `moe_route` (one row a work-group, at most MOE_MAX_EXPERTS / MOE_ROUTE_WG experts an item).
pub const MOE_ROUTE_WG: usize = 128;
/// Work-group size of the ungrouped routed-experts kernels (`moe_pair_*`, decode).
pub const MOE_PAIR_WG: usize = 128;
/// Output columns of one work-group of `moe_pair_gate_up_*` (two per sub-group: their gate and up rows).
pub const MOE_PAIR_COLS: usize = 8;
/// Weight rows a sub-group of `moe_pair_*` reads side by side; output columns of one work-group of
/// `moe_pair_down_*`.
pub const MOE_PAIR_ROWS: usize = 4;

/// Every constant above by name, as the kernel compiler receives them.
pub const DEFINES: &[(&str, usize)] = &[
    ("ROW_WG", ROW_WG),
    ("ELEM_WG", ELEM_WG),
    ("ROPE_HEADS", ROPE_HEADS),
    ("ATTN_WG", ATTN_WG),
    ("ATTN_HEAD_CHUNK", ATTN_HEAD_CHUNK),
    ("ATTN_MAX_PARTITION", ATTN_MAX_PARTITION),
    ("ATTN_DIM_CHUNK", ATTN_DIM_CHUNK),
    ("ATTN_LOADS", ATTN_LOADS),
    ("ENC_ATTN_WG", ENC_ATTN_WG),
    ("PREFILL_WG", PREFILL_WG),
    ("PREFILL_ROWS", PREFILL_ROWS),
    ("PREFILL_KEYS", PREFILL_KEYS),
    ("PREFILL_MAX_HEAD_DIM", PREFILL_MAX_HEAD_DIM),
    ("GEMV_WG", GEMV_WG),
    ("GEMV_COLS", GEMV_COLS),
    ("GEMV_ROWS", GEMV_ROWS),
    ("GEMV_WI_ROWS", GEMV_WI_ROWS),
    ("GEMV_VEC_WG", GEMV_VEC_WG),
    ("GEMV_VEC_COLS", GEMV_VEC_COLS),
    ("GEMV_PDL_ROWS", GEMV_PDL_ROWS),
    ("GEMV_ASYNC_WG", GEMV_ASYNC_WG),
    ("GEMV_ASYNC_STAGES", GEMV_ASYNC_STAGES),
    ("ARGMAX_WG", ARGMAX_WG),
    ("SAMPLE_WG", SAMPLE_WG),
    ("SAMPLE_PARAM_WORDS", SAMPLE_PARAM_WORDS),
    ("SAMPLE_MAX_ROUNDS", SAMPLE_MAX_ROUNDS),
    ("LOGPROBS_MAX_TOP", LOGPROBS_MAX_TOP),
    ("GEMM_WG", GEMM_WG),
    ("GEMM_TILE_M", GEMM_TILE_M),
    ("GEMM_TILE_N", GEMM_TILE_N),
    ("GEMM_TILE_K", GEMM_TILE_K),
    ("XMX_WG", XMX_WG),
    ("XMX_TILE_M", XMX_TILE_M),
    ("XMX_TILE_N", XMX_TILE_N),
    ("MOE_TILE_M", MOE_TILE_M),
    ("MOE_MAX_EXPERTS", MOE_MAX_EXPERTS),
    ("MOE_MAX_TOP_K", MOE_MAX_TOP_K),
    ("MOE_ROUTE_WG", MOE_ROUTE_WG),
    ("MOE_PAIR_WG", MOE_PAIR_WG),
    ("MOE_PAIR_COLS", MOE_PAIR_COLS),
    ("MOE_PAIR_ROWS", MOE_PAIR_ROWS),
];
