//! Every committed SPIR-V module through Intel's GPU compiler for PVC (Data Center GPU Max, Aurora's GPU):
//! `ocloc compile -spirv_input -device pvc` with the binaries' compiler options (`PVC_BUILD_OPTIONS`: buffers over
//! 4 GiB) must build each module, print no spill warning, and give every kernel zero scratch space; the table of
//! kernels with their SIMD width and registers (GRF) comes from `ocloc disasm`'s dump of the binary's patch tokens
//! and is printed (`cargo test -p rserve-kernels --test pvc -- --nocapture`).
//!
//! Runs when `RSERVE_OCLOC` names the compiler (scripts/setup.d/25-ocloc.sh unpacks Debian 12's; scripts/env.d sets
//! it) with its libraries in `RSERVE_OCLOC_LIBS`, which only the compiler's own processes see.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The patch token of a kernel's execution environment, and the offsets of the fields read from it (IGC's
/// `SPatchExecutionEnvironment`: `LargestCompiledSIMDSize`, `NumGRFRequired`).
const EXECUTION_ENVIRONMENT: u32 = 23;
const SIMD_AT: usize = 12;
const GRF_AT: usize = 80;
/// The patch token holding a kernel's per-thread scratch space (`SPatchMediaVFEState`): spills land there.
const SCRATCH: u32 = 19;

struct Kernel {
    name: String,
    simd: u32,
    grf: u32,
    scratch: u32,
}

fn ocloc() -> Option<(PathBuf, String)> {
    let bin = std::env::var_os("RSERVE_OCLOC").map(PathBuf::from)?;
    Some((bin, std::env::var("RSERVE_OCLOC_LIBS").unwrap_or_default()))
}

fn run(bin: &Path, libs: &str, args: &[&str]) -> String {
    let out = Command::new(bin).args(args).env("LD_LIBRARY_PATH", libs).output().expect("ocloc runs");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "ocloc {args:?} failed:\n{text}");
    text
}

/// A little-endian u32 of a token's payload as `ocloc disasm` prints it (`Hex` bytes in hexadecimal).
fn field(hex: &[u8], at: usize) -> u32 {
    hex.get(at..at + 4).map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// Kernels and their execution environments from `ocloc disasm`'s PTM.txt.
fn parse_ptm(text: &str) -> Vec<Kernel> {
    let mut kernels: Vec<Kernel> = Vec::new();
    let mut token = 0u32;
    for line in text.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix("KernelName ") {
            kernels.push(Kernel { name: name.to_string(), simd: 0, grf: 0, scratch: 0 });
        } else if let Some(t) = line.strip_prefix("4 Token ") {
            token = t.parse().unwrap_or(0);
        } else if let (Some(hex), Some(k)) = (line.strip_prefix("Hex "), kernels.last_mut()) {
            let bytes: Vec<u8> = hex.split_whitespace().map(|b| u8::from_str_radix(b, 16).unwrap_or(0)).collect();
            match token {
                EXECUTION_ENVIRONMENT => {
                    k.simd = field(&bytes, SIMD_AT);
                    k.grf = field(&bytes, GRF_AT);
                }
                SCRATCH => k.scratch = field(&bytes, 0),
                _ => {}
            }
        }
    }
    kernels
}

