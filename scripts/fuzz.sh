#!/usr/bin/env bash
# fuzz.sh — run every libFuzzer target (fuzz/fuzz_<name>.c) for a while and
# report what each did. Builds build-fuzz (clang, ASan + UBSan, no CUDA: what
# CI fuzzes) when it is missing or stale, starts each target from its seed
# corpus fuzz/corpus/<name>/ plus a work corpus that is kept between runs
# (build-fuzz/work/<name>/, new inputs land there) and its dictionary
# fuzz/<name>.dict when there is one, and writes crashes to
# build-fuzz/crashes/. Targets run one after another.
#
# usage: scripts/fuzz.sh [--minutes N | --seconds N] [--only NAME[,NAME...]]
#                        [--work DIR] [--jobs N]
#   --minutes N / --seconds N   time per target (default 1 minute)
#   --only                      these targets only (names without fuzz_)
#   --work DIR                  keep the work corpora under DIR instead
#   --jobs N                    build jobs (default: nproc)
# Prints one line per target: seconds, executions, executions/s, corpus
# size, and "ok" or where the crash input is; exits 1 if any target failed.
# scripts/test.sh calls it with a few seconds per target; docs/fuzzing.md
# records the long campaigns.
set -uo pipefail
cd "$(dirname "$0")/.."

secs=60
only=""
work="build-fuzz/work"
jobs=$(nproc)
while [ $# -gt 0 ]; do
    case $1 in
    --minutes) secs=$(($2 * 60)); shift 2 ;;
    --seconds) secs=$2; shift 2 ;;
    --only) only=",$2,"; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    -h | --help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "fuzz.sh: error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
case $secs in '' | *[!0-9]*) echo "fuzz.sh: error: the time must be a whole number" >&2; exit 2 ;; esac
if ! command -v clang >/dev/null 2>&1; then
    echo "fuzz.sh: error: clang not found (libFuzzer needs it)" >&2
    exit 1
fi

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DKILN_FUZZ=ON -DKILN_SANITIZE=ON \
    -DKILN_TESTS=OFF -DKILN_CUDA=OFF >/dev/null || exit 1
cmake --build build-fuzz -j"$jobs" >/dev/null || { cmake --build build-fuzz -j1 2>&1 | tail -30; exit 1; }

mkdir -p "$work" build-fuzz/crashes
failed=0
printf '%-20s %8s %12s %10s %8s  %s\n' target seconds executions "exec/s" corpus result
for src in fuzz/fuzz_*.c; do
    name=$(basename "$src" .c)
    name=${name#fuzz_}
    [ -z "$only" ] || [[ $only == *",$name,"* ]] || continue
    exe="build-fuzz/fuzz_$name"
    [ -x "$exe" ] || { echo "fuzz.sh: error: $exe was not built" >&2; failed=1; continue; }
    mkdir -p "$work/$name"
    seeds="fuzz/corpus/$name"
    [ -d "$seeds" ] || seeds=""
    dict=""
    [ -f "fuzz/$name.dict" ] && dict="-dict=fuzz/$name.dict"
    log="build-fuzz/fuzz_$name.log"
    t0=$(date +%s)
    "$exe" -max_total_time="$secs" -print_final_stats=1 -artifact_prefix="build-fuzz/crashes/$name-" $dict \
        "$work/$name" $seeds >"$log" 2>&1
    rc=$?
    dt=$(($(date +%s) - t0))
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    corpus=$(find "$work/$name" -type f | wc -l)
    if [ $rc -eq 0 ]; then
        result=ok
    else
        failed=1
        crash=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
        result="FAILED (exit $rc): ${crash:-see $log}"
        tail -40 "$log" >&2
    fi
    printf '%-20s %8s %12s %10s %8s  %s\n' "$name" "$dt" "${execs:-?}" "${rate:-?}" "$corpus" "$result"
done
exit $failed
