//! The llama-family decoder (Llama 3.x, SmolLM2, Mistral, Qwen2) on any `Backend`: pre-norm attention with rotary
//! embeddings and grouped-query heads reading the paged KV cache, a SwiGLU MLP, and logits for the last token of each
//! sequence of a flattened batch.

use crate::backend::{AttentionMeta, Backend, Op};
use crate::config::{Architecture, ModelParams};
use crate::error::{EngineError, Result};
use crate::model::batch::BatchInput;
use crate::model::kv_cache::PagedKvCache;
use crate::model::rope;
use crate::weights::Weights;

struct Linear<B: Backend> {
    w: B::Buffer,
    bias: Option<B::Buffer>,
    out_features: usize,
}

struct Layer<B: Backend> {
    input_norm: B::Buffer,
    post_norm: B::Buffer,
    q: Linear<B>,
    k: Linear<B>,
    v: Linear<B>,
    o: Linear<B>,
    gate: Linear<B>,
    up: Linear<B>,
    down: Linear<B>,
}

/// A loaded llama-family model: weights on the backend plus the rotary table.
pub struct LlamaModel<B: Backend> {
    params: ModelParams,
    embed: B::Buffer,
    layers: Vec<Layer<B>>,
    norm: B::Buffer,
    /// None when the embeddings are tied.
    lm_head: Option<B::Buffer>,
    inv_freq: B::Buffer,
}

fn linear<B: Backend>(backend: &B, w: &Weights, name: &str, bias: bool, out_features: usize) -> Result<Linear<B>> {
    let weight = backend.upload_weight(w.get(&format!("{name}.weight"))?)?;
    let bias = if bias { Some(backend.upload_weight(w.get(&format!("{name}.bias"))?)?) } else { None };
    Ok(Linear { w: weight, bias, out_features })
}

