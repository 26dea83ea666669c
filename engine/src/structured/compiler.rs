//! Grammar compilation: a `GrammarSpec` becomes a compiled `Grammar` (llguidance's parser in its start state), once
//! per distinct spec. Requests with the same schema (every request of an agent loop, the `n` choices of one request)
//! share the compiled form and each get a fresh copy of its state.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use llguidance::api::TopLevelGrammar;
use llguidance::{ParserFactory, TokenParser};
use toktrie::InferenceCapabilities;

use super::spec::GrammarSpec;
use super::tok_env::GrammarTokenizer;
use crate::tokenizer::Tokenizer;
use crate::TokenId;

/// Compiled grammars kept for reuse; the oldest is dropped first beyond this.
const CACHE_ENTRIES: usize = 256;

/// A spec the grammar engine refused (bad schema, regex or grammar), with its message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct GrammarError(pub String);

/// A compiled grammar: cheap to clone; each request makes its own `Constraint` from it.
#[derive(Clone)]
pub struct Grammar {
    key: Arc<str>,
    parser: Arc<TokenParser>,
}

impl Grammar {
    /// A parser in the grammar's start state, owned by one request.
    pub(crate) fn fresh_parser(&self) -> TokenParser {
        self.parser.deep_clone()
    }
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Grammar").field(&self.key).finish()
    }
}

impl PartialEq for Grammar {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}

/// Compiles specs against the model's vocabulary and caches the results.
pub struct GrammarCompiler {
    factory: ParserFactory,
    cache: Mutex<Cache>,
}

#[derive(Default)]
struct Cache {
    map: HashMap<Arc<str>, Grammar>,
    order: VecDeque<Arc<str>>,
}

impl GrammarCompiler {
    /// The compiler for a model: `vocab_size` is the width of its logits; `eos` are the ids that end a generation
    /// (allowed once a grammar is complete).
    pub fn new(tokenizer: Arc<Tokenizer>, vocab_size: usize, eos: &[TokenId]) -> Result<Self, GrammarError> {
        let env = GrammarTokenizer::env(tokenizer, vocab_size, eos);
        let slices = llguidance::earley::SlicedBiasComputer::general_slices();
        let mut factory = ParserFactory::new(&env, InferenceCapabilities::default(), &slices)
            .map_err(|e| GrammarError(format!("cannot build the grammar engine's vocabulary: {e}")))?;
        // Grammar errors reach the client as 400s; llguidance's own stderr logging would repeat them in the log.
        factory.quiet();
        Ok(Self { factory, cache: Mutex::new(Cache::default()) })
    }

    /// The compiled grammar of `spec`, from the cache when the same spec was compiled before.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Grammar, GrammarError> {
        let key: Arc<str> = spec.cache_key().into();
        if let Some(g) = self.lock().map.get(&key) {
            return Ok(g.clone());
        }
        let top: TopLevelGrammar = spec.to_llguidance()?;
        let parser = self.factory.create_parser(top).map_err(|e| GrammarError(e.to_string()))?;
        let grammar = Grammar { key: key.clone(), parser: Arc::new(parser) };
        let mut cache = self.lock();
        if cache.map.insert(key.clone(), grammar.clone()).is_none() {
            cache.order.push_back(key);
            while cache.order.len() > CACHE_ENTRIES {
                if let Some(old) = cache.order.pop_front() {
                    cache.map.remove(&old);
                }
            }
        }
        Ok(grammar)
    }

    /// How many compiled grammars are cached.
    pub fn cached(&self) -> usize {
        self.lock().map.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }
}
