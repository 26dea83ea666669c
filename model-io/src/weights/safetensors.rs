//! Loading Hugging Face safetensors checkpoints (one file or shards) through mmap, converting bf16 / f16 / f32 to
//! the requested dtype. Shapes are checked from the headers before any data is copied.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::safetensors::MmapedSafetensors;

use crate::shard::{apply_cut, Shard};
use candle_core::{DType, Device, Tensor};
use rayon::prelude::*;

use super::names::{checkpoint_tensors, has_fused_projections};
use super::progress::AdvanceOnDrop;
use super::{check_dtype, Weights};
use crate::config::ModelParams;
use crate::{ModelError, Result};

fn mmap(path: &Path) -> Result<memmap2::Mmap> {
    let file = std::fs::File::open(path).map_err(|source| ModelError::Io { path: path.to_path_buf(), source })?;
    // SAFETY: the file is opened read-only and only read through the map; as with every mmap, a process that
    // truncates the file while it is mapped can fault us, which is the documented limit of loading by mmap.
    unsafe { memmap2::Mmap::map(&file) }.map_err(|source| ModelError::Io { path: path.to_path_buf(), source })
}

/// Loads the tensors `params` needs from safetensors files as `dtype`.
pub fn load_safetensors(paths: &[PathBuf], params: &ModelParams, dtype: DType) -> Result<Weights> {
    load(paths, params, dtype, None)
}

/// Only the tensors `shard` needs, each cut to its slice as it is read (`Weights::is_cut`).
pub fn load_safetensors_shard(paths: &[PathBuf], params: &ModelParams, dtype: DType, shard: &Shard) -> Result<Weights> {
    load(paths, params, dtype, Some(shard))
}

fn load(paths: &[PathBuf], params: &ModelParams, dtype: DType, shard: Option<&Shard>) -> Result<Weights> {
    check_dtype(dtype)?;
    if paths.is_empty() {
        return Err(ModelError::Weights("no safetensors files to load".into()));
    }
    for p in paths {
        if !p.is_file() {
            return Err(ModelError::Weights(format!("weight file {} does not exist", p.display())));
        }
    }
    // SAFETY: see `mmap` above; the maps are read-only.
    let st = unsafe { MmapedSafetensors::multi(paths) }
        .map_err(|e| ModelError::Weights(format!("cannot read safetensors header: {e}")))?;
    let mut specs = checkpoint_tensors(params);
    // A fused projection is split into its parts before it can be cut: such checkpoints load whole and the model
    // cuts its share at upload.
    let shard = shard.filter(|_| !has_fused_projections(params));
    if let Some(shard) = shard {
        specs.retain(|spec| shard.cut(params, &spec.name).is_some());
    }
    // gpt-oss's experts are read packed, one set of tensors per layer, and unpacked below.
    let packed = super::gpt_oss::is_unpacked;
    let unpack_layers: Vec<usize> = (0..params.num_layers)
        .filter(|&l| params.is_moe_layer(l) && packed(params, &format!("model.layers.{l}.mlp.experts.")))
        .collect();
    specs.retain(|spec| !packed(params, &spec.name));
    let file_name = language_model_prefix(&st);
    // Check names, shapes and source dtypes first, so a wrong checkpoint fails before copying gigabytes.
    for spec in &specs {
        let view = st.get(&file_name(&spec.name)).map_err(|_| {
            ModelError::Weights(format!(
                "the checkpoint has no tensor `{}` (shape {:?}); files: {}",
                spec.name,
                spec.shape,
                paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
            ))
        })?;
        spec.check(view.shape(), params)?;
        // (candle's safetensors version may differ from ours, so go through candle's own dtype conversion.)
        match DType::try_from(view.dtype()) {
            Ok(DType::BF16 | DType::F16 | DType::F32) => {}
            _ => {
                return Err(ModelError::Weights(format!(
                    "tensor `{}` is stored as {:?}; only bf16, f16 and f32 safetensors are supported",
                    spec.name,
                    view.dtype()
                )))
            }
        }
    }
    let bar = super::progress::tensors(specs.len(), "Loading safetensors tensors");
    let loaded: Vec<(String, Tensor)> = specs
        .into_par_iter()
        .map(|spec| {
            let _advance = AdvanceOnDrop(&bar);
            let t = st.load(&file_name(&spec.name), &Device::Cpu)?;
            let t = match shard.and_then(|s| s.cut(params, &spec.name)) {
                Some(cut) => apply_cut(&t, &cut)?,
                None => t,
            };
            let t = if t.dtype() == dtype { t } else { t.to_dtype(dtype)? };
            Ok((spec.name, t))
        })
        .collect::<Result<_>>()?;
    bar.finish();
    let mut map: HashMap<String, Tensor> = loaded.into_iter().collect();
    let read = |name: &str| -> Result<Option<Tensor>> {
        let name = file_name(name);
        if st.get(&name).is_err() {
            return Ok(None);
        }
        Ok(Some(st.load(&name, &Device::Cpu)?))
    };
    for layer in unpack_layers.into_iter().filter(|l| shard.is_none_or(|s| s.layers.contains(l))) {
        let names = super::names::moe_names(params, layer);
        // Under expert parallelism only this rank's experts are unpacked.
        let want = |e: usize| shard.is_none_or(|s| s.cut(params, &format!("{}.weight", names.experts[e][0])).is_some());
        for (name, t) in super::gpt_oss::unpack_layer(&read, params, layer, &want)? {
            let t = match shard.map(|s| s.cut(params, &name)) {
                Some(None) => continue,
                Some(Some(cut)) => apply_cut(&t, &cut)?,
                None => t,
            };
            map.insert(name, t.to_dtype(dtype)?);
        }
    }
    match shard {
        None => Weights::from_tensors(map, params, dtype),
        Some(_) => Ok(Weights::from_cut_tensors(map, dtype)),
    }
}

/// The name a tensor has in the files: the model's own name, or under the language-model prefix of a multimodal
/// checkpoint whose text model rserve serves (Gemma 3's `Gemma3ForConditionalGeneration`: `language_model.model.*`
/// as transformers 4 saves it, `model.language_model.*` as transformers 5 does; the vision tower is not read), or
/// without the `model.` prefix (a bare decoder saved by sentence-transformers, as Qwen3-Embedding is released).
fn language_model_prefix(st: &MmapedSafetensors) -> fn(&str) -> String {
    fn own(name: &str) -> String {
        name.to_string()
    }
    fn v4(name: &str) -> String {
        format!("language_model.{name}")
    }
    fn v5(name: &str) -> String {
        match name.strip_prefix("model.") {
            Some(rest) => format!("model.language_model.{rest}"),
            None => name.to_string(),
        }
    }
    fn bare(name: &str) -> String {
        name.strip_prefix("model.").unwrap_or(name).to_string()
    }
    let embed = super::names::EMBED_TOKENS;
    [own as fn(&str) -> String, v4, v5, bare].into_iter().find(|f| st.get(&f(embed)).is_ok()).unwrap_or(own)
}

/// Number of parameters in safetensors files, read from the headers only.
pub fn safetensors_param_count(paths: &[PathBuf]) -> Result<u64> {
    let mut total = 0u64;
    for p in paths {
        let map = mmap(p)?;
        let (_, meta) = ::safetensors::SafeTensors::read_metadata(&map)
            .map_err(|e| ModelError::Weights(format!("{}: bad safetensors header: {e}", p.display())))?;
        for info in meta.tensors().values() {
            total += info.shape.iter().product::<usize>() as u64;
        }
    }
    Ok(total)
}
