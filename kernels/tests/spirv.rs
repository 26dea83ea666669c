//! The embedded SPIR-V modules are valid (`spirv-val`) and the committed `kernels/spirv/*.spv` equal a fresh build
//! of the sources, so a machine without clang runs exactly what CI compiled; and every kernel source starts its
//! kernels with the launch-ordering wait.
//!
//! Both tests need the SPIR-V toolchain (scripts/setup.d/20-opencl.sh). Where it is missing they skip loudly, except
//! when `OCL_ICD_VENDORS` is set (CI and scripts/test.sh set it through scripts/env.d): there a missing toolchain is
//! a failure.

use std::path::PathBuf;
use std::process::Command;

fn toolchain_required() -> bool {
    std::env::var_os("OCL_ICD_VENDORS").is_some()
}

fn skip_or_fail(what: &str) {
    if toolchain_required() {
        panic!(
            "{what} (OCL_ICD_VENDORS is set, so the SPIR-V toolchain must be installed: scripts/setup.d/20-opencl.sh)"
        );
    }
    eprintln!("SKIPPED: {what}; run scripts/setup.d/20-opencl.sh to check the kernels");
}

#[test]
fn every_module_validates_with_spirv_val() {
    let val = std::env::var("RSERVE_SPIRV_VAL").unwrap_or_else(|_| "spirv-val".into());
    if !Command::new(&val).arg("--version").output().is_ok_and(|o| o.status.success()) {
        return skip_or_fail(&format!("{val} is not installed"));
    }
    let dir = tempfile_dir();
    for m in rserve_kernels::MODULES {
        let path = dir.join(format!("{}.spv", m.name));
        std::fs::write(&path, m.spirv).unwrap();
        let out = Command::new(&val).arg(&path).output().unwrap();
        assert!(
            out.status.success(),
            "{}: spirv-val failed:\n{}{}",
            m.name,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn committed_spirv_equals_a_fresh_build() {
    if !rserve_kernels::BUILT_FROM_SOURCE {
        return skip_or_fail(
            "this build embedded the committed SPIR-V (no clang-15/llvm-spirv-15, or RSERVE_KERNELS_PREBUILT=1)",
        );
    }
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("spirv");
    let mut stale = Vec::new();
    for m in rserve_kernels::MODULES {
        if std::fs::read(dir.join(format!("{}.spv", m.name))).ok().as_deref() != Some(m.spirv) {
            stale.push(m.name);
        }
    }
    let mut committed: Vec<String> = std::fs::read_dir(&dir)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    committed
        .retain(|n| n.ends_with(".spv") && !rserve_kernels::MODULES.iter().any(|m| format!("{}.spv", m.name) == *n));
    assert!(
        stale.is_empty() && committed.is_empty(),
        "kernels/spirv is out of date (stale: {stale:?}, without a source: {committed:?}); refresh it with \
         `RSERVE_KERNELS_UPDATE=1 cargo build -p rserve-kernels` and delete orphans"
    );
}

fn tempfile_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rserve-kernels-spirv-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Bodies that may come before `GRID_DEP_SYNC()` in a kernel: they issue reads of weights (which no kernel writes)
/// before they wait, and must wait themselves.
const EARLY_READERS: &[&str] = &["matmul_pdla"];

/// Every kernel starts with `GRID_DEP_SYNC()` (or calls one of `EARLY_READERS`, which waits after its weight reads): the CUDA backend launches all of them with programmatic dependent
/// launch, so a kernel without the wait could read its inputs before the previous kernel has written them.
#[test]
fn every_kernel_waits_for_the_previous_one_first() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut sources: Vec<PathBuf> = std::fs::read_dir(dir.join("src/cl"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "cl"))
        .collect();
    sources.push(dir.join("src/cuda/cublas_glue.cu"));
    let mut kernels = 0;
    for path in sources {
        let text = std::fs::read_to_string(&path).unwrap();
        let code: Vec<&str> = text.lines().filter(|l| !l.trim_start().starts_with("//")).collect();
        for (i, line) in code.iter().enumerate() {
            if !line.contains("KERNEL void") {
                continue;
            }
            kernels += 1;
            // The body's first statement follows the opening brace of the signature.
            let rest: String = code[i..].join("\n");
            let body = &rest[rest.find('{').expect("kernel body") + 1..];
            let mut first = body.trim_start().trim_start_matches('\\').trim_start();
            // Local-memory declarations (which read nothing) may come first.
            while first.starts_with("LOCAL ") {
                first = first[first.find(';').expect("declaration") + 1..]
                    .trim_start()
                    .trim_start_matches('\\')
                    .trim_start();
            }
            // The exception: bodies that first read weights (never written by an earlier kernel) and then wait.
            if let Some(helper) = EARLY_READERS.iter().find(|h| first.starts_with(&format!("{h}("))) {
                let def = text.find(&format!("INLINE void {helper}(")).expect("the helper's definition");
                let def_body = &text[def..text[def..].find("\n}").map_or(text.len(), |e| def + e)];
                assert!(
                    def_body.contains("GRID_DEP_SYNC();"),
                    "{}: {helper} must call GRID_DEP_SYNC()",
                    path.display()
                );
                continue;
            }
            assert!(
                first.starts_with("GRID_DEP_SYNC();"),
                "{}: the kernel `{}` must start with GRID_DEP_SYNC();",
                path.display(),
                line.trim()
            );
        }
    }
    assert!(kernels >= 20, "found only {kernels} kernels");
}
