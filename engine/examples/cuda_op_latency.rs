//! What each op of a decode step costs inside a CUDA graph, at a real model's shape (random bf16 weights, bf16 KV
//! cache): every op is captured 64 times back to back into one graph, the graph is replayed, and the time per op is
//! printed. This is how a decode step runs in the server (graph replay, programmatic dependent launch), so the sum of
//! a layer's ops times the layer count is the step's cost, and the near-empty `gather_rows` of one short row is the
//! floor a launch costs. Then whole decode steps of the model's layers (one layer's weights reused by every layer:
//! a layer streams ~0.4 GB, far past the L2, so each layer still reads its weights from memory; a KV cache per layer),
//! captured with and without each class of op, to show what each class costs in sequence. Needs an NVIDIA GPU.
//!
//! Usage: cuda_op_latency MODEL_DIR [ROWS,...]   (default rows 1,16,64; decode rows, one per sequence)

use candle_core::{Device, Tensor};
use rand::{Rng, SeedableRng};
use rserve_engine::backend::cuda::CudaBackend;
use rserve_engine::backend::{Activation, AttentionMeta, AttnShape, Backend, Op, RopeIo, WeightDType};

type R<T> = std::result::Result<T, Box<dyn std::error::Error>>;
type Buf = <CudaBackend as Backend>::Buffer;

const REPS: usize = 64;
/// Tokens per KV-cache block.
const BS: usize = 16;

/// Captures `calls` calls of `f` (given 0, 1, ...) into one CUDA graph, replays it 3 times, then times `replays`
/// replays; returns ms per replay. `f` first runs eagerly for 0..`eager`: that builds any cached work split the
/// capture needs.
fn replay_ms(gpu: &CudaBackend, eager: usize, calls: usize, replays: usize, f: &dyn Fn(usize) -> R<()>) -> R<f64> {
    (0..eager).try_for_each(f)?;
    gpu.synchronize()?;
    gpu.begin_capture()?;
    let captured = (0..calls).try_for_each(f);
    let graph = gpu.end_capture()?;
    captured?;
    for _ in 0..3 {
        gpu.replay(&graph)?;
    }
    gpu.synchronize()?;
    let t0 = gpu.record_event()?;
    for _ in 0..replays {
        gpu.replay(&graph)?;
    }
    let t1 = gpu.record_event()?;
    gpu.synchronize()?;
    Ok(t0.elapsed_ms(&t1)? as f64 / replays as f64)
}

/// µs per op of `f` (one op per call) replayed from a graph of `REPS` calls.
fn time(gpu: &CudaBackend, name: &str, rows: usize, f: &dyn Fn(usize) -> R<()>) -> R<f64> {
    let us = replay_ms(gpu, 1, REPS, 10, f)? * 1e3 / REPS as f64;
    println!("op | {rows} | {name} | {us:.2}");
    Ok(us)
}

/// The model's shape at `rows` rows (one per sequence), and the ops of a decode step at that shape.
#[derive(Clone, Copy)]
struct Shape {
    rows: usize,
    h: usize,
    hd: usize,
    hq: usize,
    hkv: usize,
}

impl Shape {
    fn add_rms_norm<'a>(&self, x: &'a Buf, residual: &'a Buf, weight: &'a Buf, out: &'a Buf) -> Op<'a, Buf> {
        Op::AddRmsNorm { x, residual, weight, out, rows: self.rows, hidden: self.h, eps: 1e-5 }
    }

