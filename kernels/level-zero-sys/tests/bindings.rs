//! The committed bindings (`src/bindings.rs`) equal what bindgen generates from the installed headers (run with
//! `--features regenerate`; refresh with `LEVEL_ZERO_SYS_UPDATE=1`).
#![cfg(feature = "regenerate")]

#[test]
fn committed_bindings_are_current() {
    let fresh = std::fs::read_to_string(concat!(env!("OUT_DIR"), "/bindings.rs")).unwrap();
    let committed = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/bindings.rs")).unwrap();
    assert!(
        fresh == committed,
        "src/bindings.rs is out of date: regenerate it with \
         `LEVEL_ZERO_SYS_UPDATE=1 cargo build -p level-zero-sys --features regenerate`"
    );
}
