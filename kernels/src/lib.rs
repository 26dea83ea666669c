//! Portable kernel sources and their ahead-of-time build to SPIR-V.
//!
//! Each `src/cl/<module>.cl` is one portable source (OpenCL C over the macros of `src/cl/prelude.h`, so the same
//! file also compiles as CUDA C++ through NVRTC). `build.rs` compiles every module to SPIR-V 1.4 (or embeds the
//! committed `spirv/<module>.spv` on machines without clang-15) and this crate hands out the bytes, the source and
//! the kernel entry points. Launch constants shared with the kernels live in [`launch`]; every shape of a model
//! (head dim, block size, lengths) is a kernel argument, so no model fails with "kernel not compiled".
//!
//! Argument layouts are documented at the top of each source and mirrored by the launching backend
//! (`rserve_engine::backend::opencl`).

pub mod launch;

/// One SPIR-V module: the compiled form of one kernel source.
#[derive(Debug)]
pub struct Module {
    /// The source file's stem (`norm` for `src/cl/norm.cl`).
    pub name: &'static str,
    /// SPIR-V 1.4 words as bytes (little-endian), OpenCL "Kernel" dialect.
    pub spirv: &'static [u8],
    /// The PVC native binary (zebin from `ocloc -device pvc`, see `build.rs`); empty when there is none.
    pub pvc: &'static [u8],
    /// The OpenCL C source (it includes `prelude.h`, see [`PRELUDE`]).
    pub source: &'static str,
}

include!(concat!(env!("OUT_DIR"), "/modules.rs"));

/// The prelude every source includes (`#include "prelude.h"`).
pub const PRELUDE: &str = include_str!("cl/prelude.h");

/// The entry points of each module. A backend creates all of them when it starts; a test checks this table against
/// the entry points of the SPIR-V itself.
pub const KERNELS: &[(&str, &[&str])] = &[
    (
        "attention_decode",
        &[
            "paged_attention_decode",
            "paged_attention_decode_bf16",
            "paged_attention_decode_f16",
            "paged_attention_decode_lat",
            "paged_attention_decode_lat_bf16",
            "paged_attention_decode_lat_f16",
            "paged_attention_reduce",
        ],
    ),
    ("attention_prefill", &["paged_attention_prefill", "paged_attention_prefill_bf16", "paged_attention_prefill_f16"]),
    ("elementwise", &["gated_act", "gated_act_bf16", "gated_act_f16", "soft_cap", "gather_rows", "feed_tokens"]),
    ("embedding", &["embedding_f32", "embedding_bf16", "embedding_f16"]),
    ("encoder", &["layer_norm", "gelu", "encoder_attention"]),
    ("kv_cache", &["rope_write_kv", "rope_write_kv_bf16", "rope_write_kv_f16"]),
    (
        "matmul",
        &[
            "matmul_rows_f32",
            "matmul_rows_bf16",
            "matmul_rows_f16",
            "matmul_tiled_f32",
            "matmul_tiled_bf16",
            "matmul_tiled_f16",
            "matmul_wi_f32",
            "matmul_wi_bf16",
            "matmul_wi_f16",
            "matmul_vec_bf16",
            "matmul_vec_f16",
            "matmul_pdla_bf16",
            "matmul_pdla_f16",
            "matmul_rows_x16_bf16",
            "matmul_rows_x16_f16",
            "matmul_tiled_x16_bf16",
            "matmul_tiled_x16_f16",
            "matmul_wi_x16_bf16",
            "matmul_wi_x16_f16",
            "matmul_vec_x16_bf16",
            "matmul_vec_x16_f16",
        ],
    ),
    (
        "moe",
        &[
            "moe_route",
            "moe_align",
            "moe_matmul_f32",
            "moe_matmul_bf16",
            "moe_matmul_f16",
            "moe_matmul_vec_bf16",
            "moe_matmul_vec_f16",
            "moe_matmul_tiled_f32",
            "moe_matmul_tiled_bf16",
            "moe_matmul_tiled_f16",
            "moe_combine",
            "moe_bias",
            "moe_pair_gate_up_f32",
            "moe_pair_gate_up_bf16",
            "moe_pair_gate_up_f16",
            "moe_pair_down_f32",
            "moe_pair_down_bf16",
            "moe_pair_down_f16",
        ],
    ),
    ("norm", &["rms_norm", "rms_norm_bf16", "rms_norm_f16", "add_rms_norm", "add_rms_norm_bf16", "add_rms_norm_f16"]),
    ("sampling", &["argmax_rows", "mask_logits", "adjust_logits", "sample_rows", "row_logprobs"]),
    ("xmx", &["matmul_xmx_bf16"]),
    ("xmx_emu", &["matmul_xmx_bf16_emu"]),
];

