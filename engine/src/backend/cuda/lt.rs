//! cuBLASLt with measured algorithm choice, for the CUDA backend's 16-bit matmuls at decode-bucket row counts.
//!
//! `cublasGemmEx` takes the heuristic's first algorithm, which on an H200 streams the 8B model's weights at 1-2 TB/s
//! for 16-256 rows (BENCHMARKS.md): tile shapes that leave most multiprocessors idle for n = 4096. For each shape
//! (m, n, k, type) that a decode step repeats thousands of times, the first call (always eager: the graph runner
//! runs a bucket's first step op by op before it captures it) asks cuBLASLt for its candidate algorithms, times
//! each on the real buffers with CUDA events, times `cublasGemmEx` the same way, and keeps the fastest. Later calls
//! (and graph captures) reuse the choice. Row counts outside `tuned_rows` (prefill chunks of any length) keep
//! `cublasGemmEx`.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;

use cudarc::cublaslt::sys as lt;

use crate::backend::cpu::be;
use crate::error::Result;

/// Candidate algorithms asked of the heuristic per shape.
const CANDIDATES: usize = 8;
/// Timed calls per candidate (after one warm-up call).
const REPS: usize = 5;

/// Row counts whose shapes are tuned: the graph runner's decode buckets (`crate::graph_runner::buckets`), so the
/// mixed prefill steps of a server, whose row counts vary, pause for no tuning.
pub(super) fn tuned_rows(m: usize) -> bool {
    matches!(m, 1 | 2 | 4 | 8 | 16 | 24 | 32 | 48 | 64 | 96 | 128) || (m > 128 && m <= 512 && m % 32 == 0)
}

/// Shape of one tuned matmul: rows of x, output columns, depth, and whether the 16-bit type is f16 (else bf16).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(super) struct Key {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub f16: bool,
}

/// A chosen cuBLASLt plan: descriptors and algorithm, kept for the process.
struct Plan {
    desc: lt::cublasLtMatmulDesc_t,
    a: lt::cublasLtMatrixLayout_t,
    b: lt::cublasLtMatrixLayout_t,
    d: lt::cublasLtMatrixLayout_t,
    algo: lt::cublasLtMatmulAlgo_t,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: the descriptors were created by this plan and are destroyed once.
        unsafe {
            lt::cublasLtMatmulDescDestroy(self.desc);
            lt::cublasLtMatrixLayoutDestroy(self.a);
            lt::cublasLtMatrixLayoutDestroy(self.b);
            lt::cublasLtMatrixLayoutDestroy(self.d);
        }
    }
}

/// What a shape runs on: a cuBLASLt plan, or `cublasGemmEx` (which won, or no candidate ran).
enum Choice {
    Lt(Plan),
    GemmEx,
}

/// One shape's measured times, for the log and `report`.
#[derive(Clone, Debug)]
pub struct Tuning {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub gemm_ex_us: f64,
    pub best_lt_us: Option<f64>,
    pub candidates: usize,
}

/// The cuBLASLt handle and the choices made so far.
pub(super) struct Lt {
    handle: lt::cublasLtHandle_t,
    choices: RefCell<HashMap<Key, Choice>>,
    tunings: RefCell<Vec<Tuning>>,
}

/// The buffers of one call (device pointers) and the stream.
pub(super) struct Call {
    pub w: u64,
    pub x: u64,
    pub out: u64,
    pub workspace: u64,
    pub workspace_bytes: usize,
    pub stream: lt::cudaStream_t,
}

fn check(s: lt::cublasStatus_t, what: &str) -> Result<()> {
    if s == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(be(format!("cuda: cuBLASLt {what}: {s:?}")))
    }
}

impl Lt {
    /// Opens cuBLASLt (loaded at run time, like cuBLAS).
    pub(super) fn new() -> Result<Self> {
        let mut handle = std::ptr::null_mut();
        // SAFETY: a plain handle creation into a local.
        check(unsafe { lt::cublasLtCreate(&mut handle) }, "create")?;
        Ok(Self { handle, choices: RefCell::new(HashMap::new()), tunings: RefCell::new(Vec::new()) })
    }

