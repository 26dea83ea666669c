//! Hash maps keyed by ids (`RequestId`, `BlockHash`): a cheap multiplicative hasher instead of SipHash, because the
//! scheduler looks every running request up several times per step. Keys are engine-assigned counters or already
//! well-mixed hashes, never raw user input, so flooding resistance is not needed here.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// An odd 64-bit constant (2^64 divided by the golden ratio) whose multiplication spreads bits upward.
const MIX: u64 = 0x9E37_79B9_7F4A_7C15;

/// Hasher for small integer keys: each written word is xor-ed into the state, which is then multiplied by `MIX`.
#[derive(Debug, Default, Clone, Copy)]
pub struct IdHasher(u64);

impl IdHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(26) ^ word).wrapping_mul(MIX);
    }
}

impl Hasher for IdHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }

    #[inline]
    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }
}

/// A `HashMap` keyed by an id, using [`IdHasher`].
pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// A `HashSet` of ids, using [`IdHasher`].
pub type IdSet<K> = std::collections::HashSet<K, BuildHasherDefault<IdHasher>>;
