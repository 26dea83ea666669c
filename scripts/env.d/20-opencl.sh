# 20-opencl.sh (sourced) — point the OpenCL ICD loader at Intel's CPU runtime that scripts/setup.d/20-opencl.sh
# installed in <repo>/.opencl-rt. The OpenCL tests run (and fail loudly if the runtime is broken) when
# OCL_ICD_VENDORS is set; an existing value is kept.
_rserve_repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export OCL_ICD_VENDORS="${OCL_ICD_VENDORS:-$_rserve_repo/.opencl-rt/icd}"
unset _rserve_repo