    /// The tunings made so far.
    pub(super) fn tunings(&self) -> Vec<Tuning> {
        self.tunings.borrow().clone()
    }

    /// The descriptors of `key` (its algorithm is chosen later).
    fn plan(&self, key: Key) -> Result<Plan> {
        let t = if key.f16 { lt::cudaDataType::CUDA_R_16F } else { lt::cudaDataType::CUDA_R_16BF };
        let (m, n, k) = (key.m as u64, key.n as u64, key.k as u64);
        let mut desc = std::ptr::null_mut();
        let (mut a, mut b, mut d) = (std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: descriptor creation into locals; attribute buffers are locals of the stated sizes.
        unsafe {
            check(
                lt::cublasLtMatmulDescCreate(&mut desc, lt::cublasComputeType_t::CUBLAS_COMPUTE_32F, lt::cudaDataType::CUDA_R_32F),
                "matmul descriptor",
            )?;
            // Column-major view: out^T [n, m] = w [k, n]^T . x^T [k, m]. cuBLAS' CUBLAS_OP_T is 1.
            let trans: i32 = 1;
            check(
                lt::cublasLtMatmulDescSetAttribute(
                    desc,
                    lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                    &trans as *const _ as *const c_void,
                    std::mem::size_of_val(&trans),
                ),
                "transpose attribute",
            )?;
            check(lt::cublasLtMatrixLayoutCreate(&mut a, t, k, n, k as i64), "layout of w")?;
            check(lt::cublasLtMatrixLayoutCreate(&mut b, t, k, m, k as i64), "layout of x")?;
            check(lt::cublasLtMatrixLayoutCreate(&mut d, lt::cudaDataType::CUDA_R_32F, n, m, n as i64), "layout of out")?;
        }
        // SAFETY: an all-zero algorithm is a plain value; it is replaced before the plan is launched.
        Ok(Plan { desc, a, b, d, algo: unsafe { std::mem::zeroed() } })
    }

    /// Candidate algorithms for `plan` that fit `workspace_bytes`.
    fn candidates(&self, plan: &Plan, workspace_bytes: usize) -> Result<Vec<lt::cublasLtMatmulHeuristicResult_t>> {
        let mut pref = std::ptr::null_mut();
        // SAFETY: preference creation into a local, destroyed below; results are written into a local array of
        // CANDIDATES entries, of which `found` are valid.
        unsafe {
            check(lt::cublasLtMatmulPreferenceCreate(&mut pref), "preference")?;
            let ws = workspace_bytes as u64;
            let r = lt::cublasLtMatmulPreferenceSetAttribute(
                pref,
                lt::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &ws as *const u64 as *const c_void,
                std::mem::size_of::<u64>(),
            );
            let mut results: [lt::cublasLtMatmulHeuristicResult_t; CANDIDATES] = std::mem::zeroed();
            let mut found = 0i32;
            let r2 = if r == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                lt::cublasLtMatmulAlgoGetHeuristic(
                    self.handle,
                    plan.desc,
                    plan.a,
                    plan.b,
                    plan.d,
                    plan.d,
                    pref,
                    CANDIDATES as i32,
                    results.as_mut_ptr(),
                    &mut found,
                )
            } else {
                r
            };
            lt::cublasLtMatmulPreferenceDestroy(pref);
            check(r2, "heuristic")?;
            Ok(results[..found.max(0) as usize]
                .iter()
                .filter(|h| h.state == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS && h.workspaceSize <= workspace_bytes)
                .copied()
                .collect())
        }
    }

