//! 16-bit activations and KV caches against the CPU backend: the norm and SiLU ops writing a 16-bit matmul input
//! (decode sizes take the prefetching GEMV), attention over bf16 / f16 KV caches at every shape (decode, split-KV,
//! the fused reduction past 16 rows, prefill with and without a prefix), and attention written straight into the
//! output projection's 16-bit input.

use candle_core::DType;
use rand::rngs::StdRng;
use rand::Rng;
use rserve_engine::backend::WeightDType as W;

use crate::common::rand_vec;
use crate::ops::{AttnSpec, Check, OpSpec};

/// Norm -> matmul and SiLU-and-multiply -> matmul through a 16-bit matmul input.
pub fn activation_specs(r: &mut StdRng) -> Vec<Check> {
    let mut specs: Vec<Check> = Vec::new();
    for dt in [DType::BF16, DType::F16] {
        specs.push((
            format!("add_rms_norm->matmul_{dt:?} 5x4096x1000"),
            2e-2,
            OpSpec::NormMatMul {
                x: rand_vec(r, 5 * 4096, 2.0),
                res: rand_vec(r, 5 * 4096, 2.0),
                nw: rand_vec(r, 4096, 1.0),
                w: rand_vec(r, 1000 * 4096, 0.05),
                dtype: dt,
                rows: 5,
                hidden: 4096,
                n: 1000,
            },
        ));
        specs.push((
            format!("silu_mul->matmul_{dt:?} 3x1536x576"),
            2e-2,
            OpSpec::SiluMatMul {
                gate_up: rand_vec(r, 3 * 2 * 1536, 4.0),
                w: rand_vec(r, 576 * 1536, 0.05),
                dtype: dt,
                rows: 3,
                width: 1536,
                n: 576,
            },
        ));
    }
    // Decode-sized matmuls of 16-bit activations (the producers write the weight's type) take the prefetching GEMV
    // (`matmul_pdla_*`, checked here at up to GEMV_PDL_ROWS rows): the 8B shapes at 1, 2 and 4 rows, and a row count past a
    // work-group's multiple.
    for dt in [DType::BF16, DType::F16] {
        for (rows, n) in [(1usize, 6144usize), (4, 1000)] {
            specs.push((
                format!("add_rms_norm->matmul_{dt:?} {rows}x4096x{n}"),
                2e-2,
                OpSpec::NormMatMul {
                    x: rand_vec(r, rows * 4096, 2.0),
                    res: rand_vec(r, rows * 4096, 2.0),
                    nw: rand_vec(r, 4096, 1.0),
                    w: rand_vec(r, n * 4096, 0.05),
                    dtype: dt,
                    rows,
                    hidden: 4096,
                    n,
                },
            ));
        }
        for rows in [1usize, 2] {
            specs.push((
                format!("silu_mul->matmul_{dt:?} {rows}x14336x4096"),
                2e-2,
                OpSpec::SiluMatMul {
                    gate_up: rand_vec(r, rows * 2 * 14336, 4.0),
                    w: rand_vec(r, 4096 * 14336, 0.05),
                    dtype: dt,
                    rows,
                    width: 14336,
                    n: 4096,
                },
            ));
        }
    }
    specs
}

