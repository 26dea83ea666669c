//! Test fakes: `FakeEngine`, an `Engine` without a model. Its tokenizer maps each byte to one token (id = byte + 3;
//! ids 0, 1, 2 are `<s>`, `</s>`, `<pad>`); its chat template writes `<s>role: content\n…assistant:`, with
//! `tools: name,…\n` first when the request has tools, each assistant tool call as ` [call id name(arguments)]` after
//! the content and a tool result's id as `tool[id]:`; a request
//! "generates" the characters of `REPLY` one token at a time, honouring max_tokens, stop strings and log-probs.
//! In pooling mode (`FakeEngine::pooling`) a request answers a deterministic vector derived from its token ids
//! (`pooled`), then `Finished`.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rserve_engine::api::{
    EngineInfo, FinishReason, GenerateRequest, PoolingInfo, PoolingTask, RequestEvent, SamplingParams, StopReason,
    TokenLogprob, Usage,
};
use rserve_engine::engine::metrics::MetricsSetup;
use rserve_engine::engine::EngineMetrics;
use rserve_engine::error::ModelError;
use rserve_engine::structured::{Grammar, GrammarError, GrammarSpec};
use rserve_engine::{EngineError, TokenId};
use tokio::sync::mpsc;

use crate::port::{ChatRender, Engine, Events};

/// What every fake request generates (cut by max_tokens or a stop string).
pub const REPLY: &str = "Hello, world! I am a fake model.";
pub const VOCAB: usize = 259;

pub struct FakeEngine {
    pub info: EngineInfo,
    pub metrics: EngineMetrics,
    pub has_template: bool,
    /// Pause before each token (to test disconnects).
    pub token_delay: Duration,
    pub submitted: Mutex<Vec<GenerateRequest>>,
    /// Requests whose receiver went away before they finished.
    pub aborted: Arc<AtomicUsize>,
    /// Requests that produced all their events.
    pub completed: Arc<AtomicUsize>,
    /// If set, requests fail with this engine error.
    pub fail_with: Option<String>,
    /// What `is_alive` answers (a test stops the "engine thread" by clearing it).
    pub alive: AtomicBool,
    /// The `preempt_running` argument of each `reset_prefix_cache` call.
    pub prefix_cache_resets: Mutex<Vec<bool>>,
}

pub fn info(max_model_len: usize) -> EngineInfo {
    EngineInfo {
        model_path: "/models/fake".into(),
        max_model_len,
        vocab_size: VOCAB,
        block_size: 16,
        num_kv_blocks: 64,
        kv_cache_bytes: 1 << 20,
        weights_bytes: 1 << 20,
        dtype: "float32".into(),
        device: "cpu".into(),
        max_num_seqs: 8,
        eos_token_ids: vec![TokenId(1)],
        max_logprobs: 20,
        default_max_tokens: None,
        max_tokens_cap: None,
        pooling: None,
        max_num_batched_tokens: 8192,
    }
}

impl FakeEngine {
    pub fn new(max_model_len: usize) -> Self {
        Self {
            info: info(max_model_len),
            metrics: EngineMetrics::new(MetricsSetup { model_name: "smol".into(), ..MetricsSetup::default() })
                .expect("metrics"),
            has_template: true,
            token_delay: Duration::ZERO,
            submitted: Mutex::new(Vec::new()),
            aborted: Arc::new(AtomicUsize::new(0)),
            completed: Arc::new(AtomicUsize::new(0)),
            fail_with: None,
            alive: AtomicBool::new(true),
            prefix_cache_resets: Mutex::default(),
        }
    }

    /// A fake pooling model serving `pooling` (every request must then carry `PoolingParams`).
    pub fn pooling(max_model_len: usize, pooling: PoolingInfo) -> Self {
        let mut engine = Self::new(max_model_len);
        engine.info.pooling = Some(pooling);
        engine
    }

    pub fn submitted(&self) -> Vec<GenerateRequest> {
        self.submitted.lock().map(|v| v.clone()).unwrap_or_default()
    }
}

/// Token ids from bare numbers.
pub fn ids(ids: &[u32]) -> Vec<TokenId> {
    ids.iter().copied().map(TokenId).collect()
}

fn token_text(TokenId(id): TokenId) -> String {
    match id {
        0 => "<s>".into(),
        1 => "</s>".into(),
        2 => "<pad>".into(),
        b => String::from_utf8_lossy(&[(b - 3) as u8]).into_owned(),
    }
}

