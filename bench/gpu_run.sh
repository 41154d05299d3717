#!/usr/bin/env bash
# gpu_run.sh — one device session of the kernel lab: environment, the GPU
# tests, the kernel bench, and compute-sanitizer, each with a time limit,
# every log under $OUT (default ./out). Run from the repository root with a
# build folder holding test_gpu_nvrtc, test_gpu_kernels and kiln_gpu_bench:
#     KILN_COMMIT=$(git rev-parse --short HEAD) bash bench/gpu_run.sh [BUILD] [steps...]
# steps: env tests bench memcheck racecheck (default: env tests bench memcheck)
set -u
B=${1:-build-gpu}
shift || true
steps=${*:-env tests bench memcheck}
OUT=${OUT:-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/kiln-cache}
summary=""
note() { summary+="$1"$'\n'; echo "== $1"; }

for s in $steps; do
  case $s in
  env)
    { date -u; nvidia-smi; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv;
      ldd "$B/test_gpu_kernels" "$B/kiln_gpu_bench"; echo "commit ${KILN_COMMIT:-unknown}"; } >"$OUT/env.log" 2>&1
    note "env: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1)";;
  tests)
    t0=$SECONDS
    timeout 60 "$B/test_gpu_nvrtc" >"$OUT/test_nvrtc.log" 2>&1; r1=$?
    timeout 150 "$B/test_gpu_kernels" >"$OUT/test_kernels.log" 2>&1; r2=$?
    note "tests: nvrtc rc=$r1 ($(tail -1 "$OUT/test_nvrtc.log")), kernels rc=$r2 ($(tail -1 "$OUT/test_kernels.log")), $((SECONDS - t0)) s"
    grep -E "FAIL|SKIP" "$OUT/test_kernels.log" | head -30;;
  bench)
    t0=$SECONDS
    timeout 180 "$B/kiln_gpu_bench" >"$OUT/bench.jsonl" 2>"$OUT/bench.log"; r=$?
    note "bench rc=$r, $((SECONDS - t0)) s"
    cat "$OUT/bench.log";;
  memcheck|racecheck)
    t0=$SECONDS
    timeout 150 compute-sanitizer --tool "$s" --error-exitcode 9 "$B/test_gpu_kernels" >"$OUT/$s.log" 2>&1; r=$?
    note "$s rc=$r ($(grep -E 'ERROR SUMMARY|passed' "$OUT/$s.log" | tr '\n' ' ')), $((SECONDS - t0)) s";;
  esac
done
echo; echo "$summary"