#[test]
fn every_module_builds_for_pvc_without_spills() {
    let Some((bin, libs)) = ocloc() else {
        eprintln!(
            "SKIPPED: RSERVE_OCLOC is unset (run scripts/setup.d/25-ocloc.sh and source scripts/env.d/25-ocloc.sh)"
        );
        return;
    };
    let dir = std::env::temp_dir().join(format!("rserve-pvc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut table = Vec::new();
    for (module, entry_points) in rserve_kernels::KERNELS {
        let spv = dir.join(format!("{module}.spv"));
        std::fs::write(&spv, rserve_kernels::module(module).unwrap().spirv).unwrap();
        let out = dir.join(module);
        let log = run(
            &bin,
            &libs,
            &[
                "compile",
                "-spirv_input",
                "-file",
                spv.to_str().unwrap(),
                "-device",
                "pvc",
                "-options",
                rserve_kernels::PVC_BUILD_OPTIONS,
                "-output_no_suffix",
                "-output",
                out.to_str().unwrap(),
            ],
        );
        assert!(log.contains("Build succeeded"), "{module}: {log}");
        assert!(!log.to_lowercase().contains("spill"), "{module} spills registers on PVC:\n{log}");
        let dump = dir.join(format!("{module}.dump"));
        run(
            &bin,
            &libs,
            &["disasm", "-file", out.to_str().unwrap(), "-dump", dump.to_str().unwrap(), "-device", "pvc"],
        );
        let kernels = parse_ptm(&std::fs::read_to_string(dump.join("PTM.txt")).unwrap());
        let mut names: Vec<&str> = kernels.iter().map(|k| k.name.as_str()).collect();
        names.sort();
        let mut want: Vec<&str> = entry_points.to_vec();
        want.sort();
        assert_eq!(names, want, "{module}: kernels in the PVC binary");
        for k in kernels {
            assert!(k.simd > 0 && k.grf > 0, "{}: no execution environment in the dump", k.name);
            assert_eq!(k.scratch, 0, "{}: {} bytes of scratch per thread (register spills) on PVC", k.name, k.scratch);
            table.push(format!("| `{}` | `{}` | SIMD{} | {} |", module, k.name, k.simd, k.grf));
        }
    }
    // scripts/setup.d/25-ocloc.sh records the package version next to the unpacked tree (.ocloc/VERSION).
    let version = bin.ancestors().nth(4).and_then(|d| std::fs::read_to_string(d.join("VERSION")).ok());
    println!("ocloc {} for PVC: every kernel without spills", version.as_deref().unwrap_or("(version unknown)").trim());
    println!("| module | kernel | SIMD | GRF registers |\n| --- | --- | --- | --- |\n{}", table.join("\n"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The PVC native binaries the Level Zero backend loads (`ZE_MODULE_FORMAT_NATIVE`): one for every module, and the
/// committed `kernels/pvc/*.bin` equal what `ocloc` builds from the embedded SPIR-V (checked where `RSERVE_OCLOC`
/// is set, as `build.rs` then compiles them), so a machine without `ocloc` loads exactly what CI built.
#[test]
fn committed_pvc_binaries_equal_a_fresh_build() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("pvc");
    let empty: Vec<&str> = rserve_kernels::MODULES.iter().filter(|m| m.pvc.is_empty()).map(|m| m.name).collect();
    assert!(empty.is_empty(), "modules without a PVC binary: {empty:?} (refresh: see below)");
    if !rserve_kernels::PVC_BUILT {
        eprintln!("SKIPPED freshness: this build embedded the committed PVC binaries (RSERVE_OCLOC is unset)");
        return;
    }
    let stale: Vec<&str> = rserve_kernels::MODULES
        .iter()
        .filter(|m| std::fs::read(dir.join(format!("{}.bin", m.name))).ok().as_deref() != Some(m.pvc))
        .map(|m| m.name)
        .collect();
    let orphans: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !rserve_kernels::MODULES.iter().any(|m| format!("{}.bin", m.name) == *n))
        .collect();
    assert!(
        stale.is_empty() && orphans.is_empty(),
        "kernels/pvc is out of date (stale: {stale:?}, without a module: {orphans:?}); refresh it with \
         `RSERVE_KERNELS_UPDATE=1 cargo build -p rserve-kernels` (RSERVE_OCLOC set) and delete orphans"
    );
    // Each is a zebin, an ELF file.
    for m in rserve_kernels::MODULES {
        assert_eq!(&m.pvc[..4], b"\x7fELF", "{}: not an ELF binary", m.name);
    }
}

/// The XMX matmul (`xmx.cl`) is built for PVC's matrix engine: `ocloc disasm` of its PVC build shows `dpas`
/// instructions (the sub-group matrix built-in lowered to the hardware), and its emulated form (`xmx_emu`, the
/// CPU runtime's) none. Spills and scratch are checked with every other kernel above.
#[test]
fn xmx_matmul_runs_on_the_matrix_engine() {
    let Some((bin, libs)) = ocloc() else {
        eprintln!("SKIPPED: RSERVE_OCLOC is unset (see every_module_builds_for_pvc_without_spills)");
        return;
    };
    let dir = std::env::temp_dir().join(format!("rserve-pvc-xmx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // `ocloc disasm` opens IGA as `libiga64.so`; Debian's package ships only `libiga64.so.1`.
    let iga = dir.join("iga");
    std::fs::create_dir_all(&iga).unwrap();
    let _ = std::os::unix::fs::symlink(Path::new(&libs).join("libiga64.so.1"), iga.join("libiga64.so"));
    let libs = format!("{libs}:{}", iga.display());
    let mut dpas = Vec::new();
    for module in ["xmx", "xmx_emu"] {
        let spv = dir.join(format!("{module}.spv"));
        std::fs::write(&spv, rserve_kernels::module(module).unwrap().spirv).unwrap();
        let out = dir.join(module);
        let (spv, out_s) = (spv.to_str().unwrap(), out.to_str().unwrap());
        run(
            &bin,
            &libs,
            &["compile", "-spirv_input", "-file", spv, "-device", "pvc", "-output_no_suffix", "-output", out_s],
        );
        let dump = dir.join(format!("{module}.dump"));
        run(&bin, &libs, &["disasm", "-file", out_s, "-dump", dump.to_str().unwrap(), "-device", "pvc"]);
        let asm: String = std::fs::read_dir(&dump)
            .unwrap()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "asm"))
            .map(|p| std::fs::read_to_string(p).unwrap())
            .collect();
        assert!(!asm.is_empty(), "{module}: ocloc disasm wrote no assembly (IGA missing?)");
        let lines: Vec<String> = asm.lines().filter(|l| l.contains("dpas")).map(|l| l.trim().to_string()).collect();
        dpas.push((module, lines));
    }
    let (hw, emu) = (&dpas[0].1, &dpas[1].1);
    assert!(!hw.is_empty(), "matmul_xmx_bf16 has no dpas instruction on PVC");
    assert!(emu.is_empty(), "the emulated form should not use the matrix engine: {emu:?}");
    println!("matmul_xmx_bf16 on PVC: {} dpas instructions, e.g. `{}`", hw.len(), hw[0]);
    let _ = std::fs::remove_dir_all(&dir);
}