/// The events a request produces: one delta per character of `REPLY` up to max_tokens or a stop string.
pub fn script(req: &GenerateRequest) -> Vec<RequestEvent> {
    let mut text = REPLY.to_owned();
    let mut reason = FinishReason::Length;
    let mut stop_reason = None;
    if let Some((pos, s)) = req.stop.stop.iter().filter_map(|s| text.find(s.as_str()).map(|p| (p, s))).min() {
        text.truncate(pos);
        reason = FinishReason::Stop;
        stop_reason = Some(StopReason::Text(s.clone()));
    }
    let limit = req.stop.max_tokens;
    if text.len() > limit {
        text.truncate(limit);
        reason = FinishReason::Length;
        stop_reason = None;
    } else if stop_reason.is_none() {
        // The whole reply fits: it ends with EOS.
        reason = FinishReason::Stop;
    }
    let mut events: Vec<RequestEvent> = text
        .bytes()
        .map(|b| {
            let id = TokenId(b as u32 + 3);
            let logprobs = match req.sampling.logprobs {
                None => Vec::new(),
                Some(k) => vec![TokenLogprob {
                    token_id: id,
                    token: token_text(id),
                    logprob: -0.5,
                    top: (0..k as u32)
                        .map(|j| (TokenId(id.0 + j), token_text(TokenId(id.0 + j)), -0.5 - j as f32))
                        .collect(),
                }],
            };
            RequestEvent::Delta { text: token_text(id), token_ids: vec![id], logprobs }
        })
        .collect();
    events.push(RequestEvent::Finished {
        reason,
        usage: Usage { prompt_tokens: req.prompt_token_ids.len(), completion_tokens: text.len(), cached_tokens: 0 },
        stop_reason,
    });
    events
}

/// An embedding model's `PoolingInfo`: vectors of `embed_dim`, Matryoshka sizes as given.
pub fn embedder(embed_dim: usize, matryoshka: Option<Vec<usize>>) -> PoolingInfo {
    PoolingInfo {
        tasks: vec![PoolingTask::Embed],
        embed_dim,
        matryoshka,
        labels: Vec::new(),
        cross_encoder: false,
        bidirectional: true,
    }
}

/// A classifier's `PoolingInfo` with these labels; one label makes it a cross-encoder (a reranker).
pub fn classifier(labels: &[&str]) -> PoolingInfo {
    PoolingInfo {
        tasks: vec![PoolingTask::Classify],
        embed_dim: 4,
        matryoshka: None,
        labels: labels.iter().map(|l| l.to_string()).collect(),
        cross_encoder: labels.len() == 1,
        bidirectional: true,
    }
}

/// What the fake pools for a request, as a real engine returns it (`dimensions` and normalisation applied).
/// Embed: element `i` counts the prompt's ids with `id % embed_dim == i`, so equal texts embed alike. Classify:
/// label `j`'s logit counts the ids with `id % labels == j` (softmax with `activation`); a cross-encoder's one
/// logit is `4 * share - 2`, `share` being the part of the second segment's ids that the first segment holds
/// (sigmoid with `activation`), so a document sharing more of the query's bytes scores higher.
pub fn pooled(req: &GenerateRequest, info: &PoolingInfo) -> Vec<f32> {
    let Some(params) = &req.pooling else { return Vec::new() };
    let ids: Vec<u32> = req.prompt_token_ids.iter().map(|t| t.0).collect();
    match params.task {
        PoolingTask::Embed => {
            let dim = info.embed_dim.max(1);
            let mut v = vec![0f32; dim];
            for id in &ids {
                v[*id as usize % dim] += 1.0;
            }
            v.truncate(params.dimensions.unwrap_or(dim));
            if params.normalize.unwrap_or(true) {
                let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
                if norm > 0.0 {
                    v.iter_mut().for_each(|x| *x /= norm);
                }
            }
            v
        }
        PoolingTask::Classify if info.cross_encoder => {
            let types = params.token_type_ids.clone().unwrap_or_default();
            let segment = |s: u32| ids.iter().zip(&types).filter(move |&(_, &t)| t == s).map(|(id, _)| *id);
            let first: Vec<u32> = segment(0).collect();
            let second: Vec<u32> = segment(1).collect();
            let shared = second.iter().filter(|id| first.contains(id)).count();
            let logit = 4.0 * shared as f32 / second.len().max(1) as f32 - 2.0;
            vec![if params.activation { 1.0 / (1.0 + (-logit).exp()) } else { logit }]
        }
        PoolingTask::Classify => {
            let n = info.labels.len().max(1);
            let mut logits = vec![0f32; n];
            for id in &ids {
                logits[*id as usize % n] += 1.0;
            }
            if params.activation {
                let max = logits.iter().copied().fold(f32::MIN, f32::max);
                let exps: Vec<f32> = logits.iter().map(|l| (l - max).exp()).collect();
                let sum: f32 = exps.iter().sum();
                exps.into_iter().map(|e| e / sum).collect()
            } else {
                logits
            }
        }
    }
}

impl Engine for FakeEngine {
    fn info(&self) -> &EngineInfo {
        &self.info
    }

    fn metrics(&self) -> &EngineMetrics {
        &self.metrics
    }

