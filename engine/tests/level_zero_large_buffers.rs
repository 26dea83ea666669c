//! Level Zero buffers over the device's largest allocation (`maxMemAllocSize`; a PVC tile reports about 4 GiB), on
//! the loader's null driver with the validation layer and parameter validation on: the allocation goes through
//! `zeMemAllocDevice` with `ze_relaxed_allocation_limits_exp_desc_t` chained to its descriptor (the relaxed counter
//! goes up, ordinary sizes keep the plain call), no call fails, and every handle is destroyed at the end; where the
//! driver lacks the extension the same size is refused with a typed error naming the size, the limit and the
//! extension.
//!
//! The null driver reports `maxMemAllocSize` 0 (unknown, so nothing is checked) and advertises only the tracing
//! extension, and it backs each allocation with a `malloc` that is never touched (its fills run nothing). So the
//! child opens the device twice more through `open_with_limits`: with a PVC tile's 4 GiB limit and without the
//! extension, then with the extension, and asks each for a 5 GiB KV cache.
//!
//! Each test body runs in a child process (the loader reads ZE_* variables once, at initialisation).

mod level_zero_support;

use level_zero_support as lz;
use rserve_engine::backend::level_zero::{
    handle_counts, loader_components, open, open_with_limits, relaxed_allocations, AllocLimits, HandleKind, LzError,
    RELAXED_ALLOCATION_LIMITS,
};
use rserve_engine::backend::{Backend, WeightDType};

const GIB: u64 = 1 << 30;
/// The limit a PVC tile reports, used where the driver reports none.
const PVC_TILE_MAX_ALLOC: u64 = 4 * GIB;

fn large_buffers_in_child() {
    let backend = open("level-zero").unwrap();
    let reported = backend.info().max_alloc;
    println!("LZ-DEVICE: {}", backend.info().name);
    println!("LZ-MAX-ALLOC: {reported}");
    println!("LZ-RELAXED-EXT: {}", backend.info().relaxed_alloc_limits);
    drop(backend);
    let max_alloc = if reported > 0 { reported } else { PVC_TILE_MAX_ALLOC };
    println!("LZ-LIMIT: {max_alloc}");
    // A bf16 KV cache 1 GiB over the limit (5 GiB on a PVC tile's limit).
    let elems = ((max_alloc + GIB) / 2) as usize;

    // Without the extension: refused before any call, with the size, the limit and the extension named.
    let relaxed_before = relaxed_allocations();
    let backend = open_with_limits("level-zero", AllocLimits { max_alloc, relaxed: false }).unwrap();
    let e = backend.alloc_kv_cache(elems, WeightDType::BF16).unwrap_err().to_string();
    println!("LZ-REFUSED: {e}");
    assert!(e.contains(&format!("{} bytes", elems * 2)) && e.contains(&max_alloc.to_string()), "{e}");
    assert!(e.contains(RELAXED_ALLOCATION_LIMITS), "{e}");
    assert_eq!(relaxed_allocations(), relaxed_before);
    drop(backend);

    // With it: the large buffer takes the relaxed descriptor, a small one the plain call.
    let backend = open_with_limits("level-zero", AllocLimits { max_alloc, relaxed: true }).unwrap();
    let small = backend.alloc_f32(1024).unwrap();
    assert_eq!(relaxed_allocations(), relaxed_before, "a 4 KiB buffer took relaxed limits");
    let memory_before = device_memory_created();
    let kv = backend.alloc_kv_cache(elems, WeightDType::BF16).unwrap();
    assert_eq!(device_memory_created(), memory_before + 1);
    println!("LZ-LARGE-BYTES: {}", elems * 2);
    drop(kv);
    // The block goes back to the pool and serves the next buffer of its class without a new allocation.
    let kv = backend.alloc_kv_cache(elems, WeightDType::BF16).unwrap();
    println!("LZ-RELAXED: {}", relaxed_allocations() - relaxed_before);
    drop((kv, small));
    drop(backend);
    println!("LZ-COMPONENTS: {}", loader_components().unwrap().join(", "));
    println!("LZ-COUNTS: {}", handle_counts());
}

fn device_memory_created() -> u64 {
    let counts = handle_counts();
    counts.kinds.iter().find(|(k, _, _)| *k == HandleKind::DeviceMemory).map(|(_, c, _)| *c).unwrap()
}

#[test]
fn buffers_over_the_largest_allocation_take_relaxed_limits() {
    if lz::in_child() {
        return large_buffers_in_child();
    }
    let out = lz::run_child("buffers_over_the_largest_allocation_take_relaxed_limits", &lz::null_driver_env());
    let text = lz::text(&out);
    assert!(out.status.success(), "the child failed:\n{text}");
    assert!(lz::reported(&text, "LZ-DEVICE").is_some_and(|d| d.contains("Null Device")), "{text}");
    let reported: u64 =
        lz::reported(&text, "LZ-MAX-ALLOC").and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{text}"));
    let limit: u64 = lz::reported(&text, "LZ-LIMIT").and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{text}"));
    assert!(reported == 0 || reported == limit, "{text}");
    let large: u64 =
        lz::reported(&text, "LZ-LARGE-BYTES").and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{text}"));
    assert!(large > limit && large > u32::MAX as u64, "{text}");
    // One relaxed allocation: the second buffer of that size reused the pool's block.
    assert_eq!(lz::reported(&text, "LZ-RELAXED"), Some("1"), "{text}");
    assert!(lz::reported(&text, "LZ-REFUSED").is_some_and(|e| e.contains(RELAXED_ALLOCATION_LIMITS)), "{text}");
    let components = lz::reported(&text, "LZ-COMPONENTS").unwrap_or_else(|| panic!("{text}"));
    assert!(components.contains("validation layer"), "the validation layer is not loaded: {components}");
    assert!(!text.contains("ZE_RESULT_ERROR"), "a Level Zero call failed:\n{text}");
    lz::assert_counts_balanced(&text, false);
}

/// The error a driver without the extension gives, as the engine sees it (no device needed).
#[test]
fn the_refusal_names_the_size_the_limit_and_the_extension() {
    let e = LzError::AllocationTooLarge {
        bytes: 5 << 30,
        class: 5 << 30,
        max_alloc: PVC_TILE_MAX_ALLOC,
        extension: RELAXED_ALLOCATION_LIMITS,
    };
    let text = rserve_engine::backend::BackendError::from(e).to_string();
    assert!(text.contains("5368709120 bytes") && text.contains("4294967296 bytes, maxMemAllocSize"), "{text}");
    assert!(text.contains("ZE_experimental_relaxed_allocation_limits"), "{text}");
}