    /// `out[rows, n] = x[rows, k] . w^T`.
    fn matmul<'a>(&self, x: &'a Buf, w: &'a Buf, out: &'a Buf, k: usize, n: usize) -> Op<'a, Buf> {
        Op::MatMul { x, w, bias: None, out, m: self.rows, k, n }
    }

    /// A zeroed bf16 K or V cache for `rows` sequences at context `ctx`.
    fn kv_cache(&self, gpu: &CudaBackend, ctx: usize) -> R<Buf> {
        Ok(gpu.alloc_kv_cache(self.rows * ctx.div_ceil(BS) * BS * self.hkv * self.hd, WeightDType::BF16)?)
    }

    fn rope_write_kv<'a>(
        &self,
        t: &'a NewTokens,
        inv_freq: &'a Buf,
        qkv: &'a Buf,
        q: &'a Buf,
        kc: &'a Buf,
        vc: &'a Buf,
    ) -> Op<'a, Buf> {
        Op::RopeWriteKv {
            io: RopeIo {
                qkv,
                positions: &t.positions,
                inv_freq,
                q_out: q,
                k_cache: kc,
                v_cache: vc,
                slot_mapping: &t.slot_mapping,
            },
            qk_norm: None,
            num_tokens: self.rows,
            num_heads: self.hq,
            num_kv_heads: self.hkv,
            head_dim: self.hd,
            block_size: BS,
            mscale: 1.0,
        }
    }

    fn paged_attention<'a>(
        &self,
        meta: &'a AttentionMeta<'a, Buf>,
        q: &'a Buf,
        kc: &'a Buf,
        vc: &'a Buf,
        out: &'a Buf,
    ) -> Op<'a, Buf> {
        Op::PagedAttention {
            q,
            k_cache: kc,
            v_cache: vc,
            out,
            meta,
            shape: AttnShape {
                num_heads: self.hq,
                num_kv_heads: self.hkv,
                head_dim: self.hd,
                block_size: BS,
                scale: 1.0 / (self.hd as f32).sqrt(),
                window: None,
                softcap: None,
            },
            sinks: None,
        }
    }
}

/// `rows` sequences at context `ctx`, each with its last token new and blocks of its own, in sequence order: the
/// positions and cache slots of the new tokens (what `rope_write_kv` reads besides activations and caches).
struct NewTokens {
    slot_mapping: Buf,
    positions: Buf,
}

impl NewTokens {
    fn new(gpu: &CudaBackend, rows: usize, ctx: usize) -> R<Self> {
        let nb = ctx.div_ceil(BS);
        let slots: Vec<u32> = (0..rows).map(|seq| (seq * nb * BS + ctx - 1) as u32).collect();
        let positions = gpu.upload_u32(&vec![(ctx - 1) as u32; rows])?;
        Ok(NewTokens { slot_mapping: gpu.upload_u32(&slots)?, positions })
    }
}

/// The attention metadata of the same sequences: query starts, context lengths and block tables, on the host and on
/// the device.
struct Tables {
    /// Blocks per sequence.
    nb: usize,
    qs: Vec<u32>,
    ctxs: Vec<u32>,
    tables: Vec<u32>,
    tab_b: Buf,
    ctx_b: Buf,
    qs_b: Buf,
}

impl Tables {
    fn new(gpu: &CudaBackend, rows: usize, ctx: usize) -> R<Self> {
        let nb = ctx.div_ceil(BS);
        let tables: Vec<u32> = (0..(rows * nb) as u32).collect();
        let (qs, ctxs) = ((0..=rows as u32).collect::<Vec<_>>(), vec![ctx as u32; rows]);
        let (qs_b, ctx_b, tab_b) = (gpu.upload_u32(&qs)?, gpu.upload_u32(&ctxs)?, gpu.upload_u32(&tables)?);
        Ok(Tables { nb, qs, ctxs, tables, tab_b, ctx_b, qs_b })
    }

    fn meta(&self) -> AttentionMeta<'_, Buf> {
        let (device, host) = ([&self.qs_b, &self.ctx_b, &self.tab_b], [&self.qs[..], &self.ctxs, &self.tables]);
        AttentionMeta::new(device, host, self.nb, BS).expect("the sequences' metadata is consistent")
    }
}

