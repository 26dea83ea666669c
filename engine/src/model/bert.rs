//! The encoder forward pass (BERT, XLM-RoBERTa) over a flattened batch of whole inputs: word + position + segment
//! embeddings and their LayerNorm, then per layer a fused q/k/v projection, bidirectional attention within each
//! input (`Op::EncoderAttention`: no cache, no mask), the output projection, `LayerNorm(x + attention)`, the GELU
//! MLP and `LayerNorm(x + mlp)` (post-norm), every projection with its bias. The positions and segments of each
//! token index one table that holds `position + segment` rows, summed once at load, so the embeddings are two
//! lookups and one norm.

use candle_core::{DType, Tensor};
use rserve_model_io::config::encoder::EncoderParams;

use crate::backend::{Backend, Op};
use crate::error::{EngineError, Result};
use rserve_model_io::ModelError;

struct Linear<B: Backend> {
    w: B::Buffer,
    bias: B::Buffer,
    out: usize,
}

struct Norm<B: Backend> {
    weight: B::Buffer,
    bias: B::Buffer,
}

struct Layer<B: Backend> {
    qkv: Linear<B>,
    o: Linear<B>,
    attn_norm: Norm<B>,
    up: Linear<B>,
    down: Linear<B>,
    out_norm: Norm<B>,
}

/// An encoder's weights on one device.
pub struct EncoderModel<B: Backend> {
    params: EncoderParams,
    word: B::Buffer,
    /// `[type_vocab_size * max_position_embeddings, hidden]`: row `t * max_pos + p` = position `p` + segment `t`.
    pos_type: B::Buffer,
    emb_norm: Norm<B>,
    layers: Vec<Layer<B>>,
}

/// One flattened batch of whole inputs, as the encoder reads it.
pub struct EncoderBatch<'a> {
    pub ids: &'a [u32],
    /// Each token's segment (`token_type_ids`), 0 where the request gave none.
    pub types: &'a [u32],
    /// `[num_seqs + 1]` row offsets of the inputs.
    pub query_start: &'a [u32],
    /// The rows whose final hidden states come back, in order.
    pub rows: &'a [u32],
}

