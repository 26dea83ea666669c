//! Which dequantized weight tensors have a packed twin: the GGUF loader registers each tensor it dequantized from a
//! packed format under candle's tensor id (unique for the process's life; clones share it), and the CPU backend looks
//! it up at upload. The registry holds weak references: the loaded `Weights` own the packed matrices (`Keep`), so
//! dropping the weights frees them and a tensor the model changed (cut to a shard, converted) has no twin.
//!
//! A loader that keeps only the blocks (`weights::load_packed`) registers a placeholder in the tensor's place: the
//! right shape and dtype, one NaN broadcast (no memory). `is_placeholder` tells it apart from a real weight, so the
//! CPU backend refuses one that lost its twin; a copy made of one anyway (which has no twin either) is all NaN, so
//! whatever uses it shows it rather than computing with zeros.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use candle_core::{Tensor, TensorId};

use super::PackedMatrix;

type Map = HashMap<TensorId, Weak<PackedMatrix>>;

fn map() -> &'static Mutex<Map> {
    static MAP: OnceLock<Mutex<Map>> = OnceLock::new();
    MAP.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The packed matrices a `Weights` keeps alive for the CPU backend to find.
#[derive(Clone, Default)]
pub struct Keep(Vec<Arc<PackedMatrix>>);

impl std::fmt::Debug for Keep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Keep({} packed matrices)", self.0.len())
    }
}

impl Keep {
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Bytes of all packed matrices.
    pub fn byte_len(&self) -> usize {
        self.0.iter().map(|p| p.byte_len()).sum()
    }
}

/// Records `packed` as the block form of `t` (which must be its dequantized value) and adds it to `keep`.
pub fn register(t: &Tensor, packed: PackedMatrix, keep: &mut Keep) {
    let packed = Arc::new(packed);
    let mut m = map().lock().unwrap_or_else(|e| e.into_inner());
    // Entries of dropped weights are swept here, so the map stays as large as the weights alive.
    m.retain(|_, w| w.strong_count() > 0);
    m.insert(t.id(), Arc::downgrade(&packed));
    keep.0.push(packed);
}

/// A `[rows, cols]` stand-in for a weight kept only in its blocks: one NaN broadcast, holding no memory.
pub fn placeholder(rows: usize, cols: usize, dtype: candle_core::DType) -> candle_core::Result<Tensor> {
    Tensor::new(f32::NAN, &candle_core::Device::Cpu)?.to_dtype(dtype)?.broadcast_as((rows, cols))
}

/// Whether `t` is a `placeholder` (or a view of one): every stride zero over more than one element, which no loaded
/// weight has.
pub fn is_placeholder(t: &Tensor) -> bool {
    t.elem_count() > 1 && t.stride().iter().all(|&s| s == 0)
}

/// The packed twin of `t`, if it has one and its owner is alive.
pub fn lookup(t: &Tensor) -> Option<Arc<PackedMatrix>> {
    map().lock().unwrap_or_else(|e| e.into_inner()).get(&t.id()).and_then(Weak::upgrade)
}
