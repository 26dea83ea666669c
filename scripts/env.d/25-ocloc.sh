# 25-ocloc.sh (sourced) — where scripts/setup.d/25-ocloc.sh unpacked Intel's GPU compiler: the PVC compile test
# (kernels/tests/pvc.rs) runs when RSERVE_OCLOC names it. Its libraries are passed to that test's child processes
# only (RSERVE_OCLOC_LIBS), never exported as LD_LIBRARY_PATH, so the Level Zero loader never sees Intel's GPU driver.
_rserve_repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if [ -x "$_rserve_repo/.ocloc/root/usr/bin/ocloc" ]; then
  export RSERVE_OCLOC="${RSERVE_OCLOC:-$_rserve_repo/.ocloc/root/usr/bin/ocloc}"
  export RSERVE_OCLOC_LIBS="${RSERVE_OCLOC_LIBS:-$_rserve_repo/.ocloc/root/usr/lib/x86_64-linux-gnu}"
fi
unset _rserve_repo
