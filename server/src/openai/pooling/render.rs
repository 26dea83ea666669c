//! The pooling routes' results as response values: vectors as floats or base64, a classifier's label, the cosine
//! similarity of two embeddings, and rerank results ordered by score.

use base64::Engine as _;

use super::types::{RerankDocument, RerankResult, Vector};
use super::validate::EncodingFormat;

/// A vector as `format` asks: base64 is the little-endian bytes of each f32, as the OpenAI client decodes it.
pub fn vector(data: Vec<f32>, format: EncodingFormat) -> Vector {
    match format {
        EncodingFormat::Float => Vector::Floats(data),
        EncodingFormat::Base64 => {
            let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
            Vector::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
        }
    }
}

/// The name of the best-scoring label (`LABEL_i` where the model names fewer labels than it scores).
pub fn label(probs: &[f32], labels: &[String]) -> String {
    let best = probs.iter().enumerate().fold(None::<(usize, f32)>, |best, (i, &p)| match best {
        Some((_, b)) if b >= p => best,
        _ => Some((i, p)),
    });
    let i = best.map_or(0, |(i, _)| i);
    labels.get(i).cloned().unwrap_or_else(|| format!("LABEL_{i}"))
}

/// Cosine similarity; 0 when either vector is all zeros (or the lengths differ).
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() {
        return 0.0;
    }
    let (mut dot, mut na, mut nb) = (0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        dot += f64::from(x) * f64::from(y);
        na += f64::from(x) * f64::from(x);
        nb += f64::from(y) * f64::from(y);
    }
    let norm = na.sqrt() * nb.sqrt();
    if norm == 0.0 {
        0.0
    } else {
        (dot / norm) as f32
    }
}

/// Rerank results: documents by score, best first (ties keep document order), the best `top_n` (0: all), each
/// with its document's text unless `return_documents` is false.
pub fn rerank(scores: &[f32], documents: Vec<String>, top_n: usize, return_documents: bool) -> Vec<RerankResult> {
    let mut results: Vec<RerankResult> = documents
        .into_iter()
        .zip(scores)
        .enumerate()
        .map(|(index, (text, &relevance_score))| RerankResult {
            index,
            document: return_documents.then_some(RerankDocument { text }),
            relevance_score,
        })
        .collect();
    results.sort_by(|a, b| b.relevance_score.total_cmp(&a.relevance_score));
    if top_n > 0 {
        results.truncate(top_n);
    }
    results
}
