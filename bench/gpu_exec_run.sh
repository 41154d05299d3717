#!/usr/bin/env bash
# gpu_exec_run.sh — one device session for the CUDA executor: its tests, a
# quick run on a 2-layer Mistral-7B-shaped checkpoint, compute-sanitizer, and
# the full Mistral-7B decode benchmark; every log under $OUT (default ./out).
#
# Run from the repository root with a folder holding the binaries built here
# (test_gpu_nvrtc test_gpu_kernels test_gpu_exec kiln kiln_gpu_decode) and,
# for pycode-22m, a shared folder with models/pycode-22m:
#     BIN=.carry/exec/bin SHARED=.carry/exec/shared KILN_COMMIT=$(git rev-parse --short HEAD) \
#         bash bench/gpu_exec_run.sh [steps...]
# steps: env tests small memcheck racecheck bench7b perf7b (default: env tests small)
#   perf7b: decode on the 7B with and without the decode fusions (norm into
#   GEMV, split merge in attention) at batch 1/8/64, and batch 64 at a short
#   prompt (what the KV read at 512 tokens costs)
#   fuse7b: decode at batch 1 and 8 with each decode fusion alone (engines compiled with --passes
#   mask 7 all, 0 none, 1 norm into GEMV, 2 split merge, 4 rope + KV write in
#   attention), batch 64 at 512
#   and 32-token prompts, prefill 2048 and TTFT 128
#   ready7b: make the 7B checkpoint and compile it for sm_90 (for the steps after it)
#   norm7b: RMSNorm folded into the GEMV (pass fold-norm-into-gemv) against the default, batch 1 and 8
#   lt7b: cuBLASLt tuning off / on (reported) at batch 16 and 64
#   prof7b: ncu per-kernel time tables (bench/ncu_steps.py) of prefill 2048, prefill 512 and
#   decode at batch 1, and decode at batch 64
set -u
BIN=${BIN:-build-dev}
SHARED=${SHARED:-../shared}
steps=${*:-env tests small}
OUT=${OUT:-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/kiln-cache}
export KILN_TEST_SOURCE_DIR=$PWD KILN_TEST_SHARED_DIR=$PWD/$SHARED PYTHONUNBUFFERED=1
summary=""
note() { summary+="$1"$'\n'; echo "== $1"; }
# engine7b LOG [compile args]: the random-weight Mistral-7B in /tmp/m7b (made once) compiled afresh
# into /tmp/m7b.kiln (an engine left by an earlier call holds that call's kernels), in the page cache
engine7b() {
  local log=$1 c0; shift
  { [ -f /tmp/m7b/config.json ] || timeout 200 python3 bench/make_checkpoint.py --arch mistral-7b --out /tmp/m7b; } \
    >>"$OUT/$log.log" 2>&1
  c0=$SECONDS
  timeout 150 "$BIN/kiln" compile /tmp/m7b -o /tmp/m7b.kiln "$@" >>"$OUT/$log.log" 2>&1
  note "7B compile rc=$? $((SECONDS - c0)) s"
  sync; cat /tmp/m7b.kiln >/dev/null
}
# The decode fusions are passes (kiln compile --passes; they used to be the KILN_FUSE mask):
#   none  = no decode fusion, rope = decode-attention-rope (the default), norm = + fold-norm-into-gemv,
#   merge = + decode-attention-merge, all = the three
passes_for() {
  local base="fuse-add-rmsnorm,fuse-qkv-rope,fuse-gate-up-swiglu,fuse-linear-residual,pack-weights"
  case $1 in
  none) echo "$base,dce" ;;
  rope) echo "$base,decode-attention-rope,dce" ;;
  norm) echo "$base,decode-attention-rope,fold-norm-into-gemv,dce" ;;
  merge) echo "$base,decode-attention-rope,decode-attention-merge,dce" ;;
  all) echo "$base,decode-attention-rope,decode-attention-merge,fold-norm-into-gemv,dce" ;;
  esac
}
# fuse_runs LOG VARIANT...: decode at batch 1 and 8 with an engine compiled for each variant in turn
fuse_runs() {
  local log=$1 v; shift
  for v in "$@"; do
    echo "passes $v: $(passes_for "$v")" >>"$OUT/$log.log"
    [ -f "/tmp/m7b-$v.kiln" ] || timeout 150 "$BIN/kiln" compile /tmp/m7b -o "/tmp/m7b-$v.kiln" --target sm_90 \
      --passes "$(passes_for "$v")" >>"$OUT/$log.log" 2>&1
    timeout 60 "$BIN/kiln_gpu_decode" "/tmp/m7b-$v.kiln" --batches 1,8 --steps 96 --reps 1 --prefill 0 \
      --ttft 0 --no-graph-compare >>"$OUT/$log.jsonl" 2>>"$OUT/$log.log"
  done
}

