//! Without a Level Zero driver: `--device level-zero` fails with one line that says no driver/device was found and
//! which variables were consulted (with their values); a loader library that cannot be opened says so; `--device
//! auto` falls back to the CPU. Each body runs in a child process with a controlled environment.

mod level_zero_support;

use level_zero_support as lz;
use rserve_engine::engine::device::Device;

fn select_error(arg: &str) {
    match Device::select(arg) {
        Ok(d) => println!("LZ-FOUND: {}", d.name()),
        Err(e) => println!("LZ-ERROR: {e}"),
    }
}

fn error_line(test: &str, env: &[(String, String)]) -> String {
    let out = lz::run_child(test, env);
    let text = lz::text(&out);
    assert!(out.status.success(), "the child failed:\n{text}");
    assert!(
        lz::reported(&text, "LZ-FOUND").is_none(),
        "a Level Zero device was found; this test needs a host without one:\n{text}"
    );
    lz::reported(&text, "LZ-ERROR").unwrap_or_else(|| panic!("no error in:\n{text}")).to_string()
}

#[test]
fn no_driver_is_one_line_naming_the_variables() {
    if lz::in_child() {
        return select_error("level-zero");
    }
    // No null driver; a mask that selects no device, so that a host with a real GPU also sees none.
    let env = vec![("ZE_AFFINITY_MASK".to_string(), "4095".to_string())];
    let msg = error_line("no_driver_is_one_line_naming_the_variables", &env);
    assert!(msg.contains("no Level Zero driver/device was found"), "{msg}");
    for var in
        ["ZE_AFFINITY_MASK=4095", "ZE_FLAT_DEVICE_HIERARCHY unset", "ZE_ENABLE_NULL_DRIVER unset", "LD_LIBRARY_PATH"]
    {
        assert!(msg.contains(var), "{var} is not named in: {msg}");
    }
}

#[test]
fn a_loader_that_cannot_be_opened_is_named() {
    if lz::in_child() {
        return select_error("level-zero:0");
    }
    let env = vec![("RSERVE_ZE_LOADER".to_string(), "/nonexistent/libze_loader.so.1".to_string())];
    let msg = error_line("a_loader_that_cannot_be_opened_is_named", &env);
    assert!(msg.contains("no Level Zero driver/device was found"), "{msg}");
    assert!(msg.contains("/nonexistent/libze_loader.so.1") && msg.contains("could not be loaded"), "{msg}");
    assert!(msg.contains("RSERVE_ZE_LOADER=/nonexistent/libze_loader.so.1"), "{msg}");
}

#[test]
fn a_malformed_device_index_is_refused_before_loading() {
    if lz::in_child() {
        return select_error("level-zero:first");
    }
    let msg = error_line("a_malformed_device_index_is_refused_before_loading", &[]);
    assert!(msg.contains("level-zero:first") && msg.contains("level-zero:N"), "{msg}");
}

fn auto_in_child() {
    println!("LZ-AUTO: {}", Device::select("auto").unwrap().name());
}

#[test]
fn auto_falls_back_to_the_cpu() {
    if lz::in_child() {
        return auto_in_child();
    }
    let env = vec![("RSERVE_ZE_LOADER".to_string(), "/nonexistent/libze_loader.so.1".to_string())];
    let out = lz::run_child("auto_falls_back_to_the_cpu", &env);
    let text = lz::text(&out);
    assert!(out.status.success(), "the child failed:\n{text}");
    assert!(lz::reported(&text, "LZ-AUTO").is_some_and(|n| n.starts_with("cpu")), "{text}");
}
