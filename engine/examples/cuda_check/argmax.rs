//! `argmax_rows` on the device against the host sampler's rule (the first index of the maximum), with planted ties.

use rand::rngs::StdRng;
use rand::Rng;
use rserve_engine::backend::cuda::CudaBackend;
use rserve_engine::backend::Backend;

use crate::common::{rand_vec, R};

/// Prints one `kernel-check argmax_rows` line per shape; returns the number of failures.
pub fn check(gpu: &CudaBackend, r: &mut StdRng) -> R<usize> {
    let mut fails = 0;
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
    Ok(fails)
}
