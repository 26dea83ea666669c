//! The generated bindings against the installed loader (Debian `libze1`; scripts/setup.d/30-level-zero.sh installs
//! it): the library opens at run time, the core functions resolve, and the result codes have the values of the
//! Level Zero specification.

use level_zero_sys as sys;

#[test]
fn the_loader_opens_and_its_core_functions_resolve() {
    // SAFETY: opening the loader runs its initialisers only.
    let lib = unsafe { sys::ZeLoader::new(sys::LOADER_SONAME) }.unwrap_or_else(|e| {
        panic!("{} did not open ({e}): install libze1 (scripts/setup.d/30-level-zero.sh)", sys::LOADER_SONAME)
    });
    assert!(lib.zeInit.is_ok() && lib.zeDriverGet.is_ok() && lib.zeMemAllocDevice.is_ok());
    assert!(lib.zeCommandListAppendLaunchKernel.is_ok() && lib.zelLoaderGetVersions.is_ok());
}

#[test]
fn a_missing_library_is_an_error_not_a_crash() {
    // SAFETY: the file does not exist; nothing is loaded.
    assert!(unsafe { sys::ZeLoader::new("/nonexistent/libze_loader.so.1") }.is_err());
}

#[test]
fn result_codes_follow_the_specification() {
    assert_eq!(sys::ZE_RESULT_SUCCESS, 0);
    assert_eq!(sys::ZE_RESULT_ERROR_UNINITIALIZED, 0x7800_0001);
    assert_eq!(sys::ZE_RESULT_ERROR_UNKNOWN, 0x7fff_fffe);
}
