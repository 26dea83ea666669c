# 30-level-zero.sh (sourced) — tell the Level Zero tests where scripts/setup.d/30-level-zero.sh built the loader's
# null driver (<repo>/.level-zero/build/lib). The tests add it to LD_LIBRARY_PATH and set ZE_ENABLE_NULL_DRIVER=1 for
# their own child processes only: nothing here changes how Level Zero behaves for anything else. An existing value
# is kept.
_rserve_repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export RSERVE_ZE_NULL_DRIVER_DIR="${RSERVE_ZE_NULL_DRIVER_DIR:-$_rserve_repo/.level-zero/build/lib}"
unset _rserve_repo
