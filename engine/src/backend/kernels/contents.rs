//! What a device buffer holds, as the host knows it: the one description every kernel-launching backend tags its
//! buffers with, and the checks the op layer runs on it before a kernel touches device memory.
//!
//! u32 buffers (token ids, positions, slot mappings, block tables) record their length and one past their largest
//! value when they are written, so an op bounds every index they hold in O(1) (an out-of-range slot must be an
//! error, not a write past the cache) however many layers read the same step's buffers.

use rserve_kernels::ElemType;

use crate::backend::cpu::be;
use crate::backend::WeightDType;
use crate::error::Result;

/// The contents of one device buffer.
#[derive(Debug, Clone)]
pub enum Contents {
    /// `len` f32 values (activations, an f32 KV cache, 1-D weights, tables).
    F32 { len: usize },
    /// `len` u32 values, all below `bound` (values the host did not write are bounded by `u32::MAX`).
    U32 { len: usize, bound: u32 },
    /// A row-major 2-D weight `[rows, cols]` in its dtype.
    Matrix { dtype: WeightDType, rows: usize, cols: usize },
    /// `len` values of a 16-bit type: the activations a 16-bit matrix multiply reads (`Backend::alloc_matmul_input`)
    /// or a 16-bit KV cache.
    Half { dtype: WeightDType, len: usize },
    /// Bytes no op reads as a typed argument (a backend's own scratch).
    Raw,
}

impl Contents {
    /// Values in an f32 buffer.
    pub fn f32_len(&self) -> Option<usize> {
        match self {
            Contents::F32 { len } => Some(*len),
            _ => None,
        }
    }

    /// Checks an f32 buffer of at least `need` values; returns its length.
    pub fn f32(&self, what: &str, need: usize) -> Result<usize> {
        match self {
            Contents::F32 { len } if *len >= need => Ok(*len),
            Contents::F32 { len } => Err(be(format!("{what}: buffer holds {len} values, op needs {need}"))),
            _ => Err(be(format!("{what}: expected an f32 buffer"))),
        }
    }

    /// The description of a u32 buffer holding `data`.
    pub fn u32_of(data: &[u32]) -> Self {
        Contents::U32 { len: data.len(), bound: data.iter().max().map_or(0, |&m| m.saturating_add(1)) }
    }

    /// Checks a u32 buffer of at least `need` values; returns the bound of its values (each is below it).
    pub fn u32(&self, what: &str, need: usize) -> Result<usize> {
        match self {
            Contents::U32 { len, bound } if *len >= need => Ok(*bound as usize),
            Contents::U32 { len, .. } => Err(be(format!("{what}: buffer holds {len} values, op needs {need}"))),
            _ => Err(be(format!("{what}: expected a u32 buffer"))),
        }
    }

    /// The dtype and shape of a 2-D weight.
    pub fn matrix(&self, what: &str) -> Result<(WeightDType, usize, usize)> {
        match self {
            Contents::Matrix { dtype, rows, cols } => Ok((*dtype, *rows, *cols)),
            _ => Err(be(format!("{what}: expected a weight matrix"))),
        }
    }

    /// Length and element type of an f32 or 16-bit value buffer (activations or a KV cache).
    pub fn values(&self) -> Option<(usize, ElemType)> {
        match self {
            Contents::F32 { len } => Some((*len, ElemType::F32)),
            Contents::Half { dtype: WeightDType::BF16, len } => Some((*len, ElemType::Bf16)),
            Contents::Half { dtype: WeightDType::F16, len } => Some((*len, ElemType::F16)),
            _ => None,
        }
    }

    /// Checks an f32 or 16-bit activation buffer of at least `need` values; returns its type (the kernels'
    /// `out_kind`).
    pub fn act(&self, what: &str, need: usize) -> Result<ElemType> {
        let (len, ty) = self.values().ok_or_else(|| be(format!("{what}: expected an activation buffer")))?;
        if len < need {
            return Err(be(format!("{what}: buffer holds {len} values, op needs {need}")));
        }
        Ok(ty)
    }
}

/// The element type kernels use for weights of `dtype`.
pub fn elem_type(dtype: WeightDType) -> ElemType {
    match dtype {
        WeightDType::F32 => ElemType::F32,
        WeightDType::BF16 => ElemType::Bf16,
        WeightDType::F16 => ElemType::F16,
    }
}

/// The length and type of a layer's K and V caches, which must agree.
pub fn kv_pair(k: &Contents, v: &Contents, what: &str) -> Result<(usize, ElemType)> {
    match (k.values(), v.values()) {
        (Some((kl, kt)), Some((vl, vt))) if kt == vt => Ok((kl.min(vl), kt)),
        _ => Err(be(format!("{what}: the K and V caches must be KV-cache buffers of one type"))),
    }
}

/// A checkpoint tensor as a kernel backend uploads it.
pub enum WeightData {
    /// A 1-D weight (norm weight, bias): the kernels read it as f32.
    Vector(Vec<f32>),
    /// A row-major 2-D weight in its own dtype: its little-endian bytes and their description.
    Matrix { bytes: Vec<u8>, contents: Contents },
}

/// What `upload_weight` puts on a kernel device for `t` (1-D or 2-D; f32, bf16 or f16).
pub fn weight_data(t: &candle_core::Tensor) -> Result<WeightData> {
    use candle_core::DType;
    fn le<T: Copy, const N: usize>(v: Vec<T>, f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
        v.into_iter().flat_map(f).collect()
    }
    match t.rank() {
        1 => Ok(WeightData::Vector(t.to_dtype(DType::F32)?.to_vec1::<f32>()?)),
        2 => {
            let (rows, cols) = t.dims2()?;
            let flat = t.flatten_all()?;
            let (dtype, bytes) = match t.dtype() {
                DType::F32 => (WeightDType::F32, le(flat.to_vec1::<f32>()?, f32::to_le_bytes)),
                DType::BF16 => (WeightDType::BF16, le(flat.to_vec1::<half::bf16>()?, half::bf16::to_le_bytes)),
                DType::F16 => (WeightDType::F16, le(flat.to_vec1::<half::f16>()?, half::f16::to_le_bytes)),
                other => return Err(be(format!("weights of dtype {other:?} are not supported on this device"))),
            };
            Ok(WeightData::Matrix { bytes, contents: Contents::Matrix { dtype, rows, cols } })
        }
        r => Err(be(format!("weights must be 1-D or 2-D, got rank {r}"))),
    }
}