/// Which devices can build a module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Every backend (OpenCL and Level Zero from SPIR-V, CUDA through NVRTC and `prelude.h`).
    Portable,
    /// OpenCL C only (OpenCL, Level Zero): sub-group built-ins CUDA does not have.
    OpenClOnly,
    /// Devices with Intel's sub-group matrix multiply-accumulate at sub-group size 16 (PVC): the Level Zero backend
    /// builds it there only.
    MatrixEngine,
}

/// Which devices can build module `name`.
pub fn target(name: &str) -> Target {
    match name {
        "xmx" => Target::MatrixEngine,
        "xmx_emu" => Target::OpenClOnly,
        _ => Target::Portable,
    }
}

/// The module named `name`.
pub fn module(name: &str) -> Option<&'static Module> {
    MODULES.iter().find(|m| m.name == name)
}

/// Kernels no `Op` launches: the CUDA backend's greedy decode picks tokens on the device with `argmax_rows`, so a
/// step reads back ids instead of logits.
pub const OUTSIDE_OPS: &[&str] = &["argmax_rows"];

/// An entry point by the element type it reads or writes (weights, 16-bit activations, KV cache):
/// `[f32, bf16, f16]`, indexed by [`ElemType`].
pub type ByType = [&'static str; 3];

/// The element types kernels are compiled for, in the order of a [`ByType`] table (and the `kind` argument some
/// kernels take: 0 f32, 1 bf16, 2 f16).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElemType {
    F32 = 0,
    Bf16 = 1,
    F16 = 2,
}

impl ElemType {
    /// The entry point of `table` for this type.
    pub fn pick(self, table: &ByType) -> &'static str {
        table[self as usize]
    }
}

