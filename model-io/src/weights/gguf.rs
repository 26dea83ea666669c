//! Loading GGUF weights: every tensor is dequantized at load (F32, F16, BF16, Q4_0, Q4_1, Q8_0, Q4_K, Q6_K and the
//! other block types candle knows), renamed from llama.cpp to Hugging Face names, and, for `llama` files, q/k rows
//! are put back in Hugging Face order.
//!
//! Why the permutation: llama.cpp's converter reorders the rows of q_proj and k_proj of llama models so that its
//! rotary embedding, which rotates adjacent pairs (x0, x1), (x2, x3), ..., gives the same result as Hugging Face's
//! "rotate half", which pairs x_j with x_{j + d/2}. Per head of dimension d it stores HF row `p * d/2 + j` at row
//! `2 * j + p` (p in {0, 1}). `unpermute_rows` undoes it so GGUF and safetensors models run the same forward pass.
//!
//! 2-D tensors stored in a block format the CPU backend multiplies (`quant::Format`: `Q8_0`, `Q4_0`, `Q4_1`, `Q5_0`,
//! `Q5_1`, `Q4_K`, `Q5_K`, `Q6_K`) also keep their blocks (rows put in the same order): the CPU backend multiplies
//! those packed (`backend::cpu::quant`), the other backends take the dequantized tensors. `load_gguf_packed` keeps
//! only the blocks of those, for the CPU backend keeping them packed (its default; not `--cpu-dequantize-weights`).

use std::collections::HashMap;
use std::io::Cursor;
use std::path::Path;

use candle_core::quantized::gguf_file::Content;
use candle_core::{DType, Device, Tensor};
use rayon::prelude::*;

use super::names::hf_to_gguf;
use super::{check_dtype, expected_tensors, Weights};
use crate::config::gguf_meta::gguf_architecture;
use crate::config::ModelParams;
use crate::{ModelError, Result};
use rserve_backend::cpu::quant::{self, PackedMatrix};

/// Puts the rows of a llama.cpp-permuted q or k projection (`[n_head * head_dim, in]`) back in Hugging Face order.
pub fn unpermute_rows(w: &Tensor, n_head: usize) -> Result<Tensor> {
    let (out, inp) = w.dims2()?;
    if n_head == 0 || out % (2 * n_head) != 0 {
        return Err(ModelError::Weights(format!(
            "cannot undo the q/k permutation: {out} rows are not a multiple of 2 * {n_head} heads"
        )));
    }
    let half = out / n_head / 2;
    // Stored as [head, j, p, in]; Hugging Face order is [head, p, j, in].
    Ok(w.reshape((n_head, half, 2, inp))?.transpose(1, 2)?.contiguous()?.reshape((out, inp))?)
}

/// The inverse of `unpermute_rows`: Hugging Face order to llama.cpp order (used to write test GGUF files).
pub fn permute_rows(w: &Tensor, n_head: usize) -> Result<Tensor> {
    let (out, inp) = w.dims2()?;
    if n_head == 0 || out % (2 * n_head) != 0 {
        return Err(ModelError::Weights(format!(
            "cannot permute: {out} rows are not a multiple of 2 * {n_head} heads"
        )));
    }
    let half = out / n_head / 2;
    Ok(w.reshape((n_head, 2, half, inp))?.transpose(1, 2)?.contiguous()?.reshape((out, inp))?)
}

/// Memory-maps a GGUF file and parses its header.
fn open(path: &Path) -> Result<(memmap2::Mmap, Content)> {
    let file = std::fs::File::open(path).map_err(|source| ModelError::Io { path: path.to_path_buf(), source })?;
    // SAFETY: read-only map of a file we only read; truncation of the file by another process while loading is the
    // documented limit of mmap-based loading.
    let map =
        unsafe { memmap2::Mmap::map(&file) }.map_err(|source| ModelError::Io { path: path.to_path_buf(), source })?;
    let content = crate::config::gguf_meta::parse_gguf_header(&mut Cursor::new(&map[..]))
        .map_err(|e| ModelError::Weights(format!("{}: not a readable GGUF file: {e}", path.display())))?;
    Ok((map, content))
}

/// Loads and dequantizes the tensors `params` needs from a GGUF file as `dtype`, under Hugging Face names.
pub fn load_gguf(path: &Path, params: &ModelParams, dtype: DType) -> Result<Weights> {
    load(path, params, dtype, false)
}

/// As `load_gguf`, but a tensor the CPU backend keeps packed is not dequantized: its blocks are registered against a
/// placeholder (`quant::placeholder`, no memory), so host memory holds the file's blocks instead of an f32 copy as
/// well. For the CPU backend with packed weights only. A fused projection's parts (q/k/v, gate/up) are packed only
/// when all of them can be (the backend stacks their blocks); models whose checkpoint fuses them (split at load)
/// dequantize everything.
pub fn load_gguf_packed(path: &Path, params: &ModelParams, dtype: DType) -> Result<Weights> {
    load(path, params, dtype, !super::names::has_fused_projections(params))
}