impl<B: Backend> LlamaModel<B> {
    /// Uploads the weights (Hugging Face names) to the backend.
    pub fn load(backend: &B, p: &ModelParams, w: &Weights) -> Result<Self> {
        if p.head_dim % 2 != 0 {
            return Err(EngineError::Config(format!("head_dim {} must be even for rotary embeddings", p.head_dim)));
        }
        let bias = p.attention_bias || p.architecture == Architecture::Qwen2;
        let (q_out, kv_out) = (p.num_heads * p.head_dim, p.num_kv_heads * p.head_dim);
        let layers = (0..p.num_layers)
            .map(|i| {
                let pre = format!("model.layers.{i}");
                Ok(Layer {
                    input_norm: backend.upload_weight(w.get(&format!("{pre}.input_layernorm.weight"))?)?,
                    post_norm: backend.upload_weight(w.get(&format!("{pre}.post_attention_layernorm.weight"))?)?,
                    q: linear(backend, w, &format!("{pre}.self_attn.q_proj"), bias, q_out)?,
                    k: linear(backend, w, &format!("{pre}.self_attn.k_proj"), bias, kv_out)?,
                    v: linear(backend, w, &format!("{pre}.self_attn.v_proj"), bias, kv_out)?,
                    o: linear(backend, w, &format!("{pre}.self_attn.o_proj"), false, p.hidden_size)?,
                    gate: linear(backend, w, &format!("{pre}.mlp.gate_proj"), false, p.intermediate_size)?,
                    up: linear(backend, w, &format!("{pre}.mlp.up_proj"), false, p.intermediate_size)?,
                    down: linear(backend, w, &format!("{pre}.mlp.down_proj"), false, p.hidden_size)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let lm_head = if p.tie_word_embeddings { None } else { Some(backend.upload_weight(w.get("lm_head.weight")?)?) };
        let inv = rope::inv_freq(p.head_dim, p.rope_theta, p.rope_scaling.as_ref());
        Ok(Self {
            params: p.clone(),
            embed: backend.upload_weight(w.get("model.embed_tokens.weight")?)?,
            layers,
            norm: backend.upload_weight(w.get("model.norm.weight")?)?,
            lm_head,
            inv_freq: backend.upload_f32(&inv)?,
        })
    }

    pub fn params(&self) -> &ModelParams {
        &self.params
    }

    fn project(&self, b: &B, l: &Linear<B>, x: &B::Buffer, m: usize, k: usize) -> Result<B::Buffer> {
        let out = b.alloc_f32(m * l.out_features)?;
        b.run(Op::MatMul { x, w: &l.w, bias: l.bias.as_ref(), out: &out, m, k, n: l.out_features })?;
        Ok(out)
    }

    /// Runs one step: writes the batch's K/V into `cache` and returns `[num_seqs, vocab]` logits (row-major) of the
    /// last token of each sequence.
    pub fn forward(&self, b: &B, batch: &BatchInput, cache: &PagedKvCache<B>) -> Result<Vec<f32>> {
        batch.validate(cache.block_size, cache.num_blocks)?;
        let p = &self.params;
        let n = batch.num_tokens();
        let num_seqs = batch.seqs.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        let (h, hd) = (p.hidden_size, p.head_dim);
        let eps = p.rms_norm_eps as f32;

        // Flatten the batch.
        let mut ids = Vec::with_capacity(n);
        let mut positions = Vec::with_capacity(n);
        let mut slots = Vec::with_capacity(n);
        let mut query_start = vec![0u32];
        let mut context_lens = Vec::with_capacity(num_seqs);
        let max_blocks = batch.seqs.iter().map(|s| s.block_table.len()).max().unwrap_or(0).max(1);
        let mut tables = vec![0u32; num_seqs * max_blocks];
        let mut last_rows = Vec::with_capacity(num_seqs);
        for (i, s) in batch.seqs.iter().enumerate() {
            ids.extend_from_slice(&s.token_ids);
            positions.extend((0..s.token_ids.len()).map(|t| (s.start_position + t) as u32));
            slots.extend_from_slice(&s.slot_mapping);
            query_start.push(ids.len() as u32);
            context_lens.push((s.start_position + s.token_ids.len()) as u32);
            tables[i * max_blocks..i * max_blocks + s.block_table.len()].copy_from_slice(&s.block_table);
            last_rows.push(ids.len() as u32 - 1);
        }
        let ids_buf = b.upload_u32(&ids)?;
        let pos_buf = b.upload_u32(&positions)?;
        let slot_buf = b.upload_u32(&slots)?;
        let qs_buf = b.upload_u32(&query_start)?;
        let ctx_buf = b.upload_u32(&context_lens)?;
        let bt_buf = b.upload_u32(&tables)?;
        let meta = AttentionMeta {
            num_seqs,
            query_start: &qs_buf,
            context_lens: &ctx_buf,
            block_tables: &bt_buf,
            max_blocks_per_seq: max_blocks,
            host_query_start: &query_start,
            host_context_lens: &context_lens,
            host_block_tables: &tables,
        };

        let residual = b.alloc_f32(n * h)?;
        b.run(Op::Embedding { table: &self.embed, ids: &ids_buf, out: &residual, num_tokens: n, hidden: h })?;
        let normed = b.alloc_f32(n * h)?;
        let zeros = b.alloc_f32(n * h)?;
        let mut delta: Option<B::Buffer> = None;
        let scale = 1.0 / (hd as f32).sqrt();
        for (li, l) in self.layers.iter().enumerate() {
            // residual += previous layer's output; normed = norm(residual)
            let x = delta.as_ref().unwrap_or(&zeros);
            b.run(Op::AddRmsNorm { x, residual: &residual, weight: &l.input_norm, out: &normed, rows: n, hidden: h, eps })?;
            let q = self.project(b, &l.q, &normed, n, h)?;
            let k = self.project(b, &l.k, &normed, n, h)?;
            let v = self.project(b, &l.v, &normed, n, h)?;
            let rope = |x: &B::Buffer, heads: usize| {
                b.run(Op::Rope { x, positions: &pos_buf, inv_freq: &self.inv_freq, num_tokens: n, num_heads: heads, head_dim: hd })
            };
            rope(&q, p.num_heads)?;
            rope(&k, p.num_kv_heads)?;
            let (kc, vc) = &cache.layers[li];
            b.run(Op::WriteKv {
                k: &k,
                v: &v,
                k_cache: kc,
                v_cache: vc,
                slot_mapping: &slot_buf,
                num_tokens: n,
                num_kv_heads: p.num_kv_heads,
                head_dim: hd,
                block_size: cache.block_size,
            })?;
            let attn = b.alloc_f32(n * p.num_heads * hd)?;
            b.run(Op::PagedAttention {
                q: &q,
                k_cache: kc,
                v_cache: vc,
                out: &attn,
                meta: &meta,
                num_heads: p.num_heads,
                num_kv_heads: p.num_kv_heads,
                head_dim: hd,
                block_size: cache.block_size,
                scale,
            })?;
            let o = self.project(b, &l.o, &attn, n, p.num_heads * hd)?;
            b.run(Op::AddRmsNorm { x: &o, residual: &residual, weight: &l.post_norm, out: &normed, rows: n, hidden: h, eps })?;
            let gate = self.project(b, &l.gate, &normed, n, h)?;
            let up = self.project(b, &l.up, &normed, n, h)?;
            let act = b.alloc_f32(n * p.intermediate_size)?;
            b.run(Op::SiluMul { gate: &gate, up: &up, out: &act, len: n * p.intermediate_size })?;
            delta = Some(self.project(b, &l.down, &act, n, p.intermediate_size)?);
        }
        // Only the last row of each sequence needs logits.
        let rows_buf = b.upload_u32(&last_rows)?;
        let last_delta = b.alloc_f32(num_seqs * h)?;
        let last_res = b.alloc_f32(num_seqs * h)?;
        let x = delta.as_ref().unwrap_or(&zeros);
        b.run(Op::GatherRows { x, rows: &rows_buf, out: &last_delta, num_rows: num_seqs, width: h })?;
        b.run(Op::GatherRows { x: &residual, rows: &rows_buf, out: &last_res, num_rows: num_seqs, width: h })?;
        let last = b.alloc_f32(num_seqs * h)?;
        b.run(Op::AddRmsNorm { x: &last_delta, residual: &last_res, weight: &self.norm, out: &last, rows: num_seqs, hidden: h, eps })?;
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        let logits = b.alloc_f32(num_seqs * p.vocab_size)?;
        b.run(Op::MatMul { x: &last, w: head, bias: None, out: &logits, m: num_seqs, k: h, n: p.vocab_size })?;
        b.download_f32(&logits)
    }
}