    /// Runs one cuBLASLt matmul of `plan` with `algo`.
    fn launch(&self, plan: &Plan, algo: &lt::cublasLtMatmulAlgo_t, call: &Call) -> Result<()> {
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the caller checked the buffers against the shape the plan was built for; alpha/beta are host
        // scalars; the workspace is the backend's, ordered on the same stream.
        check(
            unsafe {
                lt::cublasLtMatmul(
                    self.handle,
                    plan.desc,
                    &alpha as *const f32 as *const c_void,
                    call.w as *const c_void,
                    plan.a,
                    call.x as *const c_void,
                    plan.b,
                    &beta as *const f32 as *const c_void,
                    call.out as *const c_void,
                    plan.d,
                    call.out as *mut c_void,
                    plan.d,
                    algo,
                    call.workspace as *mut c_void,
                    call.workspace_bytes,
                    call.stream,
                )
            },
            "matmul",
        )
    }

    /// Runs the matmul of `key` with the chosen algorithm. `gemm_ex` runs it through `cublasGemmEx`; `time` times
    /// a closure on the stream in microseconds per call. On the first call of a shape (never while capturing:
    /// `capturing` makes an untuned shape take `gemm_ex`) the candidates and `gemm_ex` are timed and the fastest
    /// kept; every path leaves the product in `out`.
    pub(super) fn matmul(
        &self,
        key: Key,
        call: &Call,
        capturing: bool,
        gemm_ex: &dyn Fn() -> Result<()>,
        time: &dyn Fn(&dyn Fn() -> Result<()>, usize) -> Result<f64>,
    ) -> Result<()> {
        if let Some(choice) = self.choices.borrow().get(&key) {
            return match choice {
                Choice::Lt(p) => self.launch(p, &p.algo, call),
                Choice::GemmEx => gemm_ex(),
            };
        }
        if capturing {
            return gemm_ex();
        }
        let mut plan = self.plan(key)?;
        let cands = self.candidates(&plan, call.workspace_bytes).unwrap_or_default();
        let gemm_ex_us = time(gemm_ex, REPS)?;
        let mut best: Option<(f64, lt::cublasLtMatmulHeuristicResult_t)> = None;
        for c in &cands {
            let run = || self.launch(&plan, &c.algo, call);
            // A candidate that fails to launch is skipped, not an error.
            if run().is_err() {
                continue;
            }
            let us = time(&run, REPS)?;
            if best.as_ref().is_none_or(|(b, _)| us < *b) {
                best = Some((us, *c));
            }
        }
        self.tunings.borrow_mut().push(Tuning {
            m: key.m,
            n: key.n,
            k: key.k,
            gemm_ex_us,
            best_lt_us: best.as_ref().map(|(us, _)| *us),
            candidates: cands.len(),
        });
        tracing::debug!(
            "cuda: matmul {}x{}x{}: cublasGemmEx {:.1} us, best of {} cuBLASLt algorithms {}",
            key.m,
            key.k,
            key.n,
            gemm_ex_us,
            cands.len(),
            best.as_ref().map_or("none ran".to_string(), |(us, _)| format!("{us:.1} us"))
        );
        let choice = match best {
            Some((us, h)) if us < gemm_ex_us * 0.97 => {
                plan.algo = h.algo;
                Choice::Lt(plan)
            }
            _ => Choice::GemmEx,
        };
        // The chosen path runs last, so `out` holds its product.
        let r = match &choice {
            Choice::Lt(p) => self.launch(p, &p.algo, call),
            Choice::GemmEx => gemm_ex(),
        };
        self.choices.borrow_mut().insert(key, choice);
        r
    }
}

impl Drop for Lt {
    fn drop(&mut self) {
        self.choices.borrow_mut().clear();
        // SAFETY: the handle was created in `new` and is destroyed once, after every plan.
        unsafe { lt::cublasLtDestroy(self.handle) };
    }
}

#[cfg(test)]
mod tests {
    use super::tuned_rows;

    #[test]
    fn every_decode_bucket_is_tuned_and_prefill_row_counts_are_not() {
        for b in crate::graph_runner::buckets(512) {
            assert!(tuned_rows(b), "bucket {b}");
        }
        for m in [3, 5, 100, 136, 513, 1000, 2048] {
            assert!(!tuned_rows(m), "{m} rows");
        }
    }
}
