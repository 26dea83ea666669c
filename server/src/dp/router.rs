//! The data-parallel router's choice: which replica a request goes to. It goes where it will start soonest (the
//! fewest requests queued beyond what the replica can run at once), and among those prefers the replica that
//! already holds the prompt's leading blocks in its prefix cache (each full block held counts as one request less
//! in flight), then the one with fewer requests in flight, then the lower KV cache usage, then the lower index.
//!
//! Which replica holds which prefix is the router's own record (`PrefixIndex`): the chained hashes of the prompt's
//! full blocks (one hash per `block_size` tokens, each over its parent's hash and its tokens, as the KV manager
//! identifies blocks), each with the set of replicas it was sent to. A replica may have evicted a block since; the
//! record is a hint that only changes where a request runs, never what it computes. It holds at most as many blocks
//! as the replicas' KV caches together, dropping the oldest first.

use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};

use rserve_engine::TokenId;

/// One replica's load when a request arrives.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Load {
    /// Requests submitted to it and not yet finished (the router's own count: exact, and current in a burst).
    pub in_flight: usize,
    /// Its engine's waiting gauge (updated once per step).
    pub waiting: usize,
    /// How many sequences it runs at once (`--max-num-seqs`).
    pub max_num_seqs: usize,
    /// Fraction of its KV blocks in use, 0..=1.
    pub kv_usage: f64,
}

impl Load {
    /// Requests that will wait before this one can start: the engine's queue, or what the router sent beyond the
    /// running limit when the gauge has not caught up yet. The gauge is published once per step, so it may still
    /// count requests that have finished since: never more than are in flight.
    fn queued(&self) -> usize {
        self.waiting.min(self.in_flight).max(self.in_flight.saturating_sub(self.max_num_seqs))
    }
}

/// The replica a request goes to, given each replica's load and how many of the prompt's leading blocks each holds.
/// `loads` is not empty; `matched` has one entry per replica.
pub fn choose(loads: &[Load], matched: &[usize]) -> usize {
    let key = |i: usize| {
        let l = &loads[i];
        let held = matched.get(i).copied().unwrap_or(0);
        (l.queued(), l.in_flight as i64 - held as i64, l.in_flight, (l.kv_usage * 1e6) as u64, i)
    };
    (0..loads.len()).min_by_key(|&i| key(i)).unwrap_or(0)
}

/// Which replicas were sent which prompt blocks.
#[derive(Debug)]
pub struct PrefixIndex {
    block_size: usize,
    capacity: usize,
    /// Block hash -> the replicas holding it (bit i: replica i).
    holders: HashMap<u64, u64>,
    /// Insertion order, for dropping the oldest beyond `capacity`.
    order: VecDeque<u64>,
}