/// Rope, KV-cache writes and attention with 16-bit caches, then attention fused into a 16-bit output projection.
pub fn attention_specs(r: &mut StdRng) -> Vec<Check> {
    let mut specs: Vec<Check> = Vec::new();
    // Every attention shape with the 16-bit caches a 16-bit model keeps (keys and values rounded as they are stored:
    // a few 1e-3 against the f32 reference for the new tokens); the test matrix covers the f32 cache.
    for (kv, tol) in [(W::BF16, 2e-2), (W::F16, 5e-3)] {
        let t = format!(" {} cache", kv.as_str());
        specs.push((
            format!("rope_write_kv+attention decode (8B shape){t}"),
            tol,
            attention_spec(r, &[1, 37, 300, 129], &[1, 1, 1, 1], 32, 8, 128, 16, kv),
        ));
        specs.push((
            format!("rope_write_kv+attention split-KV ctx 1500{t}"),
            tol,
            attention_spec(r, &[1500, 700], &[1, 1], 32, 8, 128, 16, kv),
        ));
        // Above 16 decode rows the CUDA decode kernel reduces its own partitions (`fused_reduce`).
        let ctx20: Vec<usize> = (0..20).map(|i| 40 + 37 * i).collect();
        specs.push((
            format!("rope_write_kv+attention split-KV 20 rows{t}"),
            tol,
            attention_spec(r, &ctx20, &[1; 20], 32, 8, 128, 16, kv),
        ));
        specs.push((
            format!("rope_write_kv+attention prefill+prefix{t}"),
            tol,
            attention_spec(r, &[128, 77, 40], &[128, 20, 1], 9, 3, 64, 16, kv),
        ));
        specs.push((
            format!("rope_write_kv+attention prefill 8B shape{t}"),
            tol,
            attention_spec(r, &[130], &[130], 32, 8, 128, 16, kv),
        ));
    }
    // Attention written straight into the output projection's 16-bit input (decode, split-KV, prefill, mixed).
    for (dt, kv) in [(DType::BF16, W::BF16), (DType::F16, W::F16)] {
        for (what, ctx, qlen) in [
            ("decode", vec![1, 37, 300, 129], vec![1, 1, 1, 1]),
            ("split-KV", vec![1500, 700], vec![1, 1]),
            ("prefill+decode", vec![130, 300], vec![130, 1]),
        ] {
            let mut spec = attention_spec(r, &ctx, &qlen, 32, 8, 128, 16, kv);
            if let OpSpec::Attention(a) = &mut spec {
                a.o_proj = Some((rand_vec(r, 512 * 32 * 128, 0.05), dt, 512));
            }
            specs.push((format!("attention {what}->o_proj_{dt:?}"), 2e-2, spec));
        }
    }
    specs
}

/// Sequences with `ctx[s]` tokens of which the last `qlen[s]` are new; random cache contents for the rest.
#[allow(clippy::too_many_arguments)] // one test case: its shape, given in full
fn attention_spec(
    rng: &mut StdRng,
    ctx: &[usize],
    qlen: &[usize],
    heads: usize,
    kvh: usize,
    hd: usize,
    bs: usize,
    kv: rserve_engine::backend::WeightDType,
) -> OpSpec {
    let max_blocks = ctx.iter().map(|c| c.div_ceil(bs)).max().unwrap_or(1);
    let num_blocks = max_blocks * ctx.len() + 3;
    let row = kvh * hd;
    let mut tables = vec![0u32; ctx.len() * max_blocks];
    // Blocks handed out in a scrambled order, so tables are not the identity.
    let mut ids: Vec<u32> = (0..num_blocks as u32).collect();
    for i in (1..ids.len()).rev() {
        ids.swap(i, rng.gen_range(0..=i));
    }
    let mut next = 0;
    let (mut qs, mut slots, mut pos) = (vec![0u32], Vec::new(), Vec::new());
    for (s, (&c, &ql)) in ctx.iter().zip(qlen).enumerate() {
        for blk in 0..c.div_ceil(bs) {
            tables[s * max_blocks + blk] = ids[next];
            next += 1;
        }
        for p in c - ql..c {
            slots.push(tables[s * max_blocks + p / bs] * bs as u32 + (p % bs) as u32);
            pos.push(p as u32);
        }
        qs.push(qs[s] + ql as u32);
    }
    let n = slots.len();
    OpSpec::Attention(AttnSpec {
        qkv: rand_vec(rng, n * (heads * hd + 2 * row), 1.0),
        pos,
        qs,
        ctx: ctx.iter().map(|&c| c as u32).collect(),
        tables,
        max_blocks,
        slots,
        heads,
        kvh,
        hd,
        bs,
        cache_k: rand_vec(rng, num_blocks * bs * row, 1.0),
        cache_v: rand_vec(rng, num_blocks * bs * row, 1.0),
        kv,
        o_proj: None,
    })
}
