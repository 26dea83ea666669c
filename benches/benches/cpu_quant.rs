//! Criterion benchmarks of the CPU backend's packed GGUF matmul (`backend::cpu::quant`, the fastest kernel this CPU
//! has) per format (`Q8_0`, `Q4_0`, `Q4_1`, `Q5_0`, `Q5_1`, `Q4_K`, `Q5_K`, `Q6_K`) at m = 1, 16 and 128 rows,
//! against the f32 path the engine uses for dequantized weights (`Op::MatMul` on an f32 matrix), on two weight shapes:
//! - `smollm2_gate_up`: SmolLM2-135M's fused gate/up projection, 3072 x 576 (cache-resident: a few MB at most; its
//!   576-value rows are not whole 256-value super-blocks, so no k-quants here);
//! - `llama8b_gate_up`: Llama-3.1-8B's gate projection, 14336 x 4096 (larger than the 32 MiB L3 in every format).
//!
//! `quant::matmul` is what the engine calls: on a CPU with 512-bit VNNI the interleaved integer kernel at every row
//! count for every format but `Q6_K`; otherwise integer kernels up to `quant::INTEGER_ROWS` rows and dequantized
//! tiles through the f32 GEMM above (so m = 128 times the tiles there).
//!
//! `Q8_0x2` is `Q8_0` with its activations in two terms (`PackedMatrix::with_two_term_activations`, what the GGUF
//! loader sets for an all-`Q8_0` file).
//!
//! Throughput is weight bytes streamed per call (criterion's GB/s); GFLOP/s is `2 m n k / time`. `stream_copy` is the
//! line to compare with: a 256 MiB copy, counted as bytes read plus bytes written.

use std::time::Duration;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rserve_engine::backend::cpu::quant::{self, Format, PackedMatrix};
use rserve_engine::backend::cpu::CpuBackend;
use rserve_engine::backend::{Backend, Op};

const SHAPES: [(&str, usize, usize); 2] = [("smollm2_gate_up", 3072, 576), ("llama8b_gate_up", 14336, 4096)];
const ROWS: [usize; 3] = [1, 16, 128];

fn bench_packed(c: &mut Criterion) {
    let mut rng = StdRng::seed_from_u64(27);
    let mut g = c.benchmark_group("cpu_quant");
    g.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    let be = CpuBackend::with_packed_weights(false);
    for (shape, n, k) in SHAPES {
        let w: Vec<f32> = (0..n * k).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        let wt = Tensor::from_vec(w, (n, k), &Device::Cpu).expect("tensor");
        let xs: Vec<f32> = (0..128 * k).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
        let dtypes = [
            GgmlDType::Q8_0,
            GgmlDType::Q4_0,
            GgmlDType::Q4_1,
            GgmlDType::Q5_0,
            GgmlDType::Q5_1,
            GgmlDType::Q4K,
            GgmlDType::Q5K,
            GgmlDType::Q6K,
        ];
        for dtype in dtypes {
            let format = Format::from_ggml(dtype).expect("packed format");
            if !k.is_multiple_of(format.block_len()) {
                continue;
            }
            let q = QTensor::quantize(&wt, dtype).expect("quantize");
            let p = PackedMatrix::new(format, n, k, q.data().expect("bytes").into_owned()).expect("packed");
            g.throughput(Throughput::Bytes(p.byte_len() as u64));
            // Q8_0 also as an all-Q8_0 file loads it: activations in two terms.
            let two_terms = if format == Format::Q8_0 { &[false, true][..] } else { &[false] };
            for &two in two_terms {
                let p = p.clone().with_two_term_activations(two);
                let name = format!("{shape}/{}{}", format.as_str(), if two { "x2" } else { "" });
                for m in ROWS {
                    let mut out = vec![0f32; m * n];
                    g.bench_function(BenchmarkId::new(&name, m), |b| {
                        b.iter(|| quant::matmul(&xs[..m * k], &p, None, &mut out, m, k, n).expect("matmul"))
                    });
                }
            }
        }
        let wbuf = be.upload_weight(&wt).expect("upload");
        g.throughput(Throughput::Bytes((n * k * 4) as u64));
        for m in ROWS {
            let x = be.upload_f32(&xs[..m * k]).expect("x");
            let out = be.alloc_f32(m * n).expect("out");
            g.bench_function(BenchmarkId::new(format!("{shape}/f32"), m), |b| {
                b.iter(|| be.run(Op::MatMul { x: &x, w: &wbuf, bias: None, out: &out, m, k, n }).expect("matmul"))
            });
        }
    }
    let len = 64 << 20;
    let src = vec![1f32; len];
    let mut dst = vec![0f32; len];
    g.throughput(Throughput::Bytes((2 * 4 * len) as u64));
    g.bench_function("stream_copy", |b| b.iter(|| dst.copy_from_slice(&src)));
    g.finish();
}

criterion_group!(benches, bench_packed);
criterion_main!(benches);
