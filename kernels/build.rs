//! Builds every kernel source `src/cl/*.cl` to SPIR-V and embeds the modules (see `src/lib.rs`).
//!
//! With clang-15 and llvm-spirv-15 on PATH (override: `RSERVE_CLANG`, `RSERVE_LLVM_SPIRV`), each source is compiled
//! fresh: `clang -target spir64 -cl-std=CL2.0 -emit-llvm` with the launch constants of `src/launch.rs` as `-D`
//! flags, then `llvm-spirv --spirv-max-version=1.4`, then `spirv-val` (override: `RSERVE_SPIRV_VAL`) when it is
//! installed. Without the toolchain (or with `RSERVE_KERNELS_PREBUILT=1`) the committed modules in `spirv/` are
//! embedded instead. `RSERVE_KERNELS_UPDATE=1` writes fresh modules over the committed ones; a fresh build that
//! differs from them prints a warning, and the crate's `spirv` test fails on it.
//!
//! LLVM's optimiser is not run (`-Xclang -disable-llvm-passes`): llvm-spirv 15 mistranslates optimised LLVM 15 IR
//! (`freeze` instructions, blocks out of dominance order), and every consumer of SPIR-V (Intel's OpenCL CPU and GPU
//! compilers, Level Zero) optimises the module itself when it builds it.
//!
//! PVC native binaries (Data Center GPU Max, for Level Zero's `ZE_MODULE_FORMAT_NATIVE`): with Intel's `ocloc` named
//! by `RSERVE_OCLOC` (its libraries in `RSERVE_OCLOC_LIBS`; scripts/setup.d/25-ocloc.sh), each embedded SPIR-V module
//! is compiled with `ocloc compile -spirv_input -device pvc --format zebin -exclude_ir -options
//! -cl-intel-greater-than-4GB-buffer-required` (buffers over 4 GiB, see `PVC_BUILD_OPTIONS`) and checked against the
//! committed `pvc/<module>.bin` the same way (warning when stale, written by `RSERVE_KERNELS_UPDATE=1`); without
//! `ocloc` the committed binaries are embedded (a module without one embeds an empty binary: SPIR-V only).

#[path = "src/launch.rs"]
#[allow(dead_code)]
mod launch;

use std::path::{Path, PathBuf};
use std::process::Command;

fn tool(env: &str, default: &str) -> String {
    println!("cargo:rerun-if-env-changed={env}");
    std::env::var(env).unwrap_or_else(|_| default.to_string())
}

fn runs(cmd: &str) -> bool {
    Command::new(cmd).arg("--version").output().map(|o| o.status.success()).unwrap_or(false)
}

