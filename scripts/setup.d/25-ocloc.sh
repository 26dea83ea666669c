#!/usr/bin/env bash
# 25-ocloc.sh — Intel's GPU compiler `ocloc` (Debian 12's intel-opencl-icd, with IGC and its libraries), unpacked
# into <repo>/.ocloc without installing the packages: installed, intel-opencl-icd also brings Intel's Level Zero GPU
# driver, which the Level Zero loader would then load next to the null driver the tests use. Only the PVC compile
# test runs it (RSERVE_OCLOC, scripts/env.d/25-ocloc.sh), with the unpacked libraries on its own LD_LIBRARY_PATH.
# Idempotent.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DIR="$REPO/.ocloc"
PACKAGES=(intel-opencl-icd libigc1 libigdfcl1 libigdgmm12 libllvmspirvlib14)

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
# IGC links LLVM 14 (a plain library; no driver comes with it).
if ! ldconfig -p 2>/dev/null | grep -q 'libLLVM-14\.so\.1 '; then
  $SUDO apt-get update -qq
  $SUDO apt-get install -y --no-install-recommends libllvm14
fi
if [ ! -x "$DIR/root/usr/bin/ocloc" ]; then
  rm -rf "$DIR"
  mkdir -p "$DIR/debs"
  (cd "$DIR/debs" && apt-get download "${PACKAGES[@]}" 2>&1 | grep -v "^W: Download is performed unsandboxed" || true)
  for d in "$DIR"/debs/*.deb; do dpkg -x "$d" "$DIR/root"; done
  dpkg-deb -f "$DIR"/debs/intel-opencl-icd_*.deb Version > "$DIR/VERSION"
fi
echo "ocloc: $DIR/root/usr/bin/ocloc"
