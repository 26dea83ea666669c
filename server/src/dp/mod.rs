//! Data parallelism (`--data-parallel-size N`): N engine replicas behind one HTTP endpoint. `start` loads them side
//! by side in this process (each on its own device or share of the cores: `rserve_engine::engine::replicas`), or,
//! under `mpiexec` (`dp x tp x pp` ranks), starts on rank 0 the engine of every replica, each driving its own group of
//! ranks (`replicas::start_over_mpi`); the router and everything below are the same either way.
//! `DataParallel` is the `Engine` the routes see, sending each request to the replica `router::choose` picks and
//! counting it in flight there until its events are dropped. A request's events come from its replica's stream, so
//! a client that goes away aborts it on that replica (its blocks freed there). Tokenizer, chat template, grammars and
//! static facts are the first replica's (every replica loaded the same model).

pub mod router;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::future::BoxFuture;
use rserve_engine::api::{EngineInfo, GenerateRequest, SamplingParams};
use rserve_engine::engine::{EngineConfig, EngineMetrics};
use rserve_engine::structured::{Grammar, GrammarError, GrammarSpec};
use rserve_engine::{EngineError, TokenId};

use crate::live::LiveEngine;
use crate::port::{ChatRender, Engine, Events};
use router::{Load, PrefixIndex};

/// Starts `replicas` engines of `config` (one: the plain engine). Blocking; the replicas load in parallel, and when
/// one fails the others are stopped and its error returned.
pub fn start(config: EngineConfig, replicas: usize) -> Result<Arc<dyn Engine>, EngineError> {
    let config = EngineConfig { data_parallel_size: replicas, ..config };
    if rserve_engine::engine::distributed::replicas_over_mpi(&config)? {
        let world = config.world();
        for r in 0..replicas {
            let ranks = world.ranks_of(r);
            tracing::info!(
                "Data-parallel replica {r}: MPI ranks {}-{} (tp={}, pp={}), --device {}",
                ranks.start,
                ranks.end - 1,
                world.tp,
                world.pp,
                config.device
            );
        }
        let handles = rserve_engine::engine::replicas::start_over_mpi(&config, replicas)?;
        return Ok(Arc::new(DataParallel::new(handles.into_iter().map(LiveEngine::from_handle).collect())));
    }
    let configs = rserve_engine::engine::replica_configs(&config, replicas)?;
    if configs.len() == 1 {
        let engine = configs.into_iter().next().map(LiveEngine::start).unwrap_or(Err(EngineError::EngineStopped))?;
        return Ok(Arc::new(engine));
    }
    for c in &configs {
        let threads = c.cpu_threads.map(|t| format!(", {t} CPU threads")).unwrap_or_default();
        let opencl = c.opencl_device.map(|d| format!(" device {d}")).unwrap_or_default();
        tracing::info!("Data-parallel replica {}: --device {}{opencl}{threads}", c.data_parallel_rank, c.device);
    }
    let started: Vec<Result<LiveEngine, EngineError>> = std::thread::scope(|s| {
        let loads: Vec<_> = configs
            .into_iter()
            .map(|c| {
                let rank = c.data_parallel_rank;
                s.spawn(move || {
                    let _span = tracing::info_span!("dp", engine = rank).entered();
                    LiveEngine::start(c)
                })
            })
            .collect();
        loads.into_iter().map(|h| h.join().unwrap_or(Err(EngineError::EngineStopped))).collect()
    });
    let mut engines = Vec::with_capacity(started.len());
    let mut failure = None;
    for (i, r) in started.into_iter().enumerate() {
        match r {
            Ok(e) => engines.push(e),
            Err(e) => {
                tracing::error!("data-parallel replica {i} failed to start: {e}");
                failure.get_or_insert(e);
            }
        }
    }
    if let Some(err) = failure {
        engines.iter().for_each(|e| e.shutdown());
        return Err(err);
    }
    Ok(Arc::new(DataParallel::new(engines)))
}

/// The replicas behind one `Engine`.
pub struct DataParallel {
    replicas: Vec<LiveEngine>,
    /// Requests in flight per replica (decremented when their `Events` drop).
    in_flight: Vec<Arc<AtomicUsize>>,
    prefixes: Mutex<PrefixIndex>,
}