fn run(cmd: &mut Command, what: &str) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: cannot run {:?}: {e}", cmd.get_program()));
    if !out.status.success() {
        panic!(
            "{what} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let src_dir = manifest.join("src/cl");
    let committed_dir = manifest.join("spirv");
    println!("cargo:rerun-if-changed=src/cl");
    println!("cargo:rerun-if-changed=src/launch.rs");
    println!("cargo:rerun-if-changed=spirv");
    println!("cargo:rerun-if-env-changed=RSERVE_KERNELS_PREBUILT");
    println!("cargo:rerun-if-env-changed=RSERVE_KERNELS_UPDATE");

    let clang = tool("RSERVE_CLANG", "clang-15");
    let llvm_spirv = tool("RSERVE_LLVM_SPIRV", "llvm-spirv-15");
    let spirv_val = tool("RSERVE_SPIRV_VAL", "spirv-val");
    let prebuilt = std::env::var("RSERVE_KERNELS_PREBUILT").is_ok_and(|v| v == "1");
    let update = std::env::var("RSERVE_KERNELS_UPDATE").is_ok_and(|v| v == "1");
    let fresh = !prebuilt && runs(&clang) && runs(&llvm_spirv);
    let validate = fresh && runs(&spirv_val);
    if update && !fresh {
        panic!("RSERVE_KERNELS_UPDATE=1 needs {clang} and {llvm_spirv} (scripts/setup.d/20-opencl.sh installs them)");
    }
    if fresh && !validate {
        println!("cargo:warning=rserve-kernels: {spirv_val} not found, SPIR-V modules are not validated");
    }

    let mut names: Vec<String> = std::fs::read_dir(&src_dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", src_dir.display()))
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "cl"))
        .filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .collect();
    names.sort();

    let ocloc = std::env::var("RSERVE_OCLOC").ok().filter(|v| !v.is_empty() && !prebuilt);
    let ocloc_libs = tool("RSERVE_OCLOC_LIBS", "");
    println!("cargo:rerun-if-env-changed=RSERVE_OCLOC");
    println!("cargo:rerun-if-changed=pvc");
    let pvc_dir = manifest.join("pvc");
    if update && ocloc.is_none() {
        println!("cargo:warning=rserve-kernels: RSERVE_OCLOC is unset, kernels/pvc is not refreshed");
    }
    let defines: Vec<String> = launch::DEFINES.iter().map(|(k, v)| format!("-D{k}={v}")).collect();
    let mut table = String::new();
    for name in &names {
        let spv = out_dir.join(format!("{name}.spv"));
        let committed = committed_dir.join(format!("{name}.spv"));
        if fresh {
            let bc = out_dir.join(format!("{name}.bc"));
            run(
                Command::new(&clang)
                    .args(["-c", "-target", "spir64", "-cl-std=CL2.0", "-O2", "-Xclang", "-disable-llvm-passes"])
                    .args(["-emit-llvm", "-Werror"])
                    .args(&defines)
                    .arg("-o")
                    .arg(&bc)
                    .arg(src_dir.join(format!("{name}.cl"))),
                &format!("{clang} {name}.cl"),
            );
            run(
                Command::new(&llvm_spirv).arg("--spirv-max-version=1.4").arg(&bc).arg("-o").arg(&spv),
                &format!("{llvm_spirv} {name}.bc"),
            );
            if validate {
                run(Command::new(&spirv_val).arg(&spv), &format!("{spirv_val} {name}.spv"));
            }
            let bytes = std::fs::read(&spv).unwrap_or_else(|e| panic!("cannot read {}: {e}", spv.display()));
            if update {
                std::fs::create_dir_all(&committed_dir).expect("create kernels/spirv");
                std::fs::write(&committed, &bytes)
                    .unwrap_or_else(|e| panic!("cannot write {}: {e}", committed.display()));
            } else if std::fs::read(&committed).ok().as_deref() != Some(bytes.as_slice()) {
                println!(
                    "cargo:warning=rserve-kernels: kernels/spirv/{name}.spv is stale; refresh it with \
                     `RSERVE_KERNELS_UPDATE=1 cargo build -p rserve-kernels`"
                );
            }
        } else {
            std::fs::copy(&committed, &spv).unwrap_or_else(|e| {
                panic!(
                    "no SPIR-V toolchain ({clang}, {llvm_spirv}) and no committed module {}: {e}",
                    committed.display()
                )
            });
        }
        let pvc = out_dir.join(format!("{name}.pvc.bin"));
        pvc_binary(ocloc.as_deref(), &ocloc_libs, &spv, &pvc, &pvc_dir.join(format!("{name}.bin")), update);
        table.push_str(&format!(
            "    Module {{ name: {name:?}, spirv: include_bytes!({spv:?}), pvc: include_bytes!({pvc:?}), \
             source: include_str!({src:?}) }},\n",
            spv = path_str(&spv),
            pvc = path_str(&pvc),
            src = path_str(&src_dir.join(format!("{name}.cl"))),
        ));
    }
    let code = format!(
        "/// Every kernel module, by source file name (sorted).\npub static MODULES: &[Module] = &[\n{table}];\n\
         /// True when this build compiled the modules from source; false when it embedded the committed ones.\n\
         pub const BUILT_FROM_SOURCE: bool = {fresh};\n\
         /// True when this build compiled the PVC binaries with ocloc; false when it embedded the committed ones.\n\
         pub const PVC_BUILT: bool = {pvc_built};\n\
         /// The ocloc arguments of the PVC binaries (after `compile -spirv_input -file <module>.spv`).\n\
         pub const PVC_OCLOC_ARGS: &[&str] = &{PVC_OCLOC_ARGS:?};\n\
         /// The compiler options of the PVC binaries (ocloc `-options`): kernels that may index buffers over 4 GiB.\n\
         pub const PVC_BUILD_OPTIONS: &str = {PVC_BUILD_OPTIONS:?};\n",
        pvc_built = ocloc.is_some()
    );
    std::fs::write(out_dir.join("modules.rs"), code).expect("write modules.rs");
}