fn load(path: &Path, params: &ModelParams, dtype: DType, packed_only: bool) -> Result<Weights> {
    check_dtype(dtype)?;
    let (map, content) = open(path)?;
    let permuted = gguf_architecture(&content)? == "llama";
    let specs = expected_tensors(params);
    let mut jobs = Vec::with_capacity(specs.len());
    for spec in specs {
        let gguf_name = hf_to_gguf(&spec.name)
            .ok_or_else(|| ModelError::Weights(format!("no GGUF name is known for `{}`", spec.name)))?;
        let info = content.tensor_infos.get(&gguf_name).ok_or_else(|| {
            ModelError::Weights(format!(
                "{}: no tensor `{gguf_name}` (needed for `{}`, shape {:?})",
                path.display(),
                spec.name,
                spec.shape
            ))
        })?;
        spec.check(info.shape.dims(), params)
            .map_err(|e| ModelError::Weights(format!("{} (GGUF tensor `{gguf_name}`)", strip_prefix(e))))?;
        let heads = match (permuted, spec.name.rsplit('.').nth(1)) {
            (true, Some("q_proj")) if spec.name.ends_with(".weight") => Some(params.num_heads),
            (true, Some("k_proj")) if spec.name.ends_with(".weight") => Some(params.num_kv_heads),
            _ => None,
        };
        jobs.push((spec.name, gguf_name, info, heads));
    }
    let packable = |name: &str| {
        let info = hf_to_gguf(name).and_then(|g| content.tensor_infos.get(&g));
        info.is_some_and(|i| quant::Format::from_ggml(i.ggml_dtype).is_some() && i.shape.dims().len() == 2)
    };
    let blocks_only: Vec<bool> =
        jobs.iter().map(|(name, ..)| packed_only && fused_siblings(name).iter().all(|n| packable(n))).collect();
    // A model whose quantized matrices are all Q8_0 multiplies two-term activations on the CPU
    // (`PackedMatrix::with_two_term_activations`); a mixed file's error is set by its coarser formats.
    let formats: Vec<quant::Format> = content
        .tensor_infos
        .values()
        .filter(|i| i.shape.dims().len() == 2)
        .filter_map(|i| quant::Format::from_ggml(i.ggml_dtype))
        .collect();
    let two_term = !formats.is_empty() && formats.iter().all(|&f| f == quant::Format::Q8_0);
    let data_offset = content.tensor_data_offset;
    let bar = super::progress::tensors(jobs.len(), "Loading GGUF tensors");
    let loaded: Vec<(String, Tensor, Option<PackedMatrix>)> = jobs
        .into_par_iter()
        .zip(blocks_only)
        .map(|((name, gguf_name, info, heads), blocks_only)| {
            let _advance = super::progress::AdvanceOnDrop(&bar);
            let q = info
                .read(&mut Cursor::new(&map[..]), data_offset, &Device::Cpu)
                .map_err(|e| ModelError::Weights(format!("reading GGUF tensor `{gguf_name}`: {e}")))?;
            if let (true, Some(format), &[rows, cols]) =
                (blocks_only, quant::Format::from_ggml(info.ggml_dtype), q.shape().dims())
            {
                let bytes = q.data().map_err(|e| ModelError::Weights(format!("GGUF tensor `{gguf_name}`: {e}")))?;
                let p = PackedMatrix::new(format, rows, cols, bytes.into_owned())?.with_two_term_activations(two_term);
                let p = match heads {
                    Some(n) => p.select_rows(&unpermuted_order(rows, n)),
                    None => p,
                };
                return Ok((name, quant::placeholder(rows, cols, dtype)?, Some(p)));
            }
            let t = q
                .dequantize(&Device::Cpu)
                .map_err(|e| ModelError::Weights(format!("dequantizing `{gguf_name}` ({:?}): {e}", info.ggml_dtype)))?;
            let t = match heads {
                Some(n) => unpermute_rows(&t, n)?,
                None => t,
            };
            let t = if t.dtype() == dtype { t } else { t.to_dtype(dtype)? };
            let packed = match (quant::Format::from_ggml(info.ggml_dtype), t.dims()) {
                (Some(format), &[rows, cols]) => {
                    let bytes = q.data().map_err(|e| ModelError::Weights(format!("GGUF tensor `{gguf_name}`: {e}")))?;
                    let p =
                        PackedMatrix::new(format, rows, cols, bytes.into_owned())?.with_two_term_activations(two_term);
                    Some(match heads {
                        Some(n) => p.select_rows(&unpermuted_order(rows, n)),
                        None => p,
                    })
                }
                _ => None,
            };
            Ok((name, t, packed))
        })
        .collect::<Result<_>>()?;
    bar.finish();
    let mut keep = quant::Keep::default();
    let mut tensors = HashMap::with_capacity(loaded.len());
    for (name, t, packed) in loaded {
        if let Some(p) = packed {
            quant::register(&t, p, &mut keep);
        }
        tensors.insert(name, t);
    }
    Ok(Weights::from_tensors(tensors, params, dtype)?.with_packed(keep))
}

/// The weights stacked with `name` into one matrix at upload (its fused q/k/v or gate/up projection), itself
/// included; just `name` for any other tensor.
fn fused_siblings(name: &str) -> Vec<String> {
    const GROUPS: [&[&str]; 2] =
        [&["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"], &["mlp.gate_proj", "mlp.up_proj"]];
    for group in GROUPS {
        for part in group {
            if let Some(layer) = name.strip_suffix(&format!(".{part}.weight")) {
                return group.iter().map(|p| format!("{layer}.{p}.weight")).collect();
            }
        }
    }
    vec![name.to_string()]
}

/// For each row in Hugging Face order, the llama.cpp-permuted row it is stored at (`unpermute_rows` on row indices).
fn unpermuted_order(rows: usize, n_head: usize) -> Vec<usize> {
    let half = rows / n_head.max(1) / 2;
    (0..rows)
        .map(|r| {
            let (h, p, j) = (r / (2 * half), r / half % 2, r % half);
            h * 2 * half + 2 * j + p
        })
        .collect()
}

fn strip_prefix(e: ModelError) -> String {
    match e {
        ModelError::Weights(m) => m,
        other => other.to_string(),
    }
}
