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
use rserve_engine::backend::{AttentionMeta, Backend, Op, WeightDType};

type R<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const REPS: usize = 64;

/// µs per op of `f` (one op per call) replayed from a graph of `REPS` calls.
fn time(gpu: &CudaBackend, name: &str, rows: usize, f: &dyn Fn(usize) -> R<()>) -> R<f64> {
    f(0)?; // eager first: builds any cached work split the capture needs
    gpu.synchronize()?;
    gpu.begin_capture()?;
    let captured = (0..REPS).try_for_each(f);
    let graph = gpu.end_capture()?;
    captured?;
    for _ in 0..3 {
        gpu.replay(&graph)?;
    }
    gpu.synchronize()?;
    let replays = 10;
    let t0 = gpu.record_event()?;
    for _ in 0..replays {
        gpu.replay(&graph)?;
    }
    let t1 = gpu.record_event()?;
    gpu.synchronize()?;
    let us = t0.elapsed_ms(&t1)? as f64 * 1e3 / (replays * REPS) as f64;
    println!("op | {rows} | {name} | {us:.2}");
    Ok(us)
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
    let bs = 16usize;
    println!("op | rows | name | us per op (graph replay)");
    for rows in row_list {
        let mut rand_vec = {
            let mut rng = rand::rngs::StdRng::seed_from_u64(rows as u64);
            move |n: usize| -> Vec<f32> { (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect() }
        };
        let idx = gpu.upload_u32(&[0])?;
        let tiny = gpu.upload_f32(&rand_vec(64))?;
        let tiny_out = gpu.alloc_f32(64)?;
        time(&gpu, "gather_rows 1 x 64 (launch floor)", rows, &|_| {
            Ok(gpu.run(Op::GatherRows { x: &tiny, rows: &idx, out: &tiny_out, num_rows: 1, width: 64 })?)
        })?;
        let (x, res) = (gpu.upload_f32(&rand_vec(rows * h))?, gpu.upload_f32(&rand_vec(rows * h))?);
        let normed = gpu.alloc_matmul_input(rows * h, &w_qkv[0])?;
        time(&gpu, "add_rms_norm -> bf16", rows, &|_| {
            Ok(gpu.run(Op::AddRmsNorm {
                x: &x,
                residual: &res,
                weight: &norm_w,
                out: &normed,
                rows,
                hidden: h,
                eps: 1e-5,
            })?)
        })?;
        let qkv_out = gpu.alloc_f32(rows * qkv_w)?;
        time(&gpu, "matmul q/k/v (bf16 in)", rows, &|i| {
            let w = &w_qkv[i % w_qkv.len()];
            Ok(gpu.run(Op::MatMul { x: &normed, w, bias: None, out: &qkv_out, m: rows, k: h, n: qkv_w })?)
        })?;
        // Every sequence at context `ctx` (its last token new), blocks of its own.
        for ctx in [256usize, 512] {
            let nb = ctx.div_ceil(bs);
            let cache_len = rows * nb * bs * hkv * hd;
            let kc = gpu.alloc_kv_cache(cache_len, WeightDType::BF16)?;
            let vc = gpu.alloc_kv_cache(cache_len, WeightDType::BF16)?;
            let tables: Vec<u32> = (0..(rows * nb) as u32).collect();
            let slots: Vec<u32> = (0..rows).map(|s| (s * nb * bs + ctx - 1) as u32).collect();
            let (pos, slots_b) = (gpu.upload_u32(&vec![(ctx - 1) as u32; rows])?, gpu.upload_u32(&slots)?);
            let qkv = gpu.upload_f32(&rand_vec(rows * qkv_w))?;
            let q = gpu.alloc_f32(rows * hq * hd)?;
            if ctx == 256 {
                time(&gpu, "rope_write_kv (bf16 cache)", rows, &|_| {
                    Ok(gpu.run(Op::RopeWriteKv {
                        qkv: &qkv,
                        positions: &pos,
                        inv_freq: &inv,
                        q_out: &q,
                        k_cache: &kc,
                        v_cache: &vc,
                        slot_mapping: &slots_b,
                        num_tokens: rows,
                        num_heads: hq,
                        num_kv_heads: hkv,
                        head_dim: hd,
                        block_size: bs,
                    })?)
                })?;
            }
            let (qs, ctxs) = ((0..=rows as u32).collect::<Vec<_>>(), vec![ctx as u32; rows]);
            let (qs_b, ctx_b, tab_b) = (gpu.upload_u32(&qs)?, gpu.upload_u32(&ctxs)?, gpu.upload_u32(&tables)?);
            let meta = AttentionMeta {
                num_seqs: rows,
                query_start: &qs_b,
                context_lens: &ctx_b,
                block_tables: &tab_b,
                max_blocks_per_seq: nb,
                host_query_start: &qs,
                host_context_lens: &ctxs,
                host_block_tables: &tables,
            };
            for (label, out) in [
                ("f32 out", gpu.alloc_f32(rows * hq * hd)?),
                ("matmul-input out", gpu.alloc_matmul_input(rows * hq * hd, &w_o[0])?),
            ] {
                let r = time(&gpu, &format!("paged_attention ctx {ctx} ({label})"), rows, &|_| {
                    Ok(gpu.run(Op::PagedAttention {
                        q: &q,
                        k_cache: &kc,
                        v_cache: &vc,
                        out: &out,
                        meta: &meta,
                        num_heads: hq,
                        num_kv_heads: hkv,
                        head_dim: hd,
                        block_size: bs,
                        scale: 1.0 / (hd as f32).sqrt(),
                    })?)
                });
                if let Err(e) = r {
                    println!("op | {rows} | paged_attention ctx {ctx} ({label}) | n/a ({e})");
                }
            }
        }
        let attn = gpu.upload_f32(&rand_vec(rows * hq * hd))?;
        let attn16 = gpu.alloc_matmul_input(rows * hq * hd, &w_o[0])?;
        let o_out = gpu.alloc_f32(rows * h)?;
        time(&gpu, "matmul o (f32 in: conversion + gemm)", rows, &|i| {
            Ok(gpu.run(Op::MatMul {
                x: &attn,
                w: &w_o[i % w_o.len()],
                bias: None,
                out: &o_out,
                m: rows,
                k: hq * hd,
                n: h,
            })?)
        })?;
        time(&gpu, "matmul o (bf16 in)", rows, &|i| {
            Ok(gpu.run(Op::MatMul {
                x: &attn16,
                w: &w_o[i % w_o.len()],
                bias: None,
                out: &o_out,
                m: rows,
                k: hq * hd,
                n: h,
            })?)
        })?;
        let normed2 = gpu.alloc_matmul_input(rows * h, &w_gu[0])?;
        let gu = gpu.upload_f32(&rand_vec(rows * 2 * inter))?;
        time(&gpu, "matmul gate/up (bf16 in)", rows, &|i| {
            Ok(gpu.run(Op::MatMul {
                x: &normed2,
                w: &w_gu[i % w_gu.len()],
                bias: None,
                out: &gu,
                m: rows,
                k: h,
                n: 2 * inter,
            })?)
        })?;
        let act = gpu.alloc_matmul_input(rows * inter, &w_down[0])?;
        time(&gpu, "silu_mul -> bf16", rows, &|_| {
            Ok(gpu.run(Op::SiluMul { gate_up: &gu, out: &act, rows, width: inter })?)
        })?;
        let down = gpu.alloc_f32(rows * h)?;
        time(&gpu, "matmul down (bf16 in)", rows, &|i| {
            Ok(gpu.run(Op::MatMul {
                x: &act,
                w: &w_down[i % w_down.len()],
                bias: None,
                out: &down,
                m: rows,
                k: inter,
                n: h,
            })?)
        })?;

        // Whole steps: every layer in sequence, with op classes left out.
        let ctx = 256usize;
        let nb = ctx.div_ceil(bs);
        let cache_len = rows * nb * bs * hkv * hd;
        let caches = (0..p.num_layers)
            .map(|_| {
                Ok((
                    gpu.alloc_kv_cache(cache_len, WeightDType::BF16)?,
                    gpu.alloc_kv_cache(cache_len, WeightDType::BF16)?,
                ))
            })
            .collect::<R<Vec<_>>>()?;
        let tables: Vec<u32> = (0..(rows * nb) as u32).collect();
        let slots: Vec<u32> = (0..rows).map(|s| (s * nb * bs + ctx - 1) as u32).collect();
        let (pos, slots_b) = (gpu.upload_u32(&vec![(ctx - 1) as u32; rows])?, gpu.upload_u32(&slots)?);
        let (qs, ctxs) = ((0..=rows as u32).collect::<Vec<_>>(), vec![ctx as u32; rows]);
        let (qs_b, ctx_b, tab_b) = (gpu.upload_u32(&qs)?, gpu.upload_u32(&ctxs)?, gpu.upload_u32(&tables)?);
        let meta = AttentionMeta {
            num_seqs: rows,
            query_start: &qs_b,
            context_lens: &ctx_b,
            block_tables: &tab_b,
            max_blocks_per_seq: nb,
            host_query_start: &qs,
            host_context_lens: &ctxs,
            host_block_tables: &tables,
        };
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
                    gpu.run(Op::AddRmsNorm {
                        x: &down,
                        residual: &res,
                        weight: &norm_w,
                        out: &normed,
                        rows,
                        hidden: h,
                        eps: 1e-5,
                    })?;
                }
                if matmuls {
                    gpu.run(Op::MatMul { x: &normed, w: wq, bias: None, out: &qkv_out, m: rows, k: h, n: qkv_w })?;
                }
                let (kc, vc) = &caches[li];
                if attention {
                    gpu.run(Op::RopeWriteKv {
                        qkv: &qkv,
                        positions: &pos,
                        inv_freq: &inv,
                        q_out: &q,
                        k_cache: kc,
                        v_cache: vc,
                        slot_mapping: &slots_b,
                        num_tokens: rows,
                        num_heads: hq,
                        num_kv_heads: hkv,
                        head_dim: hd,
                        block_size: bs,
                    })?;
                    gpu.run(Op::PagedAttention {
                        q: &q,
                        k_cache: kc,
                        v_cache: vc,
                        out: &attn16,
                        meta: &meta,
                        num_heads: hq,
                        num_kv_heads: hkv,
                        head_dim: hd,
                        block_size: bs,
                        scale: 1.0 / (hd as f32).sqrt(),
                    })?;
                }
                if matmuls {
                    gpu.run(Op::MatMul { x: &attn16, w: wo, bias: None, out: &o_out, m: rows, k: hq * hd, n: h })?;
                }
                if norms {
                    gpu.run(Op::AddRmsNorm {
                        x: &o_out,
                        residual: &res,
                        weight: &norm_w,
                        out: &normed2,
                        rows,
                        hidden: h,
                        eps: 1e-5,
                    })?;
                }
                if matmuls {
                    gpu.run(Op::MatMul { x: &normed2, w: wg, bias: None, out: &gu, m: rows, k: h, n: 2 * inter })?;
                }
                if norms || attention {
                    gpu.run(Op::SiluMul { gate_up: &gu, out: &act, rows, width: inter })?;
                }
                if matmuls {
                    gpu.run(Op::MatMul { x: &act, w: wd, bias: None, out: &down, m: rows, k: inter, n: h })?;
                }
                Ok(())
            };
            (0..p.num_layers).try_for_each(&layer)?;
            gpu.synchronize()?;
            gpu.begin_capture()?;
            let captured = (0..p.num_layers).try_for_each(&layer);
            let graph = gpu.end_capture()?;
            captured?;
            for _ in 0..3 {
                gpu.replay(&graph)?;
            }
            gpu.synchronize()?;
            let t0 = gpu.record_event()?;
            for _ in 0..20 {
                gpu.replay(&graph)?;
            }
            let t1 = gpu.record_event()?;
            gpu.synchronize()?;
            println!("step | {rows} | {} layers {label} | {:.3} ms", p.num_layers, t0.elapsed_ms(&t1)? as f64 / 20.0);
        }
    }
    Ok(())
}