fn path_str(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// The PVC native binary of the SPIR-V module `spv`, written to `out`: compiled by `ocloc` when there is one (and
/// compared with, or with `update` written over, `committed`), else the committed binary (empty when none).
fn pvc_binary(ocloc: Option<&str>, libs: &str, spv: &Path, out: &Path, committed: &Path, update: bool) {
    let Some(ocloc) = ocloc else {
        let bytes = std::fs::read(committed).unwrap_or_default();
        std::fs::write(out, bytes).unwrap_or_else(|e| panic!("cannot write {}: {e}", out.display()));
        return;
    };
    let mut cmd = Command::new(ocloc);
    cmd.args(["compile", "-q", "-spirv_input", "-file"]).arg(spv);
    cmd.args(PVC_OCLOC_ARGS).arg("-output_no_suffix").arg("-output").arg(out);
    if !libs.is_empty() {
        // Debian's unpacked compiler (scripts/setup.d/25-ocloc.sh); an installed one keeps the caller's path.
        cmd.env("LD_LIBRARY_PATH", libs);
    }
    run(&mut cmd, &format!("{ocloc} {}", spv.display()));
    let bytes = std::fs::read(out).unwrap_or_else(|e| panic!("cannot read {}: {e}", out.display()));
    if update {
        std::fs::create_dir_all(committed.parent().expect("kernels/pvc")).expect("create kernels/pvc");
        std::fs::write(committed, &bytes).unwrap_or_else(|e| panic!("cannot write {}: {e}", committed.display()));
    } else if std::fs::read(committed).ok().as_deref() != Some(bytes.as_slice()) {
        println!(
            "cargo:warning=rserve-kernels: kernels/pvc/{} is stale; refresh it with \
             `RSERVE_KERNELS_UPDATE=1 cargo build -p rserve-kernels`",
            committed.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
        );
    }
}

/// IGC's option for kernels that may index buffers over 4 GiB (stateless addressing): the OpenCL spelling of Level
/// Zero's `-ze-opt-greater-than-4GB-buffer-required`, which the backend passes to its SPIR-V builds. The Level Zero
/// backend allocates buffers over the device's `maxMemAllocSize` (a PVC tile's 4 GiB) with relaxed limits, so every
/// kernel must be built for them. For PVC, ocloc 22.43 already compiles every kernel stateless (`has_4gb_buffers`):
/// the option leaves the code as it was and is recorded in the binary's `.misc.buildOptions`.
const PVC_BUILD_OPTIONS: &str = "-cl-intel-greater-than-4GB-buffer-required";

/// How the PVC binaries are built (after `-file <spv>`): zebin, the format current drivers produce themselves,
/// without the SPIR-V inside (the backend holds it already), and for buffers over 4 GiB.
const PVC_OCLOC_ARGS: &[&str] = &["-device", "pvc", "--format", "zebin", "-exclude_ir", "-options", PVC_BUILD_OPTIONS];
