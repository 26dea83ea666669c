//! Host-side tests of the CUDA backend that need no GPU (they run in CI): the NVRTC source of every portable kernel
//! module, the PTX cache key, the mapping of OpenCL ND-ranges to CUDA grids, the cuBLAS shape mapping, that a host
//! without a CUDA driver gets an error value (not a panic), and the dummy weights of `--load-format dummy`.

use rserve_engine::backend::cuda::host;

#[test]
fn every_portable_module_assembles_for_nvrtc_without_includes() {
    for (name, entries) in rserve_kernels::KERNELS {
        // OpenCL-only modules (Intel's sub-group matrix built-ins) are never handed to NVRTC.
        if rserve_kernels::target(name) != rserve_kernels::Target::Portable {
            continue;
        }
        let m = rserve_kernels::module(name).expect("module embedded");
        let src = host::assemble_source(name, m.source);
        assert!(!src.lines().any(|l| l.trim_start().starts_with("#include")), "{name}: an #include is left for NVRTC");
        assert!(src.contains("__CUDACC_RTC__"), "{name}: the prelude (with its CUDA side) must come first");
        assert!(src.find("RSERVE_PRELUDE_H").unwrap() < src.find(&format!("#line 1 \"{name}\"")).unwrap());
        for e in *entries {
            assert!(src.contains(e), "{name}: entry point {e} missing from the assembled source");
        }
        // Line numbers of the module are kept: the module's text follows its #line marker line for line.
        let body = src.split(&format!("#line 1 \"{name}\"\n")).nth(1).unwrap();
        assert_eq!(body.lines().count(), m.source.lines().count(), "{name}: line count changed");
    }
    let glue = host::assemble_source(host::GLUE_MODULE, host::GLUE_SOURCE);
    for e in host::GLUE_KERNELS {
        assert!(glue.contains(&format!("void {e}(")), "glue kernel {e}");
    }
}

#[test]
fn nvrtc_options_carry_every_launch_constant_and_the_arch() {
    let o = host::nvrtc_options((9, 0));
    for (k, v) in rserve_kernels::launch::DEFINES {
        assert!(o.contains(&format!("-D{k}={v}")), "missing -D{k}");
    }
    assert!(o.contains(&"--gpu-architecture=compute_90".to_string()));
    assert!(host::nvrtc_options((8, 6)).contains(&"--gpu-architecture=compute_86".to_string()));
}

#[test]
fn ptx_cache_key_changes_with_source_options_and_gpu() {
    let o = host::nvrtc_options((9, 0));
    let a = host::ptx_cache_file("norm", "src", &o, (9, 0));
    assert_eq!(a, host::ptx_cache_file("norm", "src", &o, (9, 0)), "the key is deterministic");
    assert!(a.starts_with("norm-") && a.ends_with("-sm90.ptx"));
    assert_ne!(a, host::ptx_cache_file("norm", "src ", &o, (9, 0)), "source edits invalidate");
    assert_ne!(a, host::ptx_cache_file("norm", "src", &host::nvrtc_options((8, 0)), (9, 0)), "options invalidate");
    assert_ne!(a, host::ptx_cache_file("norm", "src", &o, (8, 9)), "another GPU gets its own PTX");
    // Parts are separated: moving a byte from one part to the next changes the hash.
    assert_ne!(host::fnv1a64(&[b"ab", b"c"]), host::fnv1a64(&[b"a", b"bc"]));
    // FNV-1a's published offset basis / prime: one byte 'a' then the part separator.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in [b'a', 0xff] {
        h ^= b as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    assert_eq!(host::fnv1a64(&[b"a"]), h);
}

#[test]
fn ptx_cache_dir_follows_rserve_cache_dir() {
    // Only this test touches the variable in this test binary.
    std::env::set_var("RSERVE_CACHE_DIR", "/tmp/rserve-test-cache");
    assert_eq!(host::ptx_cache_dir(), std::path::PathBuf::from("/tmp/rserve-test-cache/ptx"));
    std::env::remove_var("RSERVE_CACHE_DIR");
}

#[test]
fn nd_ranges_map_to_cuda_grids() {
    use rserve_kernels::launch::*;
    // Decode attention: (entries x ATTN_WG, kv heads x chunks, partitions) work-items, ATTN_WG per group.
    let (g, b) = host::grid_dims([5 * ATTN_WG, 8, 3], [ATTN_WG, 1, 1]).unwrap();
    assert_eq!(g, (5, 8, 3));
    assert_eq!(b, (ATTN_WG as u32, 1, 1));
    // Elementwise 2-D: rows in y.
    let (g, _) = host::grid_dims([128 * ELEM_WG, 7, 1], [ELEM_WG, 1, 1]).unwrap();
    assert_eq!(g, (128, 7, 1));
    assert!(host::grid_dims([100, 1, 1], [64, 1, 1]).is_err(), "global must be a multiple of local");
    assert!(host::grid_dims([64, 70_000, 1], [64, 1, 1]).is_err(), "y is limited to 65535 groups");
    assert!(host::grid_dims([2048, 1, 1], [2048, 1, 1]).is_err(), "blocks are limited to 1024 threads");
    assert!(host::grid_dims([64, 1, 1], [0, 1, 1]).is_err());
}

#[test]
fn gemm_shape_is_the_column_major_transpose() {
    // out[m, n] = x[m, k] . w[n, k]^T  ->  C(n x m) = op_T(w) (n x k) . x (k x m).
    assert_eq!(host::gemm_shape(3, 4096, 14336).unwrap(), (14336, 3, 4096, 4096, 4096, 14336));
    assert!(host::gemm_shape(1, 1 << 31, 4).is_err());
}

#[test]
fn no_cuda_driver_is_an_error_value_not_a_panic() {
    // On a host without an NVIDIA driver this must be Err; on a GPU host it may succeed.
    let r = std::panic::catch_unwind(|| rserve_engine::backend::cuda::CudaBackend::new(0).map(|_| ()));
    assert!(r.is_ok(), "CudaBackend::new panicked");
    if std::path::Path::new("/usr/lib/x86_64-linux-gnu/libcuda.so.1").exists() {
        return;
    }
    let msg = r.unwrap().expect_err("no driver here, so no device").to_string();
    assert!(msg.contains("cuda"), "{msg}");
}
