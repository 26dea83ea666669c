#!/usr/bin/env bash
# test.sh — the whole test suite: Rust unit, property and golden tests (`cargo test`), then the end-to-end suite
# that starts the real binary and talks to it with the official openai Python client.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
bash scripts/setup-tests.sh
# Environment the device backends' tests need (e.g. OCL_ICD_VENDORS for Intel's OpenCL CPU runtime, the cargo
# features the binary is built with): one file each.
for e in scripts/env.d/*.sh; do
  [ -e "$e" ] || continue
  # shellcheck disable=SC1090
  source "$e"
done
bash scripts/setup.sh
# One build from scratch: incremental-compilation state would only add ~2 GB of disk and its write time.
export CARGO_INCREMENTAL=0
export RSERVE_TEST_MODELS="${RSERVE_TEST_MODELS:-$REPO/models/x}"
# Formatting (rustfmt.toml) and lints, with the same features as the tests.
cargo fmt --all --check
cargo clippy --locked --workspace --all-targets ${RSERVE_CARGO_FEATURES:+--features "$RSERVE_CARGO_FEATURES"} -- -D warnings
# The committed Level Zero bindings equal a fresh bindgen run on the installed headers.
cargo test --locked -p level-zero-sys --features regenerate --test bindings
cargo test --locked --workspace ${RSERVE_CARGO_FEATURES:+--features "$RSERVE_CARGO_FEATURES"}
export RSERVE_BIN="$REPO/target/debug/rserve"
.venv/bin/python -m pytest -q tests/python
# The device legs: the suites whose outcome depends on the device or the runner (the model's numbers, the sampler,
# grammar masks, prompt log-probs, batching and chunking, pooling, faults and aborts in a step, start-up), on the
# SPIR-V kernels (--device opencl, Intel's OpenCL CPU runtime) when it is installed, and against a tensor-parallel
# server. The HTTP front, the API shapes, parsers and the command line are the same code on every device and run
# once, above.
DEVICE_SUITES=()
for s in api sampling structured prompt_logprobs concurrency partial_prefills pooling model_shelf faults disconnect \
  lifecycle; do
  DEVICE_SUITES+=("tests/python/test_$s.py")
done
if [ -n "${OCL_ICD_VENDORS:-}" ]; then
  RSERVE_E2E_ARGS="--device opencl" .venv/bin/python -m pytest -q "${DEVICE_SUITES[@]}"
fi
# Rank 0 serves, three MPI ranks hold a third of the heads each.
if [ "${RSERVE_MPI:-0}" = 1 ]; then
  RSERVE_E2E_LAUNCH="mpirun --allow-run-as-root --oversubscribe -n 3 -x RAYON_NUM_THREADS=1 --mca mpi_yield_when_idle 1" \
    RSERVE_E2E_ARGS="-tp 3" .venv/bin/python -m pytest -q "${DEVICE_SUITES[@]}"
fi