/// The entry-point families of the ops, by element type. A test checks every name against [`KERNELS`].
pub mod names {
    use super::ByType;
    pub const EMBEDDING: ByType = ["embedding_f32", "embedding_bf16", "embedding_f16"];
    /// By output type.
    pub const RMS_NORM: ByType = ["rms_norm", "rms_norm_bf16", "rms_norm_f16"];
    /// By output type.
    pub const ADD_RMS_NORM: ByType = ["add_rms_norm", "add_rms_norm_bf16", "add_rms_norm_f16"];
    /// By output type.
    pub const GATED_ACT: ByType = ["gated_act", "gated_act_bf16", "gated_act_f16"];
    pub const SOFT_CAP: &str = "soft_cap";
    pub const GATHER_ROWS: &str = "gather_rows";
    pub const FEED_TOKENS: &str = "feed_tokens";
    /// One work-group (`ROW_WG`) per row: LayerNorm with a bias, the residual added first when given.
    pub const LAYER_NORM: &str = "layer_norm";
    /// The exact (erf) GELU, elementwise.
    pub const GELU: &str = "gelu";
    /// One work-group (`ENC_ATTN_WG`) per (query row, head): bidirectional attention within a sequence.
    pub const ENCODER_ATTENTION: &str = "encoder_attention";
    /// By KV-cache type.
    pub const ROPE_WRITE_KV: ByType = ["rope_write_kv", "rope_write_kv_bf16", "rope_write_kv_f16"];
    /// By KV-cache type.
    pub const ATTN_DECODE: ByType =
        ["paged_attention_decode", "paged_attention_decode_bf16", "paged_attention_decode_f16"];
    /// By KV-cache type: the latency variant (key and value loads in flight together).
    pub const ATTN_DECODE_LAT: ByType =
        ["paged_attention_decode_lat", "paged_attention_decode_lat_bf16", "paged_attention_decode_lat_f16"];
    pub const ATTN_REDUCE: &str = "paged_attention_reduce";
    /// By KV-cache type.
    pub const ATTN_PREFILL: ByType =
        ["paged_attention_prefill", "paged_attention_prefill_bf16", "paged_attention_prefill_f16"];
    /// By weight type: sub-group rows (decode on GPUs).
    pub const MATMUL_ROWS: ByType = ["matmul_rows_f32", "matmul_rows_bf16", "matmul_rows_f16"];
    /// By weight type: local-memory tiles (prefill on GPUs).
    pub const MATMUL_TILED: ByType = ["matmul_tiled_f32", "matmul_tiled_bf16", "matmul_tiled_f16"];
    /// By weight type: a work-item per output column (CPU OpenCL devices).
    pub const MATMUL_WI: ByType = ["matmul_wi_f32", "matmul_wi_bf16", "matmul_wi_f16"];
    /// By weight type (16-bit only; the f32 slot is never launched): 16-byte loads, decode on GPUs.
    pub const MATMUL_VEC: ByType = ["", "matmul_vec_bf16", "matmul_vec_f16"];
    /// By weight type (16-bit only): the asynchronous-copy GEMV of 16-bit activations (CUDA sm_90+).
    pub const MATMUL_PDLA: ByType = ["", "matmul_pdla_bf16", "matmul_pdla_f16"];
    /// By weight type, with 16-bit activations in the weight's type (none for f32 weights).
    pub const MATMUL_ROWS_X16: ByType = ["", "matmul_rows_x16_bf16", "matmul_rows_x16_f16"];
    pub const MATMUL_TILED_X16: ByType = ["", "matmul_tiled_x16_bf16", "matmul_tiled_x16_f16"];
    pub const MATMUL_WI_X16: ByType = ["", "matmul_wi_x16_bf16", "matmul_wi_x16_f16"];
    pub const MATMUL_VEC_X16: ByType = ["", "matmul_vec_x16_bf16", "matmul_vec_x16_f16"];
    pub const ARGMAX_ROWS: &str = "argmax_rows";
    pub const MASK_LOGITS: &str = "mask_logits";
    /// One work-item per logit edit (penalties, bias).
    pub const ADJUST_LOGITS: &str = "adjust_logits";
    /// One work-group (`SAMPLE_WG`) per row: the draw.
    pub const SAMPLE_ROWS: &str = "sample_rows";
    /// One work-group (`SAMPLE_WG`) per row: log-sum-exp, the chosen token's log-prob, the top alternatives.
    pub const ROW_LOGPROBS: &str = "row_logprobs";
    pub const MOE_ROUTE: &str = "moe_route";
    /// One work-group (`ELEM_WG`) groups every pair of a step.
    pub const MOE_ALIGN: &str = "moe_align";
    /// By weight type: the grouped multiply over the experts' tiles.
    pub const MOE_MATMUL: ByType = ["moe_matmul_f32", "moe_matmul_bf16", "moe_matmul_f16"];
    /// By weight type (16-bit only, k a multiple of 8): 16-byte weight loads.
    pub const MOE_MATMUL_VEC: ByType = ["", "moe_matmul_vec_bf16", "moe_matmul_vec_f16"];
    /// By weight type: local-memory tiles over several tiles of one expert (many pairs per expert: prefill).
    pub const MOE_MATMUL_TILED: ByType = ["moe_matmul_tiled_f32", "moe_matmul_tiled_bf16", "moe_matmul_tiled_f16"];
    pub const MOE_COMBINE: &str = "moe_combine";
    pub const MOE_BIAS: &str = "moe_bias";
    /// By weight type: a few tokens' pairs without grouping (decode), gate/up with the activation, then down with
    /// the weighted sum.
    pub const MOE_PAIR_GATE_UP: ByType = ["moe_pair_gate_up_f32", "moe_pair_gate_up_bf16", "moe_pair_gate_up_f16"];
    pub const MOE_PAIR_DOWN: ByType = ["moe_pair_down_f32", "moe_pair_down_bf16", "moe_pair_down_f16"];
    /// bf16 weights on the matrix engine (`xmx.cl`, PVC).
    pub const MATMUL_XMX: &str = "matmul_xmx_bf16";
    /// The same kernel with the matrix built-in emulated (OpenCL, the CPU runtime in CI).
    pub const MATMUL_XMX_EMU: &str = "matmul_xmx_bf16_emu";
}

