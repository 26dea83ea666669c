//! `EncoderRunner`: an encoder (BERT, XLM-RoBERTa) behind `StepRunner`, for pooling only. Each step's inputs are
//! whole (the scheduler never splits a bidirectional input: `NewRequest::whole_prompt`) and keep no KV cache; the
//! scheduler's blocks are bookkeeping only. Generation steps are refused.

use super::{PoolRows, StepRunner};
use crate::backend::Backend;
use crate::error::{EngineError, Result};
use crate::model::bert::{EncoderBatch, EncoderModel};
use crate::model::ScheduledSeq;

pub struct EncoderRunner<B: Backend> {
    backend: B,
    model: EncoderModel<B>,
}

impl<B: Backend> EncoderRunner<B> {
    pub fn new(backend: B, model: EncoderModel<B>) -> Self {
        Self { backend, model }
    }
}

impl<B: Backend + Send> StepRunner for EncoderRunner<B>
where
    B::Buffer: Send,
{
    fn execute(&mut self, _batch: &[ScheduledSeq]) -> Result<Vec<f32>> {
        Err(EngineError::InvalidArgument("an encoder generates no tokens; it serves pooling requests".into()))
    }

    fn pool(&mut self, batch: &[ScheduledSeq], rows: &[PoolRows], segments: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
        if batch.len() != rows.len() || batch.len() != segments.len() {
            return Err(EngineError::InvalidArgument(format!(
                "{} pooling rows and {} segment lists for {} sequences",
                rows.len(),
                segments.len(),
                batch.len()
            )));
        }
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let (mut ids, mut types, mut query_start, mut out_rows) = (Vec::new(), Vec::new(), vec![0u32], Vec::new());
        let mut spans = Vec::with_capacity(batch.len());
        for ((q, r), seg) in batch.iter().zip(rows).zip(segments) {
            if q.start_position != 0 {
                return Err(EngineError::InvalidArgument(format!(
                    "an encoder input must run whole (request {} starts at {})",
                    q.request_id.0, q.start_position
                )));
            }
            let start = ids.len() as u32;
            ids.extend(q.token_ids.iter().map(|t| t.0));
            match seg.len() {
                0 => types.extend(std::iter::repeat_n(0u32, q.token_ids.len())),
                n if n == q.token_ids.len() => types.extend_from_slice(seg),
                n => {
                    return Err(EngineError::InvalidArgument(format!(
                        "{n} token types for {} tokens",
                        q.token_ids.len()
                    )))
                }
            }
            let end = ids.len() as u32;
            query_start.push(end);
            let span = r.range(start, end);
            out_rows.extend(span.clone());
            spans.push(span.len());
        }
        let batch = EncoderBatch { ids: &ids, types: &types, query_start: &query_start, rows: &out_rows };
        let hidden = self.model.forward(&self.backend, &batch)?;
        let all = self.backend.download_f32(&hidden)?;
        Ok(super::split_pooled(&all, spans, self.model.params().hidden_size))
    }

    fn vocab_size(&self) -> usize {
        self.model.params().vocab_size
    }

    fn device_name(&self) -> String {
        self.backend.device_name()
    }
}