impl PrefixIndex {
    /// An empty record for blocks of `block_size` tokens, holding at most `capacity` blocks.
    pub fn new(block_size: usize, capacity: usize) -> Self {
        Self {
            block_size: block_size.max(1),
            capacity: capacity.max(1),
            holders: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    /// The chained hashes of the prompt's full blocks.
    pub fn block_hashes(&self, prompt: &[TokenId]) -> Vec<u64> {
        let mut parent = 0u64;
        prompt
            .chunks_exact(self.block_size)
            .map(|block| {
                let mut h = std::hash::DefaultHasher::new();
                parent.hash(&mut h);
                for t in block {
                    t.0.hash(&mut h);
                }
                parent = h.finish();
                parent
            })
            .collect()
    }

    /// For each of `replicas` replicas, how many leading blocks of `hashes` it holds.
    pub fn matched(&self, hashes: &[u64], replicas: usize) -> Vec<usize> {
        (0..replicas)
            .map(|r| hashes.iter().take_while(|h| self.holders.get(h).is_some_and(|m| m & (1 << r) != 0)).count())
            .collect()
    }

    /// Records that `replica` now holds these blocks.
    pub fn insert(&mut self, hashes: &[u64], replica: usize) {
        for &h in hashes {
            let mask = self.holders.entry(h).or_insert_with(|| {
                self.order.push_back(h);
                0
            });
            *mask |= 1 << replica;
        }
        while self.order.len() > self.capacity {
            if let Some(old) = self.order.pop_front() {
                self.holders.remove(&old);
            }
        }
    }

    /// Forgets everything (the replicas' prefix caches were reset).
    pub fn clear(&mut self) {
        self.holders.clear();
        self.order.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idle(n: usize) -> Vec<Load> {
        vec![Load { max_num_seqs: 4, ..Load::default() }; n]
    }

    fn tokens(ids: std::ops::Range<u32>) -> Vec<TokenId> {
        ids.map(TokenId).collect()
    }

    #[test]
    fn an_idle_server_fills_replicas_in_turn() {
        let mut loads = idle(3);
        let mut sent = vec![];
        for _ in 0..6 {
            let r = choose(&loads, &[0, 0, 0]);
            loads[r].in_flight += 1;
            sent.push(r);
        }
        assert_eq!(sent, [0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn the_replica_with_the_shorter_queue_wins_over_a_held_prefix() {
        let mut loads = idle(2);
        // Replica 0 runs its limit and has two waiting: a request there starts after those.
        loads[0] = Load { in_flight: 6, waiting: 2, max_num_seqs: 4, kv_usage: 0.5 };
        loads[1] = Load { in_flight: 3, waiting: 0, max_num_seqs: 4, kv_usage: 0.9 };
        assert_eq!(choose(&loads, &[50, 0]), 1);
        // The waiting gauge lags a burst: what the router sent beyond the limit counts as queued too.
        loads[0] = Load { in_flight: 6, waiting: 0, max_num_seqs: 4, kv_usage: 0.0 };
        assert_eq!(choose(&loads, &[50, 0]), 1);
        // A gauge that still counts finished requests does not send a prefix away from an idle replica.
        loads[0] = Load { in_flight: 0, waiting: 1, max_num_seqs: 4, kv_usage: 0.0 };
        loads[1] = Load::default();
        assert_eq!(choose(&loads, &[19, 0]), 0);
    }

    #[test]
    fn a_held_prefix_outweighs_as_many_requests_in_flight_as_it_has_blocks() {
        let mut loads = idle(2);
        loads[1].in_flight = 3;
        assert_eq!(choose(&loads, &[0, 3]), 0, "a tie on in-flight minus held goes to fewer in flight");
        assert_eq!(choose(&loads, &[0, 4]), 1);
        assert_eq!(choose(&loads, &[0, 2]), 0);
    }

    #[test]
    fn kv_usage_then_index_break_ties() {
        let mut loads = idle(3);
        loads[0].kv_usage = 0.3;
        loads[1].kv_usage = 0.2;
        loads[2].kv_usage = 0.2;
        assert_eq!(choose(&loads, &[0, 0, 0]), 1);
    }

    #[test]
    fn prompts_match_their_leading_full_blocks_on_the_replicas_that_got_them() {
        let mut index = PrefixIndex::new(4, 100);
        let a = index.block_hashes(&tokens(0..10)); // two full blocks; the last 2 tokens are no block
        assert_eq!(a.len(), 2);
        index.insert(&a, 1);
        // Same first block, different second: one block matched, on replica 1 only.
        let mut b_tokens = tokens(0..4);
        b_tokens.extend(tokens(100..108));
        let b = index.block_hashes(&b_tokens);
        assert_eq!(index.matched(&b, 3), [0, 1, 0]);
        assert_eq!(index.matched(&a, 3), [0, 2, 0]);
        // The hash is chained: an equal second block after a different first one is not a match.
        let mut c_tokens = tokens(50..54);
        c_tokens.extend(tokens(4..8));
        assert_eq!(index.matched(&index.block_hashes(&c_tokens), 3), [0, 0, 0]);
        index.insert(&b, 2);
        assert_eq!(index.matched(&a, 3), [0, 2, 1]);
        index.clear();
        assert_eq!(index.matched(&a, 3), [0, 0, 0]);
    }

    #[test]
    fn the_record_drops_its_oldest_blocks_beyond_its_capacity() {
        let mut index = PrefixIndex::new(2, 3);
        let old = index.block_hashes(&tokens(0..4));
        index.insert(&old, 0);
        let new = index.block_hashes(&tokens(10..14));
        index.insert(&new, 0);
        assert_eq!(index.matched(&old, 1), [0]);
        assert_eq!(index.matched(&new, 1), [2]);
    }
}
