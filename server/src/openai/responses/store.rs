//! The responses kept for `GET /v1/responses/{id}` and `previous_response_id`: in memory, bounded to
//! `CAPACITY` entries, least recently used dropped first, so that a busy server never grows without limit (vLLM's
//! in-memory store has no bound; a client that needs a response later than that gets the same 404 as for any
//! unknown id).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use crate::openai::types::ChatMessageIn;

use super::types::{ResponseId, ResponseObject};

/// Most responses kept.
pub const CAPACITY: usize = 1024;

/// A stored response with the conversation that led to it, so that a follow-up can continue it.
#[derive(Debug, Clone)]
pub struct Stored {
    pub response: ResponseObject,
    /// The messages the model saw (without `instructions`, which a follow-up does not inherit, as under OpenAI) and
    /// the answer as an assistant message.
    pub conversation: Vec<ChatMessageIn>,
}

#[derive(Debug, Default)]
struct Lru {
    entries: HashMap<ResponseId, Arc<Stored>>,
    /// Least recently used first; may hold ids already replaced (skipped when evicting).
    order: VecDeque<ResponseId>,
}

/// The store; cheap to share (`Arc` inside `AppState`).
#[derive(Debug)]
pub struct ResponseStore {
    capacity: usize,
    inner: Mutex<Lru>,
}

impl Default for ResponseStore {
    fn default() -> Self {
        Self::with_capacity(CAPACITY)
    }
}

impl ResponseStore {
    pub fn with_capacity(capacity: usize) -> Self {
        Self { capacity: capacity.max(1), inner: Mutex::new(Lru::default()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lru> {
        // A panic elsewhere while holding the lock leaves the map consistent (every update is one insert/remove).
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn put(&self, stored: Stored) {
        let id = stored.response.id.clone();
        let mut lru = self.lock();
        lru.order.retain(|x| x != &id);
        lru.order.push_back(id.clone());
        lru.entries.insert(id, Arc::new(stored));
        while lru.entries.len() > self.capacity {
            let Some(oldest) = lru.order.pop_front() else { break };
            lru.entries.remove(&oldest);
        }
    }

    /// The stored response, now the most recently used.
    pub fn get(&self, id: &ResponseId) -> Option<Arc<Stored>> {
        let mut lru = self.lock();
        let found = lru.entries.get(id).cloned()?;
        lru.order.retain(|x| x != id);
        lru.order.push_back(id.clone());
        Some(found)
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }
}