/// The work-group size each kernel is launched with: the sizes its local arrays were compiled for.
pub fn work_group(kernel: &str) -> usize {
    use launch::*;
    match kernel {
        k if k.starts_with("rms_norm") || k.starts_with("add_rms_norm") || k == "layer_norm" => ROW_WG,
        "encoder_attention" => ENC_ATTN_WG,
        k if k.starts_with("paged_attention_decode") => ATTN_WG,
        k if k.starts_with("paged_attention_prefill") => PREFILL_WG,
        k if k.starts_with("moe_matmul_tiled") => GEMM_WG,
        k if k.starts_with("matmul_rows") || k.starts_with("moe_matmul") => GEMV_WG,
        "moe_route" => MOE_ROUTE_WG,
        k if k.starts_with("moe_pair") => MOE_PAIR_WG,
        k if k.starts_with("matmul_vec") => GEMV_VEC_WG,
        k if k.starts_with("matmul_pdla") => GEMV_ASYNC_WG,
        k if k.starts_with("matmul_tiled") => GEMM_WG,
        k if k.starts_with("matmul_xmx") => XMX_WG,
        "argmax_rows" => ARGMAX_WG,
        "sample_rows" | "row_logprobs" => SAMPLE_WG,
        _ => ELEM_WG,
    }
}

/// Whether the tiled prefill kernel takes heads of `head_dim` values (a multiple of 8, at most
/// `PREFILL_MAX_HEAD_DIM`); the prefill rows of other heads run through the decode kernel one row at a time.
pub fn prefill_tiles_head(head_dim: usize) -> bool {
    head_dim.is_multiple_of(8) && head_dim <= launch::PREFILL_MAX_HEAD_DIM
}

/// The `-D NAME=value` flags every kernel source is compiled with (the launch constants).
pub fn compile_defines() -> Vec<String> {
    launch::DEFINES.iter().map(|(k, v)| format!("-D{k}={v}")).collect()
}

/// The names of the entry points (`OpEntryPoint`) of a SPIR-V module, in module order; None if the bytes are not
/// a SPIR-V module.
pub fn entry_points(spirv: &[u8]) -> Option<Vec<String>> {
    const MAGIC: u32 = 0x0723_0203;
    const OP_ENTRY_POINT: u32 = 15;
    if !spirv.len().is_multiple_of(4) || spirv.len() < 20 {
        return None;
    }
    let words: Vec<u32> = spirv.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    if words[0] != MAGIC {
        return None;
    }
    let mut names = Vec::new();
    let mut i = 5;
    while i < words.len() {
        let (count, op) = ((words[i] >> 16) as usize, words[i] & 0xffff);
        if count == 0 || i + count > words.len() {
            return None;
        }
        if op == OP_ENTRY_POINT && count > 3 {
            // execution model, function id, then the name as a nul-terminated UTF-8 literal.
            let bytes: Vec<u8> = words[i + 3..i + count].iter().flat_map(|w| w.to_le_bytes()).collect();
            let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
            names.push(String::from_utf8_lossy(&bytes[..end]).into_owned());
        }
        i += count;
    }
    Some(names)
}

