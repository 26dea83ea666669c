//! With the `regenerate` feature: generates the Level Zero core bindings from `ze_api.h` with bindgen, in
//! dynamic-loading mode (the functions become fields of a `ZeLoader` struct filled from `libze_loader.so.1` at run
//! time, so nothing links against the loader and a host without Level Zero still builds and runs), into `OUT_DIR`;
//! `tests/bindings.rs` then checks them against the committed `src/bindings.rs`, and `LEVEL_ZERO_SYS_UPDATE=1`
//! writes them over it. Without the feature nothing is generated: a plain build needs neither libclang nor the
//! headers. The header directory comes from `LEVEL_ZERO_INCLUDE_DIR` (the folder that holds `level_zero/ze_api.h`;
//! default `/usr/include`, where Debian's `libze-dev` puts it).

#[cfg(not(feature = "regenerate"))]
fn main() {}

#[cfg(feature = "regenerate")]
fn main() {
    use std::env;
    use std::path::PathBuf;

    println!("cargo:rerun-if-env-changed=LEVEL_ZERO_INCLUDE_DIR");
    println!("cargo:rerun-if-env-changed=LEVEL_ZERO_SYS_UPDATE");
    println!("cargo:rerun-if-changed=wrapper.h");
    let include = env::var("LEVEL_ZERO_INCLUDE_DIR").unwrap_or_else(|_| "/usr/include".to_string());
    let header = PathBuf::from(&include).join("level_zero").join("ze_api.h");
    if !header.is_file() {
        eprintln!(
            "level-zero-sys: {} not found (level_zero/loader/ze_loader.h is needed too). Install the Level Zero headers (Debian/Ubuntu: apt-get install libze-dev; \
             on Aurora: module load oneapi) and set LEVEL_ZERO_INCLUDE_DIR to the folder that holds level_zero/ze_api.h.",
            header.display()
        );
        std::process::exit(1);
    }
    println!("cargo:rerun-if-changed={}", header.display());

    let bindings = bindgen::Builder::default()
        .header("wrapper.h")
        .clang_arg(format!("-I{include}"))
        // The core API (zes/zet are not used) and the loader's API; types and constants follow from the functions.
        .allowlist_function("ze[A-Z].*")
        .allowlist_function("zel[A-Z].*")
        .allowlist_type("_?zel?_.*")
        .allowlist_var("ZEL?_.*")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .derive_debug(true)
        .layout_tests(true)
        .dynamic_library_name("ZeLoader")
        // Functions newer than the loader found at run time stay `Err`: the safe wrapper checks the ones it uses.
        .dynamic_link_require_all(false)
        .generate()
        .unwrap_or_else(|e| {
            eprintln!(
                "level-zero-sys: bindgen failed on {}: {e} (bindgen needs libclang: apt-get install libclang-dev)",
                header.display()
            );
            std::process::exit(1);
        });
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("bindings.rs");
    if let Err(e) = bindings.write_to_file(&out) {
        eprintln!("level-zero-sys: cannot write {}: {e}", out.display());
        std::process::exit(1);
    }
    if env::var("LEVEL_ZERO_SYS_UPDATE").is_ok_and(|v| v == "1") {
        let committed = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets it")).join("src/bindings.rs");
        if let Err(e) = std::fs::copy(&out, &committed) {
            eprintln!("level-zero-sys: cannot update {}: {e}", committed.display());
            std::process::exit(1);
        }
    }
}
