//! Start-up of an encoder (BERT, XLM-RoBERTa and their classifiers), served for pooling only: its config, weights
//! and head, a scheduler whose steps hold whole inputs (no KV cache: the blocks are bookkeeping), then the same
//! engine thread as every model (`start::spawn`).

use std::sync::Arc;

use candle_core::DType;
use rserve_model_io::config::encoder::{parse_encoder_config, EncoderHead, EncoderParams};
use rserve_model_io::config::pooling::DenseActivation;
use rserve_model_io::weights::encoder::EncoderWeights;
use rserve_scheduler::{Scheduler, SchedulerConfig, TokenId};

use super::config::{ConvertChoice, EngineConfig, RunnerChoice};
use super::device::Device;
use super::handle::EngineHandle;
use super::start::{spawn, EngineParts};
use crate::api::{EngineInfo, SamplingParams};
use crate::error::{EngineError, Result};
use crate::pooling::{ClassifierHead, Dense, Pooler};
use crate::source::ResolvedModel;
use crate::tokenizer::Tokenizer;

/// The encoder a resolved model folder holds, if it holds one.
pub(super) fn encoder_params(resolved: &ResolvedModel) -> Result<Option<EncoderParams>> {
    let ResolvedModel::Safetensors(m) = resolved else { return Ok(None) };
    let text = std::fs::read_to_string(&m.config)
        .map_err(|e| EngineError::Model(rserve_model_io::ModelError::Io { path: m.config.clone(), source: e }))?;
    Ok(parse_encoder_config(&text)?)
}

/// The classifier head of a `...ForSequenceClassification` checkpoint, on the host.
fn classifier(p: &EncoderParams, w: &EncoderWeights) -> Result<ClassifierHead> {
    let h = p.hidden_size;
    let vec = |name: &str| -> Result<Vec<f32>> { Ok(w.head(name)?.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?) };
    let enc = |name: &str| -> Result<Vec<f32>> { Ok(w.get(name)?.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?) };
    let layers = match p.head {
        EncoderHead::BertClassifier => vec![
            Dense::from_parts(enc("pooler.dense.weight")?, enc("pooler.dense.bias")?, h, DenseActivation::Tanh)?,
            Dense::from_parts(vec("classifier.weight")?, vec("classifier.bias")?, h, DenseActivation::Identity)?,
        ],
        EncoderHead::RobertaClassifier => vec![
            Dense::from_parts(
                vec("classifier.dense.weight")?,
                vec("classifier.dense.bias")?,
                h,
                DenseActivation::Tanh,
            )?,
            Dense::from_parts(
                vec("classifier.out_proj.weight")?,
                vec("classifier.out_proj.bias")?,
                h,
                DenseActivation::Identity,
            )?,
        ],
        EncoderHead::Embeddings => return Err(EngineError::InvalidArgument("the model has no classifier head".into())),
    };
    Ok(ClassifierHead { layers, labels: p.labels.clone() })
}

