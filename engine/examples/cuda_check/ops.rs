//! One op case (`OpSpec`) run the same way on the CPU reference backend and on CUDA, and compared: the matmul,
//! norm -> matmul, SiLU -> matmul and attention sequences the kernel checks are built from, and the KV caches of a
//! given element type on each backend.

use rserve_engine::backend::cpu::CpuBackend;
use rserve_engine::backend::cuda::CudaBackend;
use rserve_engine::backend::{Activation, AttentionMeta, AttnShape, Backend, Op, RopeIo};

use crate::common::R;

/// A named check: its name, its relative tolerance and the op case.
pub type Check = (String, f32, OpSpec);

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
pub fn both<F>(cpu: &CpuBackend, gpu: &CudaBackend, name: &str, tol: f32, fails: &mut usize, f: F) -> R<()>
where
    F: Fn(&dyn DynBackend) -> R<Vec<f32>>,
{
    let want = f(&Cpu(cpu))?;
    let got = f(&Gpu(gpu))?;
    compare(name, &got, &want, tol, fails);
    Ok(())
}

/// The op checks are written once over this small object-safe wrapper of the two backends.
pub trait DynBackend {
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

/// One op case: its host inputs and shape.
pub enum OpSpec {
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
pub struct AttnSpec {
    pub qkv: Vec<f32>,
    pub pos: Vec<u32>,
    pub qs: Vec<u32>,
    pub ctx: Vec<u32>,
    pub tables: Vec<u32>,
    pub max_blocks: usize,
    pub slots: Vec<u32>,
    pub heads: usize,
    pub kvh: usize,
    pub hd: usize,
    pub bs: usize,
    pub cache_k: Vec<f32>,
    pub cache_v: Vec<f32>,
    /// The cache's element type: the GPU keeps it so; the CPU reference holds the same values rounded to it, in f32.
    pub kv: rserve_engine::backend::WeightDType,
    /// Then the output projection (weight `[n, heads * hd]` of a 16-bit type, n): the attention writes into its
    /// matmul input (`alloc_matmul_input`: 16-bit on CUDA), and the check compares the projection's output.
    pub o_proj: Option<(Vec<f32>, candle_core::DType, usize)>,
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
