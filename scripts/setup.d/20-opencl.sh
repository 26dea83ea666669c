#!/usr/bin/env bash
# 20-opencl.sh — the SPIR-V toolchain (clang-15, llvm-spirv-15, spirv-tools) that builds kernels/, the OpenCL ICD
# loader, and Intel's CPU OpenCL runtime from PyPI in <repo>/.opencl-rt with its own ICD folder
# (<repo>/.opencl-rt/icd, exported as OCL_ICD_VENDORS by scripts/env.d/20-opencl.sh). Idempotent.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
RT="$REPO/.opencl-rt"

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
need=()
command -v clang-15 >/dev/null || need+=(clang-15)
command -v llvm-spirv-15 >/dev/null || need+=(llvm-spirv-15)
command -v spirv-val >/dev/null || need+=(spirv-tools)
command -v clinfo >/dev/null || need+=(clinfo)
ldconfig -p 2>/dev/null | grep -q 'libOpenCL\.so\.1 ' || need+=(ocl-icd-libopencl1)
python3 -c "import ensurepip, venv" 2>/dev/null || need+=(python3-venv)
if [ ${#need[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  $SUDO apt-get install -y --no-install-recommends "${need[@]}"
fi

# Intel's runtime (libintelocl.so) links libimf/libsvml/libirng/libintlc, which come with intel-cmplr-lib-rt.
if [ ! -f "$RT/lib/libintelocl.so" ]; then
  python3 -m venv "$RT"
  "$RT/bin/pip" install -q intel-opencl-rt intel-cmplr-lib-rt
fi
# The .icd file the wheel ships names a path that does not exist here: write our own.
mkdir -p "$RT/icd"
echo "$RT/lib/libintelocl.so" > "$RT/icd/intel-cpu.icd"
echo "OpenCL: Intel CPU runtime in $RT (ICD folder $RT/icd)"