    fn default_sampling(&self) -> SamplingParams {
        SamplingParams { temperature: 0.7, top_p: 0.9, ..SamplingParams::default() }
    }

    fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<TokenId>, EngineError> {
        let mut ids: Vec<TokenId> = if add_special_tokens { vec![TokenId(0)] } else { Vec::new() };
        ids.extend(text.bytes().map(|b| TokenId(b as u32 + 3)));
        Ok(ids)
    }

    /// The pair as `encode` writes each text, the second without its leading id, segments 0 then 1.
    fn encode_pair(&self, first: &str, second: &str) -> Result<(Vec<TokenId>, Vec<u32>), EngineError> {
        let mut ids = self.encode(first, true)?;
        let split = ids.len();
        ids.extend(self.encode(second, false)?);
        let types = (0..ids.len()).map(|i| u32::from(i >= split)).collect();
        Ok((ids, types))
    }

    fn decode(&self, ids: &[TokenId], skip_special_tokens: bool) -> Result<String, EngineError> {
        let mut bytes = Vec::new();
        for &id in ids {
            match id.0 {
                0..=2 if skip_special_tokens => {}
                0..=2 => bytes.extend(token_text(id).bytes()),
                b if (b as usize) < VOCAB => bytes.push((b - 3) as u8),
                b => return Err(EngineError::Model(ModelError::Tokenizer(format!("unknown id {b}")))),
            }
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    fn bos_token(&self) -> Option<String> {
        Some("<s>".into())
    }

    fn render_chat(&self, chat: &ChatRender<'_>) -> Option<Result<String, EngineError>> {
        if !self.has_template {
            return None;
        }
        if chat.turns.iter().any(|t| t.role == "bogus") {
            return Some(Err(EngineError::Model(ModelError::ChatTemplate("unknown role bogus".into()))));
        }
        let mut s = String::from("<s>");
        if let Some(tools) = chat.tools {
            let names: Vec<&str> = tools.iter().filter_map(|t| t["function"]["name"].as_str()).collect();
            s.push_str(&format!("tools: {}\n", names.join(",")));
        }
        for (k, v) in chat.variables.into_iter().flatten() {
            s.push_str(&format!("{k}={v}\n"));
        }
        for t in chat.turns {
            match &t.tool_call_id {
                Some(id) => s.push_str(&format!("{}[{id}]: {}", t.role, t.content)),
                None => s.push_str(&format!("{}: {}", t.role, t.content)),
            }
            for call in t.tool_calls.iter().flatten() {
                s.push_str(&format!(" [call {} {}({})]", call.id, call.function.name, call.function.arguments));
            }
            s.push('\n');
        }
        if chat.add_generation_prompt {
            s.push_str("assistant:");
        }
        Some(Ok(s))
    }

    /// The fake has no vocabulary to compile against: structured outputs are tested against real models.
    fn compile_grammar(&self, spec: &GrammarSpec) -> Result<Grammar, GrammarError> {
        Err(GrammarError(format!("the fake engine compiles no grammar ({spec:?})")))
    }

    fn submit(&self, request: GenerateRequest) -> Result<Events, EngineError> {
        if let Some(msg) = &self.fail_with {
            if msg == "stopped" {
                return Err(EngineError::EngineStopped);
            }
        }
        if let Ok(mut v) = self.submitted.lock() {
            v.push(request.clone());
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let mut events = match (&request.pooling, &self.info.pooling) {
            (Some(_), Some(info)) => vec![
                RequestEvent::Pooled { data: pooled(&request, info) },
                RequestEvent::Finished {
                    reason: FinishReason::Stop,
                    usage: Usage { prompt_tokens: request.prompt_token_ids.len(), ..Usage::default() },
                    stop_reason: None,
                },
            ],
            _ => script(&request),
        };
        if let Some(msg) = &self.fail_with {
            events = vec![RequestEvent::Error(msg.clone())];
        }
        let delay = self.token_delay;
        let aborted = self.aborted.clone();
        let completed = self.completed.clone();
        tokio::spawn(async move {
            for ev in events {
                if !delay.is_zero() {
                    tokio::select! {
                        _ = tx.closed() => { aborted.fetch_add(1, Ordering::SeqCst); return; }
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
                if tx.send(ev).is_err() {
                    aborted.fetch_add(1, Ordering::SeqCst);
                    return;
                }
            }
            completed.fetch_add(1, Ordering::SeqCst);
        });
        Ok(Events::channel(rx))
    }

    fn shutdown(&self) {}

    fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Relaxed)
    }

    fn reset_prefix_cache(
        &self,
        preempt_running: bool,
    ) -> futures_util::future::BoxFuture<'static, Result<bool, EngineError>> {
        self.prefix_cache_resets.lock().expect("lock").push(preempt_running);
        let result = if self.is_alive() { Ok(true) } else { Err(EngineError::EngineStopped) };
        Box::pin(std::future::ready(result))
    }
}
