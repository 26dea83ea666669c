//! The XMX matmul (`kernels/src/cl/xmx.cl`, bf16 weights on Intel's matrix engine) against the CPU reference.
//!
//! On OpenCL (Intel's CPU runtime, no matrix engine) the kernel runs in its emulated form (`matmul_xmx_bf16_emu`:
//! the same source with the sub-group matrix built-in written in shuffles), so its tiling, operand layouts and
//! masking are checked at m = 1, 16, 64 and 512 rows, with widths that are not multiples of its tiles, with and
//! without a bias; x is rounded to bf16 on the way in, within the 16-bit tolerance. On Level Zero's null driver
//! with the PVC binaries (`RSERVE_ZE_MODULE_FORMAT=native`) the backend builds the `xmx` module and launches the
//! hardware kernel for these shapes under the validation layer (nothing computes there).

mod backends;
mod level_zero_support;

use candle_core::{DType, Device, Tensor};
use rand::rngs::StdRng;
use rserve_engine::backend::kernels::MatmulPath;
use rserve_engine::backend::level_zero::{handle_counts, module_builds};
use rserve_engine::backend::{Backend, Op};

use backends::{poisoned, random};
use level_zero_support as lz;

const HALF_TOL: f32 = 1e-2;
const XMX_EMU: MatmulPath = MatmulPath::XmxEmulated;

/// (m, k, n, bias): the row counts; n below one sub-group's 32 columns, ragged against a work-group's 128,
/// and a multiple of both.
const SHAPES: &[(usize, usize, usize, bool)] =
    &[(1, 576, 190, true), (16, 256, 1000, false), (64, 1024, 37, true), (512, 256, 128, false)];

fn bf16_matmul<B: Backend>(b: &B, rng: &mut StdRng) -> Vec<backends::Output> {
    let mut outs = Vec::new();
    for &(m, k, n, bias) in SHAPES {
        let x = b.upload_f32(&random(rng, m * k, 1.0)).unwrap();
        let w = Tensor::from_vec(random(rng, n * k, 0.5), (n, k), &Device::Cpu).unwrap().to_dtype(DType::BF16).unwrap();
        let w = b.upload_weight(&w).unwrap();
        let bias = bias.then(|| b.upload_f32(&random(rng, n, 1.0)).unwrap());
        let out = poisoned(b, m * n);
        b.run(Op::MatMul { x: &x, w: &w, bias: bias.as_ref(), out: &out, m, k, n }).unwrap();
        outs.push(("out", b.download_f32(&out).unwrap(), n));
    }
    outs
}

op_parity!(matmul_bf16_xmx_emulated, tol = HALF_TOL, matmul = XMX_EMU, |b, rng| { bf16_matmul(b, &mut rng) });

#[test]
fn xmx_kernel_on_the_null_driver_with_the_pvc_binaries() {
    if lz::in_child() {
        let lz = rserve_engine::backend::level_zero::open("level-zero").expect("the null driver's device");
        bf16_matmul(&lz, &mut backends::rng(backends::fresh_seed()));
        drop(lz);
        let b = module_builds();
        println!("LZ-MODULES: native {} spirv {}", b.native, b.spirv);
        println!("LZ-COUNTS: {}", handle_counts());
        return;
    }
    let mut env = lz::null_driver_env();
    env.push(("RSERVE_ZE_MODULE_FORMAT".into(), "native".into()));
    let out = lz::run_child("xmx_kernel_on_the_null_driver_with_the_pvc_binaries", &env);
    let text = lz::text(&out);
    assert!(out.status.success(), "the child failed:\n{text}");
    assert!(!text.contains("ZE_RESULT_ERROR"), "a Level Zero call failed:\n{text}");
    // Every module, the matrix engine's included, from its PVC binary.
    let all = rserve_kernels::KERNELS.len();
    assert_eq!(lz::reported(&text, "LZ-MODULES"), Some(format!("native {all} spirv 0").as_str()), "{text}");
    let counts = lz::reported(&text, "LZ-COUNTS").unwrap_or_else(|| panic!("{text}"));
    assert!(counts.ends_with("failed_calls 0"), "{counts}");
}
