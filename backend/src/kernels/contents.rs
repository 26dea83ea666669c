//! What a device buffer holds, as the host knows it: the one description every kernel-launching backend tags its
//! buffers with, and the checks the op layer runs on it before a kernel touches device memory.
//!
//! u32 buffers (token ids, positions, slot mappings, block tables) record their length and one past their largest
//! value when they are written, so an op bounds every index they hold in O(1) (an out-of-range slot must be an
//! error, not a write past the cache) however many layers read the same step's buffers.

use rserve_kernels::ElemType;

use crate::cpu::be;
use crate::error::Result;
use crate::WeightDType;

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

    /// Values in a u32 buffer.
    pub fn u32_len(&self) -> Option<usize> {
        match self {
            Contents::U32 { len, .. } => Some(*len),
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
    fn le<T: bytemuck::Pod>(v: Vec<T>) -> Vec<u8> {
        bytemuck::cast_slice(&v).to_vec()
    }
    match t.rank() {
        1 => Ok(WeightData::Vector(t.to_dtype(DType::F32)?.to_vec1::<f32>()?)),
        2 => {
            let (rows, cols) = t.dims2()?;
            let flat = t.flatten_all()?;
            let (dtype, bytes) = match t.dtype() {
                DType::F32 => (WeightDType::F32, le(flat.to_vec1::<f32>()?)),
                DType::BF16 => (WeightDType::BF16, le(flat.to_vec1::<half::bf16>()?)),
                DType::F16 => (WeightDType::F16, le(flat.to_vec1::<half::f16>()?)),
                other => return Err(be(format!("weights of dtype {other:?} are not supported on this device"))),
            };
            Ok(WeightData::Matrix { bytes, contents: Contents::Matrix { dtype, rows, cols } })
        }
        r => Err(be(format!("weights must be 1-D or 2-D, got rank {r}"))),
    }
}

// The values' memory is their little-endian encoding on the targets the device backends run on (x86-64, aarch64),
// so weights are handed to a device as they sit in memory: no conversion per value, which made weight uploads the
// longest start-up phase.
const _: () = assert!(cfg!(target_endian = "little"));

/// Calls `f` with the bytes of 2-D weights stacked by rows (`parts`: one dtype, one column count) and the
/// description of the stacked matrix. Each part's bytes are its own storage when it is contiguous (no copy).
pub fn with_matrix_bytes<R>(
    parts: &[&candle_core::Tensor],
    f: impl FnOnce(&[&[u8]], Contents) -> Result<R>,
) -> Result<R> {
    use candle_core::{CpuStorage, DType, Storage};
    let first = parts.first().ok_or_else(|| be("no weight to upload"))?;
    let (dtype, cols) = (first.dtype(), first.dims2()?.1);
    let mut rows = 0;
    let mut owned = Vec::with_capacity(parts.len());
    for t in parts {
        let (r, c) = t.dims2()?;
        if c != cols || t.dtype() != dtype {
            return Err(be(format!("stacked weights: [{r}, {c}] {:?} after {cols} columns of {dtype:?}", t.dtype())));
        }
        rows += r;
        owned.push(t.contiguous()?);
    }
    let wdtype = match dtype {
        DType::F32 => WeightDType::F32,
        DType::BF16 => WeightDType::BF16,
        DType::F16 => WeightDType::F16,
        other => return Err(be(format!("weights of dtype {other:?} are not supported on this device"))),
    };
    let guards: Vec<_> = owned.iter().map(|t| t.storage_and_layout()).collect();
    let mut bytes = Vec::with_capacity(parts.len());
    for (storage, layout) in &guards {
        let (start, end) = layout.contiguous_offsets().ok_or_else(|| be("weight is not contiguous"))?;
        bytes.push(match &**storage {
            Storage::Cpu(CpuStorage::F32(v)) => bytemuck::cast_slice(&v[start..end]),
            Storage::Cpu(CpuStorage::BF16(v)) => bytemuck::cast_slice(&v[start..end]),
            Storage::Cpu(CpuStorage::F16(v)) => bytemuck::cast_slice(&v[start..end]),
            _ => return Err(be("weights must be host tensors of f32, bf16 or f16")),
        });
    }
    f(&bytes, Contents::Matrix { dtype: wdtype, rows, cols })
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device, Tensor};

    use super::{weight_data, with_matrix_bytes, Contents, WeightData};
    use crate::WeightDType;

    #[test]
    fn stacked_weight_bytes_are_the_bytes_of_the_stacked_matrix() {
        let part = |rows: usize, seed: f32| {
            let v: Vec<f32> = (0..rows * 6).map(|i| seed + i as f32 * 0.37).collect();
            Tensor::from_vec(v, (rows, 6), &Device::Cpu).unwrap().to_dtype(DType::BF16).unwrap()
        };
        // A view that is not contiguous in its storage (a transpose) takes the copying path.
        let (a, b) = (part(3, 1.0), part(6, -2.0).t().unwrap());
        assert!(!b.is_contiguous());
        let stacked = Tensor::cat(&[&a, &b], 0).unwrap();
        let WeightData::Matrix { bytes: want, contents } = weight_data(&stacked).unwrap() else { panic!("a matrix") };
        assert!(matches!(contents, Contents::Matrix { dtype: WeightDType::BF16, rows: 9, cols: 6 }));
        with_matrix_bytes(&[&a, &b], |parts, c| {
            assert_eq!(parts.concat(), want);
            assert!(matches!(c, Contents::Matrix { dtype: WeightDType::BF16, rows: 9, cols: 6 }));
            Ok(())
        })
        .unwrap();
        let wrong = part(2, 0.0).to_dtype(DType::F32).unwrap();
        assert!(with_matrix_bytes(&[&a, &wrong], |_, _| Ok(())).is_err(), "parts of two dtypes are refused");
    }
}