// The launch constants fit the kernels' assumptions (checked when this crate compiles).
const _: () = {
    use launch::*;
    // matmul_tiled: 4 x 4 outputs per work-item cover the tile exactly.
    assert!(GEMM_WG == (GEMM_TILE_M / 4) * (GEMM_TILE_N / 4));
    // matmul_wi: four named row accumulators.
    assert!(GEMV_WI_ROWS == 4);
    // prefill: the private output accumulators divide evenly; the per-row and per-key steps fit one work-group.
    assert!((PREFILL_ROWS * PREFILL_MAX_HEAD_DIM).is_multiple_of(PREFILL_WG));
    assert!(PREFILL_ROWS <= PREFILL_WG && PREFILL_KEYS <= PREFILL_WG);
    assert!(ATTN_HEAD_CHUNK <= ATTN_WG);
    // moe_align stages one pair per work-item of its single work-group.
    assert!(MOE_TILE_M > 0 && MOE_MAX_EXPERTS > 0);
    // moe_route: a pick per work-item at the end, whole sub-groups.
    assert!(MOE_MAX_TOP_K <= MOE_ROUTE_WG && MOE_ROUTE_WG.is_multiple_of(64));
    // moe_pair_*: four weight rows a sub-group (gate and up of two columns), two gate/up columns a sub-group.
    assert!(MOE_PAIR_ROWS == 4 && MOE_PAIR_COLS.is_multiple_of(2) && MOE_PAIR_WG.is_multiple_of(64));
    // moe_matmul_tiled: a GEMM tile covers whole routed-experts tiles.
    assert!(GEMM_TILE_M.is_multiple_of(MOE_TILE_M));
    // The XMX matmul: whole calls of the matrix built-in (M = 8, N = 16) per sub-group tile, sub-groups of 16.
    assert!(XMX_TILE_M.is_multiple_of(8) && XMX_TILE_N.is_multiple_of(16) && XMX_WG.is_multiple_of(64));
    // Work-group sizes are multiples of 64, so sub-groups are full.
    assert!(ROW_WG.is_multiple_of(64) && ELEM_WG.is_multiple_of(64) && ATTN_WG.is_multiple_of(64));
    assert!(ENC_ATTN_WG.is_multiple_of(64));
    assert!(PREFILL_WG.is_multiple_of(64) && GEMV_WG.is_multiple_of(64) && GEMM_WG.is_multiple_of(64));
};

#[cfg(test)]
mod tests {
    use super::launch::*;
    use super::*;

    #[test]
    fn every_source_has_a_module_and_a_kernel_list() {
        let listed: Vec<&str> = KERNELS.iter().map(|(m, _)| *m).collect();
        let built: Vec<&str> = MODULES.iter().map(|m| m.name).collect();
        assert_eq!(listed, built, "KERNELS must list every module of src/cl, sorted");
    }

    #[test]
    fn kernel_table_matches_the_spirv_entry_points() {
        for (name, kernels) in KERNELS {
            let m = module(name).unwrap();
            let mut found = entry_points(m.spirv).unwrap_or_else(|| panic!("{name}: not a SPIR-V module"));
            let mut want: Vec<String> = kernels.iter().map(|s| s.to_string()).collect();
            found.sort();
            want.sort();
            assert_eq!(found, want, "{name}: entry points");
        }
    }

    #[test]
    fn every_launch_constant_reaches_the_compiler() {
        let defines = compile_defines();
        for (name, value) in launch::DEFINES {
            assert!(defines.contains(&format!("-D{name}={value}")), "{name}");
        }
        assert!(defines.iter().any(|d| d == &format!("-DATTN_MAX_PARTITION={ATTN_MAX_PARTITION}")));
    }
}