/// One request counted in flight on its replica until dropped.
struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl DataParallel {
    fn new(replicas: Vec<LiveEngine>) -> Self {
        let info = replicas[0].info();
        let blocks: usize = replicas.iter().map(|r| r.info().num_kv_blocks).sum();
        let prefixes = Mutex::new(PrefixIndex::new(info.block_size, blocks));
        let in_flight = replicas.iter().map(|_| Arc::new(AtomicUsize::new(0))).collect();
        Self { replicas, in_flight, prefixes }
    }

    fn first(&self) -> &LiveEngine {
        &self.replicas[0]
    }

    /// Picks the replica for a prompt and records that it now holds the prompt's blocks.
    fn route(&self, prompt: &[TokenId]) -> usize {
        let loads: Vec<Load> = self
            .replicas
            .iter()
            .zip(&self.in_flight)
            .map(|(r, n)| {
                let m = r.metrics();
                Load {
                    in_flight: n.load(Ordering::Relaxed),
                    waiting: m.num_requests_waiting.get().max(0) as usize,
                    max_num_seqs: r.info().max_num_seqs,
                    kv_usage: m.kv_cache_usage(),
                }
            })
            .collect();
        let mut prefixes = self.prefixes.lock().unwrap_or_else(|p| p.into_inner());
        let hashes = prefixes.block_hashes(prompt);
        let matched = prefixes.matched(&hashes, self.replicas.len());
        let chosen = router::choose(&loads, &matched);
        prefixes.insert(&hashes, chosen);
        tracing::debug!("routed to replica {chosen}: prefix blocks held {matched:?}, loads {loads:?}");
        chosen
    }
}

impl Engine for DataParallel {
    fn info(&self) -> &EngineInfo {
        self.first().info()
    }

    fn metrics(&self) -> &EngineMetrics {
        self.first().metrics()
    }

    fn replica_metrics(&self) -> Vec<&EngineMetrics> {
        self.replicas.iter().map(|r| r.metrics()).collect()
    }

    fn default_sampling(&self) -> SamplingParams {
        self.first().default_sampling()
    }

    fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<TokenId>, EngineError> {
        self.first().encode(text, add_special_tokens)
    }

    fn encode_pair(&self, first: &str, second: &str) -> Result<(Vec<TokenId>, Vec<u32>), EngineError> {
        self.first().encode_pair(first, second)
    }

    fn decode(&self, ids: &[TokenId], skip_special_tokens: bool) -> Result<String, EngineError> {
        self.first().decode(ids, skip_special_tokens)
    }

    fn bos_token(&self) -> Option<String> {
        self.first().bos_token()
    }

    fn render_chat(&self, chat: &ChatRender<'_>) -> Option<Result<String, EngineError>> {
        self.first().render_chat(chat)
    }

    fn compile_grammar(&self, spec: &GrammarSpec) -> Result<Grammar, GrammarError> {
        self.first().compile_grammar(spec)
    }

    fn submit(&self, request: GenerateRequest) -> Result<Events, EngineError> {
        let r = self.route(&request.prompt_token_ids);
        let counter = self.in_flight[r].clone();
        counter.fetch_add(1, Ordering::Relaxed);
        let guard = InFlight(counter);
        let events = self.replicas[r].submit(request)?;
        Ok(events.with_guard(Box::new(guard)))
    }

    fn shutdown(&self) {
        self.replicas.iter().for_each(|r| r.shutdown());
    }

    /// Alive while every replica is: one dead replica ends the server as a dead engine does (vLLM's DP likewise).
    fn is_alive(&self) -> bool {
        self.replicas.iter().all(|r| r.is_alive())
    }

    fn reset_prefix_cache(&self, preempt_running: bool) -> BoxFuture<'static, Result<bool, EngineError>> {
        self.prefixes.lock().unwrap_or_else(|p| p.into_inner()).clear();
        let resets: Vec<_> = self.replicas.iter().map(|r| r.reset_prefix_cache(preempt_running)).collect();
        Box::pin(async move {
            let mut all = true;
            for reset in resets {
                all &= reset.await?;
            }
            Ok(all)
        })
    }
}
