#!/usr/bin/env bash
# 30-level-zero.sh — what the Level Zero backend needs to build and be tested on a machine without an Intel GPU:
# the Level Zero headers and loader (libze-dev, libze1), libclang for bindgen (level-zero-sys), and the loader's
# null driver (libze_null.so), built from Debian's `level-zero` source package into <repo>/.level-zero/ without
# touching the system's apt sources. scripts/env.d/30-level-zero.sh exports where the null driver lives
# (RSERVE_ZE_NULL_DRIVER_DIR); the tests set ZE_ENABLE_NULL_DRIVER for their own child processes only.
# Idempotent: a built null driver is kept.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
LZ="$REPO/.level-zero"
LIB="$LZ/build/lib"

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
need=()
[ -f /usr/include/level_zero/ze_api.h ] || need+=(libze-dev)
ldconfig -p 2>/dev/null | grep -q 'libze_loader\.so\.1 ' || need+=(libze1)
dpkg-query -W -f='${Status}' libclang-dev 2>/dev/null | grep -q 'ok installed' || need+=(libclang-dev)
command -v cmake >/dev/null || need+=(cmake)
command -v g++ >/dev/null || need+=(g++)
command -v dpkg-source >/dev/null || need+=(dpkg-dev)
if [ ${#need[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  $SUDO apt-get install -y --no-install-recommends "${need[@]}"
fi

if [ -f "$LIB/libze_null.so" ]; then
  echo "Level Zero: null driver already built in $LIB"
  exit 0
fi

# Fetch the source package through a private apt state (deb-src copy of the configured Debian sources).
WORK="$LZ/src-fetch"
rm -rf "$WORK"
mkdir -p "$WORK/parts" "$WORK/lists/partial"
found=0
for f in /etc/apt/sources.list.d/*.sources; do
  [ -e "$f" ] || continue
  sed 's/^Types: deb$/Types: deb-src/' "$f" > "$WORK/parts/$(basename "$f")"
  found=1
done
if [ -f /etc/apt/sources.list ]; then
  sed -n 's/^deb /deb-src /p' /etc/apt/sources.list > "$WORK/parts/from-sources-list.list"
  [ -s "$WORK/parts/from-sources-list.list" ] && found=1
fi
[ "$found" = 1 ] || { echo "30-level-zero.sh: no apt sources found to derive deb-src entries from" >&2; exit 1; }
O=(-o "Dir::Etc::SourceParts=$WORK/parts" -o Dir::Etc::SourceList=/dev/null -o "Dir::State::Lists=$WORK/lists")
apt-get "${O[@]}" update -qq
(cd "$WORK" && apt-get "${O[@]}" source --download-only level-zero)

rm -rf "$LZ/src"
dsc=$(ls "$WORK"/level-zero_*.dsc | head -n 1)
dpkg-source --no-check -x "$dsc" "$LZ/src" >/dev/null
cmake -S "$LZ/src" -B "$LZ/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$LZ/build" --target ze_null -j "$(nproc)" >/dev/null
rm -rf "$WORK"
[ -f "$LIB/libze_null.so" ] || { echo "30-level-zero.sh: the build did not produce $LIB/libze_null.so" >&2; exit 1; }
echo "Level Zero: null driver built in $LIB"
