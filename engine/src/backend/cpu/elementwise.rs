//! CPU elementwise and row-wise ops: embedding gather, RMSNorm, residual add, rotary embedding, SiLU-and-multiply,
//! row gather. Bounds are checked once per op so a malformed batch is an error, never a panic.

use candle_core::{DType, Device, Tensor};
use rayon::prelude::*;

use super::{be, CpuBuffer};
use crate::error::Result;

fn check_len(what: &str, have: usize, need: usize) -> Result<()> {
    if have < need {
        return Err(be(format!("{what}: buffer holds {have} values, op needs {need}")));
    }
    Ok(())
}

pub(super) fn embedding(table: &CpuBuffer, ids: &[u32], out: &mut [f32], n: usize, hidden: usize) -> Result<()> {
    check_len("embedding ids", ids.len(), n)?;
    check_len("embedding out", out.len(), n * hidden)?;
    let t = table.matrix()?;
    let vocab = t.dim(0)?;
    if let Some(bad) = ids[..n].iter().find(|&&i| i as usize >= vocab) {
        return Err(be(format!("token id {bad} is outside the vocabulary of {vocab}")));
    }
    let idx = Tensor::from_slice(&ids[..n], n, &Device::Cpu)?;
    let rows = t.index_select(&idx, 0)?.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    out[..n * hidden].copy_from_slice(&rows);
    Ok(())
}

pub(super) fn add_in_place(acc: &mut [f32], x: &[f32], len: usize) -> Result<()> {
    check_len("add acc", acc.len(), len)?;
    check_len("add x", x.len(), len)?;
    acc[..len].iter_mut().zip(&x[..len]).for_each(|(a, b)| *a += b);
    Ok(())
}

pub(super) fn rms_norm(x: &[f32], w: &[f32], out: &mut [f32], rows: usize, hidden: usize, eps: f32) -> Result<()> {
    check_len("rms_norm x", x.len(), rows * hidden)?;
    check_len("rms_norm weight", w.len(), hidden)?;
    check_len("rms_norm out", out.len(), rows * hidden)?;
    out[..rows * hidden].par_chunks_mut(hidden).zip(x[..rows * hidden].par_chunks(hidden)).for_each(|(o, xr)| {
        let ms = xr.iter().map(|v| v * v).sum::<f32>() / hidden as f32;
        let r = 1.0 / (ms + eps).sqrt();
        for ((o, &v), &wv) in o.iter_mut().zip(xr).zip(w) {
            *o = wv * (v * r);
        }
    });
    Ok(())
}

pub(super) fn rope(
    x: &mut [f32],
    positions: &[u32],
    inv_freq: &[f32],
    n: usize,
    heads: usize,
    head_dim: usize,
) -> Result<()> {
    let half = head_dim / 2;
    check_len("rope x", x.len(), n * heads * head_dim)?;
    check_len("rope positions", positions.len(), n)?;
    check_len("rope inv_freq", inv_freq.len(), half)?;
    x[..n * heads * head_dim].par_chunks_mut(heads * head_dim).zip(&positions[..n]).for_each(|(row, &pos)| {
        let (cos, sin): (Vec<f32>, Vec<f32>) = inv_freq[..half]
            .iter()
            .map(|&f| {
                let a = pos as f32 * f;
                (a.cos(), a.sin())
            })
            .unzip();
        for head in row.chunks_mut(head_dim) {
            let (a, b) = head.split_at_mut(half);
            for i in 0..half {
                let (x1, x2) = (a[i], b[i]);
                a[i] = x1 * cos[i] - x2 * sin[i];
                b[i] = x2 * cos[i] + x1 * sin[i];
            }
        }
    });
    Ok(())
}

pub(super) fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32], len: usize) -> Result<()> {
    check_len("silu gate", gate.len(), len)?;
    check_len("silu up", up.len(), len)?;
    check_len("silu out", out.len(), len)?;
    out[..len].par_chunks_mut(4096).zip(gate[..len].par_chunks(4096).zip(up[..len].par_chunks(4096))).for_each(
        |(o, (g, u))| {
            for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
                *o = g / (1.0 + (-g).exp()) * u;
            }
        },
    );
    Ok(())
}

pub(super) fn gather_rows(x: &[f32], rows: &[u32], out: &mut [f32], num_rows: usize, width: usize) -> Result<()> {
    check_len("gather rows", rows.len(), num_rows)?;
    check_len("gather out", out.len(), num_rows * width)?;
    for (i, &r) in rows[..num_rows].iter().enumerate() {
        let r = r as usize;
        check_len("gather x", x.len(), (r + 1) * width)?;
        out[i * width..(i + 1) * width].copy_from_slice(&x[r * width..(r + 1) * width]);
    }
    Ok(())
}