for s in $steps; do
  t0=$SECONDS
  case $s in
  env)
    { date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.mem --format=csv;
      nproc; free -g; ldd "$BIN/test_gpu_exec"; echo "commit ${KILN_COMMIT:-unknown}"; } >"$OUT/env.log" 2>&1
    note "env: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1)";;
  tests)
    timeout 60 "$BIN/test_gpu_nvrtc" >"$OUT/test_nvrtc.log" 2>&1; r1=$?
    timeout 150 "$BIN/test_gpu_kernels" >"$OUT/test_kernels.log" 2>&1; r2=$?
    timeout 240 "$BIN/test_gpu_exec" >"$OUT/test_exec.log" 2>&1; r3=$?
    note "tests: nvrtc rc=$r1 ($(tail -1 "$OUT/test_nvrtc.log")), kernels rc=$r2 ($(tail -1 "$OUT/test_kernels.log")), exec rc=$r3 ($(tail -1 "$OUT/test_exec.log")), $((SECONDS - t0)) s"
    grep -E "FAIL|SKIP" "$OUT/test_kernels.log" | head -20
    grep -E "FAIL|SKIP|case|pycode|bf16|rel err|differ" "$OUT/test_exec.log" | head -60;;
  small)
    { timeout 120 python3 bench/make_checkpoint.py --arch mistral-7b --layers 2 --out /tmp/m7b2 &&
      timeout 120 "$BIN/kiln" compile /tmp/m7b2 -o /tmp/m7b2.kiln --target sm_90 &&
      timeout 150 "$BIN/kiln_gpu_decode" /tmp/m7b2.kiln --batches 1,8,64 --steps 32 --reps 3; } >"$OUT/small.jsonl" 2>"$OUT/small.log"
    note "small (2-layer Mistral-7B shapes) rc=$?, $((SECONDS - t0)) s"
    tail -25 "$OUT/small.log";;
  memcheck|racecheck)
    only=test_batched_and_mixed,test_tiny_bf16
    [ "$s" = racecheck ] && only=test_batched_and_mixed
    KILN_TEST_ONLY=$only timeout 200 \
      compute-sanitizer --tool "$s" --error-exitcode 9 "$BIN/test_gpu_exec" >"$OUT/$s.log" 2>&1; r=$?
    note "$s rc=$r ($(grep -E 'ERROR SUMMARY|passed' "$OUT/$s.log" | tr '\n' ' ')), $((SECONDS - t0)) s"
    grep -E "=========|FAIL" "$OUT/$s.log" | head -20;;
  bench7b)
    engine7b bench7b # default targets
    timeout 200 "$BIN/kiln_gpu_decode" /tmp/m7b.kiln --batches 1,8,16,64 --steps 64 --reps 5 >"$OUT/bench7b.jsonl" 2>>"$OUT/bench7b.log"
    note "7B bench rc=$?, $((SECONDS - t0)) s"
    # the same batches with the tensor-core GEMV up to 64 tokens instead of cuBLASLt above 8
    timeout 120 "$BIN/kiln_gpu_decode" /tmp/m7b.kiln --gemv-max-m 64 --batches 16,64 --steps 32 --reps 3 \
      --prefill 0 --ttft 0 --no-graph-compare >"$OUT/bench7b_lt.jsonl" 2>>"$OUT/bench7b.log"
    tail -22 "$OUT/bench7b.log"
    # the same engine through the public API and scheduler (kiln bench)
    timeout 90 "$BIN/kiln" bench /tmp/m7b.kiln --device gpu --batch 1 --input-len 512 --output-len 64 --reps 2 --json \
      >"$OUT/kiln_bench.jsonl" 2>>"$OUT/bench7b.log"
    note "kiln bench --device gpu rc=$?"
    cut -c1-200 "$OUT/kiln_bench.jsonl" | head -12;;
  perf7b)
    engine7b perf7b --target sm_90
    timeout 150 "$BIN/kiln_gpu_decode" /tmp/m7b.kiln --batches 1,8,64 --steps 64 --reps 3 --prefill 2048 --ttft 128 \
      >"$OUT/perf7b.jsonl" 2>>"$OUT/perf7b.log"
    note "7B decode rc=$?, $((SECONDS - t0)) s"
    timeout 60 "$BIN/kiln_gpu_decode" /tmp/m7b.kiln --batches 64 --prompt 32 --steps 32 --reps 1 --prefill 0 --ttft 0 \
      >"$OUT/perf7b_short.jsonl" 2>>"$OUT/perf7b.log"
    note "7B batch 64 prompt 32 rc=$?"
    grep -E "decode|prefill|ttft|load" "$OUT/perf7b.log" | tail -20;;
  fuse7b)
    engine7b fuse7b --target sm_90
    fuse_runs fuse7b all none norm merge rope all
    timeout 90 "$BIN/kiln_gpu_decode" /tmp/m7b.kiln --batches 64 --steps 64 --reps 3 --prefill 2048 --ttft 128 \
      --no-graph-compare >>"$OUT/fuse7b.jsonl" 2>>"$OUT/fuse7b.log"
    timeout 60 "$BIN/kiln_gpu_decode" /tmp/m7b.kiln --batches 64 --prompt 32 --steps 32 --reps 1 --prefill 0 --ttft 0 \
      --no-graph-compare >>"$OUT/fuse7b.jsonl" 2>>"$OUT/fuse7b.log"
    note "7B fusions rc=$?, $((SECONDS - t0)) s"
    grep -E "^passes|decode|prefill|ttft" "$OUT/fuse7b.log" | tail -24;;
  ready7b)
    # the 7B checkpoint and engine (sm_90 only) for the steps below
    engine7b ready7b --target sm_90;;
  norm7b)
    # the RMSNorm folded into the next GEMV at decode (pass fold-norm-into-gemv) against the default,
    # twice each, batch 1 and 8; then prefill 2048 and TTFT 128
    fuse_runs norm7b rope norm rope norm
    timeout 60 "$BIN/kiln_gpu_decode" /tmp/m7b.kiln --batches 1 --steps 8 --reps 3 --prefill 2048 --ttft 128 \
      --no-graph-compare >>"$OUT/norm7b.jsonl" 2>>"$OUT/norm7b.log"
    note "7B norm fold rc=$?, $((SECONDS - t0)) s"
    grep -E "^passes|decode batch|prefill|ttft" "$OUT/norm7b.log" | tail -14;;
  lt7b)
    # cuBLASLt algorithm tuning per decode shape (--lt-tune 1 the heuristic's, 3 timed + reported) at batch 16 and 64
    for t in 1 3; do
      echo "lt-tune $t" >>"$OUT/lt7b.log"
      timeout 150 "$BIN/kiln_gpu_decode" /tmp/m7b.kiln --lt-tune $t --batches 16,64 --steps 64 --reps 1 \
        --prefill 0 --ttft 0 --no-graph-compare >>"$OUT/lt7b.jsonl" 2>>"$OUT/lt7b.log"
    done
    note "7B cuBLASLt tuning rc=$?, $((SECONDS - t0)) s"
    grep -E "lt-tune|decode batch|picked|shapes in|not tuned" "$OUT/lt7b.log" | tail -30;;
  prof7b)
    # per-kernel time of a 2048-token prefill, a 512-token prefill and decode steps at batch 1, then
    # decode at batch 64 (ncu runs kernels one at a time: no launch gaps, no PDL overlap)
    NCU="ncu --clock-control none --metrics gpu__time_duration.sum --csv --page raw"
    timeout 240 $NCU --log-file "$OUT/prof_b1.csv" "$BIN/kiln_gpu_decode" /tmp/m7b.kiln --batches 1 --steps 4 \
      --reps 1 --prefill 2048 --ttft 0 --no-graph-compare >/dev/null 2>"$OUT/prof7b.log"
    note "ncu batch 1 rc=$?, $((SECONDS - t0)) s"
    timeout 200 $NCU --log-file "$OUT/prof_b64.csv" "$BIN/kiln_gpu_decode" /tmp/m7b.kiln --batches 64 --steps 4 \
      --reps 1 --prefill 0 --ttft 0 --no-graph-compare >/dev/null 2>>"$OUT/prof7b.log"
    note "ncu batch 64 rc=$?, $((SECONDS - t0)) s"
    python3 bench/ncu_steps.py "$OUT/prof_b1.csv" --steps 1,2,4 >"$OUT/prof_b1.txt" 2>&1
    python3 bench/ncu_steps.py "$OUT/prof_b64.csv" --steps 9,11 >"$OUT/prof_b64.txt" 2>&1
    head -c 6000 "$OUT/prof_b1.txt"; head -c 3000 "$OUT/prof_b64.txt";;
  esac
done
echo; echo "$summary"
