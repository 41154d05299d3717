#!/usr/bin/env bash
# test.sh — build kiln with AddressSanitizer + UBSan and run every test
# (ctest: unit, golden, CLI tests, linkage; GPU tests skip where there is no
# GPU), then install a Release build into a temporary prefix and build and
# run docs/examples/generate.c against it with the commands of docs/c-api.md
# (scripts/check-install.sh), then run each libFuzzer target for a bounded
# time (KILN_FUZZ_SECONDS, default 20, through scripts/fuzz.sh) when clang is
# available.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKILN_SANITIZE=ON >/dev/null
cmake --build build-asan -j"$jobs"
ctest --test-dir build-asan --output-on-failure -j"$jobs"

# The installed library, header, pkg-config file and CMake package, used out
# of the tree as docs/c-api.md says (a Release build, no sanitizers).
(unset ASAN_OPTIONS UBSAN_OPTIONS; scripts/check-install.sh)

if command -v clang >/dev/null 2>&1; then
    # every target from its seeds for a short while, in a throw-away work
    # corpus (scripts/fuzz.sh --minutes N runs the long campaigns)
    work=$(mktemp -d)
    scripts/fuzz.sh --seconds "${KILN_FUZZ_SECONDS:-20}" --work "$work" --jobs "$jobs" || {
        rm -rf "$work"
        echo "a fuzz target failed (see above; the input is in build-fuzz/crashes/)" >&2
        exit 1
    }
    rm -rf "$work"
else
    echo "clang not found: fuzz targets skipped"
fi