impl<B: Backend> EncoderModel<B> {
    /// Loads the encoder's tensors through `take` (Hugging Face names without the model prefix, e.g.
    /// `embeddings.word_embeddings.weight`); matmul weights in `dtype`, everything else f32.
    pub fn load(b: &B, p: &EncoderParams, take: &dyn Fn(&str) -> Result<Tensor>, dtype: DType) -> Result<Self> {
        let h = p.hidden_size;
        let f32s = |t: &Tensor| -> Result<Vec<f32>> { Ok(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?) };
        let shaped = |name: &str, shape: &[usize]| -> Result<Tensor> {
            let t = take(name)?;
            if t.dims() != shape {
                return Err(EngineError::Model(ModelError::Weights(format!(
                    "tensor `{name}` has shape {:?}, but the config implies {shape:?}",
                    t.dims()
                ))));
            }
            Ok(t)
        };
        let vector =
            |name: &str, len: usize| -> Result<B::Buffer> { Ok(b.upload_f32(&f32s(&shaped(name, &[len])?)?)?) };
        let norm = |pre: &str| -> Result<Norm<B>> {
            Ok(Norm { weight: vector(&format!("{pre}.weight"), h)?, bias: vector(&format!("{pre}.bias"), h)? })
        };
        let linear = |names: &[String], out: usize, inp: usize| -> Result<Linear<B>> {
            let ws = names
                .iter()
                .map(|n| Ok(shaped(&format!("{n}.weight"), &[out / names.len(), inp])?.to_dtype(dtype)?))
                .collect::<Result<Vec<_>>>()?;
            let w = match ws.as_slice() {
                [one] => b.upload_weight(one)?,
                _ => b.upload_weight_rows(&ws.iter().collect::<Vec<_>>())?,
            };
            let mut bias = Vec::with_capacity(out);
            for n in names {
                bias.extend(f32s(&shaped(&format!("{n}.bias"), &[out / names.len()])?)?);
            }
            Ok(Linear { w, bias: b.upload_f32(&bias)?, out })
        };
        let word =
            b.upload_weight(&shaped("embeddings.word_embeddings.weight", &[p.vocab_size, h])?.to_dtype(dtype)?)?;
        let pos = f32s(&shaped("embeddings.position_embeddings.weight", &[p.max_position_embeddings, h])?)?;
        let types = f32s(&shaped("embeddings.token_type_embeddings.weight", &[p.type_vocab_size, h])?)?;
        let mut pos_type = Vec::with_capacity(p.type_vocab_size * pos.len());
        for t in types.chunks_exact(h) {
            for row in pos.chunks_exact(h) {
                pos_type.extend(row.iter().zip(t).map(|(a, b)| a + b));
            }
        }
        let rows = p.type_vocab_size * p.max_position_embeddings;
        let pos_type = b.upload_weight(&Tensor::from_vec(pos_type, (rows, h), &candle_core::Device::Cpu)?)?;
        let emb_norm = norm("embeddings.LayerNorm")?;
        let layers = (0..p.num_layers)
            .map(|i| {
                let pre = format!("encoder.layer.{i}");
                let att = format!("{pre}.attention");
                let qkv: Vec<String> = ["query", "key", "value"].iter().map(|n| format!("{att}.self.{n}")).collect();
                Ok(Layer {
                    qkv: linear(&qkv, 3 * h, h)?,
                    o: linear(&[format!("{att}.output.dense")], h, h)?,
                    attn_norm: norm(&format!("{att}.output.LayerNorm"))?,
                    up: linear(&[format!("{pre}.intermediate.dense")], p.intermediate_size, h)?,
                    down: linear(&[format!("{pre}.output.dense")], h, p.intermediate_size)?,
                    out_norm: norm(&format!("{pre}.output.LayerNorm"))?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { params: p.clone(), word, pos_type, emb_norm, layers })
    }

    pub fn params(&self) -> &EncoderParams {
        &self.params
    }

    /// The final hidden states of `batch.rows`, `[rows, hidden]` f32 on the device. Inputs longer than the
    /// position table or with a segment outside the config's are refused.
    pub fn forward(&self, b: &B, batch: &EncoderBatch<'_>) -> Result<B::Buffer> {
        let p = &self.params;
        let (n, h) = (batch.ids.len(), p.hidden_size);
        let num_seqs = batch.query_start.len().saturating_sub(1);
        if batch.types.len() != n || batch.query_start.last().map(|&e| e as usize) != Some(n) {
            return Err(EngineError::InvalidArgument("encoder batch: ids, segments and row offsets disagree".into()));
        }
        if let Some(t) = batch.ids.iter().find(|&&t| t as usize >= p.vocab_size) {
            return Err(EngineError::InvalidArgument(format!(
                "token id {t} is outside the vocabulary of {}",
                p.vocab_size
            )));
        }
        let mut pt = Vec::with_capacity(n);
        for s in 0..num_seqs {
            let (a, e) = (batch.query_start[s] as usize, batch.query_start[s + 1] as usize);
            if e - a > p.max_len() {
                return Err(EngineError::InvalidArgument(format!(
                    "an input of {} tokens is over {}",
                    e - a,
                    p.max_len()
                )));
            }
            for (i, &t) in batch.types[a..e].iter().enumerate() {
                if t as usize >= p.type_vocab_size {
                    return Err(EngineError::InvalidArgument(format!(
                        "token type {t} is outside the model's {}",
                        p.type_vocab_size
                    )));
                }
                pt.push((t as usize * p.max_position_embeddings + p.position(i)) as u32);
            }
        }
        let eps = p.layer_norm_eps as f32;
        let ids = b.upload_u32(batch.ids)?;
        let pt = b.upload_u32(&pt)?;
        let qs = b.upload_u32(batch.query_start)?;
        let words = b.alloc_f32_scratch(n * h)?;
        let extra = b.alloc_f32_scratch(n * h)?;
        b.run(Op::Embedding { table: &self.word, ids: &ids, out: &words, num_tokens: n, hidden: h, scale: 1.0 })?;
        b.run(Op::Embedding { table: &self.pos_type, ids: &pt, out: &extra, num_tokens: n, hidden: h, scale: 1.0 })?;
        let mut x = b.alloc_f32_scratch(n * h)?;
        let norm = |x: &B::Buffer, residual: Option<&B::Buffer>, nrm: &Norm<B>, out: &B::Buffer| -> Result<()> {
            let op = Op::LayerNorm { x, residual, weight: &nrm.weight, bias: &nrm.bias, out, rows: n, hidden: h, eps };
            Ok(b.run(op)?)
        };
        let project = |x: &B::Buffer, l: &Linear<B>, k: usize| -> Result<B::Buffer> {
            let out = b.alloc_f32_scratch(n * l.out)?;
            b.run(Op::MatMul { x, w: &l.w, bias: Some(&l.bias), out: &out, m: n, k, n: l.out })?;
            Ok(out)
        };
        norm(&words, Some(&extra), &self.emb_norm, &x)?;
        let (heads, hd) = (p.num_heads, p.head_dim());
        let scale = 1.0 / (hd as f32).sqrt();
        for l in &self.layers {
            let qkv = project(&x, &l.qkv, h)?;
            let attn = b.alloc_f32_scratch(n * h)?;
            b.run(Op::EncoderAttention {
                qkv: &qkv,
                query_start: &qs,
                out: &attn,
                num_seqs,
                num_tokens: n,
                num_heads: heads,
                head_dim: hd,
                scale,
            })?;
            let o = project(&attn, &l.o, h)?;
            let x1 = b.alloc_f32_scratch(n * h)?;
            norm(&o, Some(&x), &l.attn_norm, &x1)?;
            let up = project(&x1, &l.up, h)?;
            let act = b.alloc_f32_scratch(n * l.up.out)?;
            b.run(Op::Gelu { x: &up, out: &act, len: n * l.up.out })?;
            let down = project(&act, &l.down, l.up.out)?;
            x = b.alloc_f32_scratch(n * h)?;
            norm(&down, Some(&x1), &l.out_norm, &x)?;
        }
        let rows = b.upload_u32(batch.rows)?;
        let out = b.alloc_f32_scratch(batch.rows.len() * h)?;
        b.run(Op::GatherRows { x: &x, rows: &rows, out: &out, num_rows: batch.rows.len(), width: h })?;
        Ok(out)
    }
}
