#!/usr/bin/env bash
# test.sh — build kiln with AddressSanitizer + UBSan and run every test
# (ctest: unit, golden, CLI tests, linkage; GPU tests skip where there is no
# GPU), then install a Release build into a temporary prefix and build and
# run docs/examples/generate.c against it with the commands of docs/c-api.md
# (scripts/check-install.sh), then run each libFuzzer target for a bounded
# time (KILN_FUZZ_SECONDS, default 30) when clang is available.
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
    CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DKILN_FUZZ=ON -DKILN_SANITIZE=ON \
        -DKILN_TESTS=OFF -DKILN_CUDA=OFF >/dev/null
    cmake --build build-fuzz -j"$jobs"
    secs=${KILN_FUZZ_SECONDS:-30}
    for f in build-fuzz/fuzz_*; do
        [ -x "$f" ] || continue
        name=$(basename "$f")
        work=$(mktemp -d)
        seeds="fuzz/corpus/${name#fuzz_}"
        [ -d "$seeds" ] && cp -r "$seeds"/. "$work"/
        echo "fuzzing $name for ${secs}s"
        "$f" -max_total_time="$secs" -print_final_stats=0 "$work" >"$work.log" 2>&1 || {
            tail -50 "$work.log"
            echo "fuzz target $name failed" >&2
            exit 1
        }
        rm -rf "$work" "$work.log"
    done
else
    echo "clang not found: fuzz targets skipped"
fi