/// Loads and starts an encoder on `device`.
pub(super) fn start_encoder(
    cfg: &EngineConfig,
    pool: Arc<rayon::ThreadPool>,
    device: Device,
    resolved: &ResolvedModel,
    p: EncoderParams,
    tokenizer: Arc<Tokenizer>,
) -> Result<EngineHandle> {
    if cfg.runner == RunnerChoice::Generate {
        return Err(EngineError::InvalidArgument(format!(
            "{} is an encoder: it serves pooling requests only (--runner pooling)",
            p.architecture
        )));
    }
    if cfg.tensor_parallel_size * cfg.pipeline_parallel_size > 1 {
        return Err(EngineError::InvalidArgument("an encoder runs in one process (-tp 1 -pp 1)".into()));
    }
    let ResolvedModel::Safetensors(m) = resolved else {
        return Err(EngineError::InvalidArgument("an encoder is read from a safetensors folder".into()));
    };
    let dtype = cfg.dtype.resolve(device.is_host(), false, p.torch_dtype.as_deref());
    let weights = EncoderWeights::open(&m.safetensors)?;
    let classify = match cfg.convert {
        ConvertChoice::Embed => false,
        ConvertChoice::Classify if p.head == EncoderHead::Embeddings => {
            return Err(EngineError::InvalidArgument(format!(
                "--convert classify: {} has no classifier head",
                p.architecture
            )))
        }
        _ => p.head != EncoderHead::Embeddings,
    };
    let pooler = if classify {
        Pooler::encoder_classifier(classifier(&p, &weights)?, p.hidden_size, &cfg.pooler_config)?
    } else {
        let matryoshka = super::pooling_setup::matryoshka_dimensions(&m.dir);
        Pooler::encoder_embedder(Some(&m.dir), p.hidden_size, matryoshka, &cfg.pooler_config)?
    };
    let t0 = std::time::Instant::now();
    let runner = device.build_encoder_runner(&p, &|name| Ok(weights.get(name)?), dtype)?;
    let device_name = runner.device_name();
    let weights_bytes: u64 = m.safetensors.iter().filter_map(|f| std::fs::metadata(f).ok()).map(|m| m.len()).sum();
    tracing::info!(
        "Resolved model {} -> {} ({}, {} layers, hidden {}, {} heads), dtype={}; loaded in {:.1} s on {device_name}",
        cfg.model,
        m.dir.display(),
        p.architecture,
        p.num_layers,
        p.hidden_size,
        p.num_heads,
        dtype.as_str(),
        t0.elapsed().as_secs_f64()
    );
    let max_model_len = cfg.max_model_len.unwrap_or(p.max_len());
    if max_model_len > p.max_len() {
        return Err(EngineError::InvalidArgument(format!(
            "--max-model-len {max_model_len} is more than the model's {} positions",
            p.max_len()
        )));
    }
    // Every input runs whole in one step: the budget holds the longest.
    let max_num_batched_tokens =
        cfg.max_num_batched_tokens.unwrap_or(rserve_scheduler::DEFAULT_MAX_NUM_BATCHED_TOKENS).max(max_model_len);
    let num_blocks = max_num_batched_tokens.div_ceil(cfg.block_size) + cfg.max_num_seqs;
    let mut sched_cfg = SchedulerConfig::new(num_blocks, max_model_len);
    sched_cfg.block_size = cfg.block_size;
    sched_cfg.max_num_seqs = cfg.max_num_seqs;
    sched_cfg.max_num_batched_tokens = max_num_batched_tokens;
    sched_cfg.enable_prefix_caching = false;
    let scheduler = Scheduler::new(sched_cfg).map_err(|e| EngineError::InvalidArgument(e.to_string()))?;
    let eos: Vec<TokenId> = tokenizer.eos_token_ids();
    let info = EngineInfo {
        model_path: m.dir.display().to_string(),
        max_model_len,
        vocab_size: p.vocab_size,
        block_size: cfg.block_size,
        num_kv_blocks: num_blocks,
        kv_cache_bytes: 0,
        weights_bytes,
        dtype: dtype.as_str().to_string(),
        device: device_name,
        max_num_seqs: cfg.max_num_seqs,
        eos_token_ids: eos.clone(),
        max_logprobs: 0,
        default_max_tokens: None,
        max_tokens_cap: None,
        pooling: Some(pooler.info().clone()),
        max_num_batched_tokens,
    };
    tracing::info!(
        "Pooling model: {} pooling, {}; inputs of up to {max_model_len} tokens, {max_num_batched_tokens} a step",
        pooler.pooling_type().as_str(),
        if classify {
            format!("{} labels", p.labels.len())
        } else {
            format!("{} values an embedding", pooler.info().embed_dim)
        },
    );
    let parts = EngineParts {
        scheduler,
        runner,
        tokenizer,
        chat_template: None,
        info,
        eos,
        sampling_defaults: SamplingParams::default(),
        pooler: Some(Arc::new(pooler)),
        num_blocks,
    };
    spawn(cfg, pool, parts)
}