fn main() -> R<()> {
    let args: Vec<String> = std::env::args().collect();
    let dir = args.get(1).ok_or("usage: cuda_op_latency MODEL_DIR [ROWS,...]")?;
    let row_list: Vec<usize> = args
        .get(2)
        .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 16, 64]);
    let p = rserve_engine::weights::dummy::resolve(dir)?.load_params()?;
    let gpu = CudaBackend::new(0)?;
    let (h, hd, hq, hkv, inter) = (p.hidden_size, p.head_dim, p.num_heads, p.num_kv_heads, p.intermediate_size);
    let qkv_w = (hq + 2 * hkv) * hd;
    println!("device: {}; shape hidden {h}, heads {hq}/{hkv} x {hd}, intermediate {inter}", gpu.device_name());
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let mut rand_vec = |n: usize| -> Vec<f32> { (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect() };
    // Enough copies of each weight that replays stream it from memory, as a step does (the L2 holds ~50 MB).
    let mut weights = |n: usize, k: usize| -> R<Vec<_>> {
        let copies = (200_000_000 / (n * k * 2)).clamp(1, 8);
        (0..copies)
            .map(|_| {
                let v: Vec<half::bf16> = rand_vec(n * k).into_iter().map(|x| half::bf16::from_f32(x * 0.05)).collect();
                Ok(gpu.upload_weight(&Tensor::from_vec(v, (n, k), &Device::Cpu)?)?)
            })
            .collect()
    };
    let (w_qkv, w_o, w_gu, w_down) =
        (weights(qkv_w, h)?, weights(h, hq * hd)?, weights(2 * inter, h)?, weights(h, inter)?);
    let norm_w = gpu.upload_weight(&Tensor::from_vec(vec![1.0f32; h], h, &Device::Cpu)?)?;
    let inv: Vec<f32> = (0..hd / 2).map(|i| 1.0 / (p.rope_theta as f32).powf(2.0 * i as f32 / hd as f32)).collect();
    let inv = gpu.upload_f32(&inv)?;
    println!("op | rows | name | us per op (graph replay)");
    for rows in row_list {
        let s = Shape { rows, h, hd, hq, hkv };
        let mut rand_vec = {
            let mut rng = rand::rngs::StdRng::seed_from_u64(rows as u64);
            move |n: usize| -> Vec<f32> { (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect() }
        };
        // One matmul per call, cycling through the copies of its weight.
        let time_matmul = |name: &str, x: &Buf, ws: &[Buf], out: &Buf, k: usize, n: usize| {
            time(&gpu, name, rows, &|i| Ok(gpu.run(s.matmul(x, &ws[i % ws.len()], out, k, n))?))
        };
        let idx = gpu.upload_u32(&[0])?;
        let tiny = gpu.upload_f32(&rand_vec(64))?;
        let tiny_out = gpu.alloc_f32(64)?;
        time(&gpu, "gather_rows 1 x 64 (launch floor)", rows, &|_| {
            Ok(gpu.run(Op::GatherRows { x: &tiny, rows: &idx, out: &tiny_out, num_rows: 1, width: 64 })?)
        })?;
        let (x, res) = (gpu.upload_f32(&rand_vec(rows * h))?, gpu.upload_f32(&rand_vec(rows * h))?);
        let normed = gpu.alloc_matmul_input(rows * h, &w_qkv[0])?;
        time(&gpu, "add_rms_norm -> bf16", rows, &|_| Ok(gpu.run(s.add_rms_norm(&x, &res, &norm_w, &normed))?))?;
        let qkv_out = gpu.alloc_f32(rows * qkv_w)?;
        time_matmul("matmul q/k/v (bf16 in)", &normed, &w_qkv, &qkv_out, h, qkv_w)?;
        for ctx in [256usize, 512] {
            let (kc, vc) = (s.kv_cache(&gpu, ctx)?, s.kv_cache(&gpu, ctx)?);
            let new = NewTokens::new(&gpu, rows, ctx)?;
            let qkv = gpu.upload_f32(&rand_vec(rows * qkv_w))?;
            let q = gpu.alloc_f32(rows * hq * hd)?;
            if ctx == 256 {
                time(&gpu, "rope_write_kv (bf16 cache)", rows, &|_| {
                    Ok(gpu.run(s.rope_write_kv(&new, &inv, &qkv, &q, &kc, &vc))?)
                })?;
            }
            let tables = Tables::new(&gpu, rows, ctx)?;
            let meta = tables.meta();
            for (label, out) in [
                ("f32 out", gpu.alloc_f32(rows * hq * hd)?),
                ("matmul-input out", gpu.alloc_matmul_input(rows * hq * hd, &w_o[0])?),
            ] {
                let r = time(&gpu, &format!("paged_attention ctx {ctx} ({label})"), rows, &|_| {
                    Ok(gpu.run(s.paged_attention(&meta, &q, &kc, &vc, &out))?)
                });
                if let Err(e) = r {
                    println!("op | {rows} | paged_attention ctx {ctx} ({label}) | n/a ({e})");
                }
            }
        }
        let attn = gpu.upload_f32(&rand_vec(rows * hq * hd))?;
        let attn16 = gpu.alloc_matmul_input(rows * hq * hd, &w_o[0])?;
        let o_out = gpu.alloc_f32(rows * h)?;
        time_matmul("matmul o (f32 in: conversion + gemm)", &attn, &w_o, &o_out, hq * hd, h)?;
        time_matmul("matmul o (bf16 in)", &attn16, &w_o, &o_out, hq * hd, h)?;
        let normed2 = gpu.alloc_matmul_input(rows * h, &w_gu[0])?;
        let gu = gpu.upload_f32(&rand_vec(rows * 2 * inter))?;
        time_matmul("matmul gate/up (bf16 in)", &normed2, &w_gu, &gu, h, 2 * inter)?;
        let act = gpu.alloc_matmul_input(rows * inter, &w_down[0])?;
        time(&gpu, "silu_mul -> bf16", rows, &|_| {
            Ok(gpu.run(Op::GatedAct { gate_up: &gu, out: &act, rows, width: inter, act: Activation::Silu })?)
        })?;
        let down = gpu.alloc_f32(rows * h)?;
        time_matmul("matmul down (bf16 in)", &act, &w_down, &down, inter, h)?;

        // Whole steps: every layer in sequence, with op classes left out.
        let ctx = 256;
        let caches =
            (0..p.num_layers).map(|_| Ok((s.kv_cache(&gpu, ctx)?, s.kv_cache(&gpu, ctx)?))).collect::<R<Vec<_>>>()?;
        let (new, tables) = (NewTokens::new(&gpu, rows, ctx)?, Tables::new(&gpu, rows, ctx)?);
        let meta = tables.meta();
        let (qkv, q) = (gpu.upload_f32(&rand_vec(rows * qkv_w))?, gpu.alloc_f32(rows * hq * hd)?);
        let (wq, wo, wg, wd) = (&w_qkv[0], &w_o[0], &w_gu[0], &w_down[0]);
        // (norms, rope + attention, matmuls)
        let variants = [
            ("whole layers", true, true, true),
            ("without the norms", false, true, true),
            ("without rope + attention", true, false, true),
            ("without the matmuls", true, true, false),
            ("matmuls only", false, false, true),
        ];
        for (label, norms, attention, matmuls) in variants {
            let layer = |li: usize| -> R<()> {
                if norms {
                    gpu.run(s.add_rms_norm(&down, &res, &norm_w, &normed))?;
                }
                if matmuls {
                    gpu.run(s.matmul(&normed, wq, &qkv_out, h, qkv_w))?;
                }
                let (kc, vc) = &caches[li];
                if attention {
                    gpu.run(s.rope_write_kv(&new, &inv, &qkv, &q, kc, vc))?;
                    gpu.run(s.paged_attention(&meta, &q, kc, vc, &attn16))?;
                }
                if matmuls {
                    gpu.run(s.matmul(&attn16, wo, &o_out, hq * hd, h))?;
                }
                if norms {
                    gpu.run(s.add_rms_norm(&o_out, &res, &norm_w, &normed2))?;
                }
                if matmuls {
                    gpu.run(s.matmul(&normed2, wg, &gu, h, 2 * inter))?;
                }
                if norms || attention {
                    gpu.run(Op::GatedAct { gate_up: &gu, out: &act, rows, width: inter, act: Activation::Silu })?;
                }
                if matmuls {
                    gpu.run(s.matmul(&act, wd, &down, inter, h))?;
                }
                Ok(())
            };
            let ms = replay_ms(&gpu, p.num_layers, p.num_layers, 20, &layer)?;
            println!("step | {rows} | {} layers {label} | {ms:.3} ms", p.num_layers);
        }
    }
    Ok(())
}
