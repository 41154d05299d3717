#!/usr/bin/env bash
# gpu_memory_run.sh — one device session for issue 10 (memory bounded for any
# batch) on a Llama-3.1-8B-shaped engine: every log, JSON line and the
# summary under $OUT (default ./out). About 5–7 minutes on one H200; each
# step has its own timeout and the script skips what is left past BUDGET_S.
#
# Run from the repository root with the binaries built on the build machine
# (kiln test_gpu_kernels test_gpu_exec test_gpu_nvrtc, Release, with CUDA):
#     BIN=.carry/memory/bin KILN_COMMIT=$(git rev-parse --short HEAD) bash bench/gpu_memory_run.sh [steps...]
# steps (default: all of them, in this order):
#   ready   make the checkpoint (bench/make_checkpoint.py --arch llama-3.1-8b, all 32 layers,
#           16 GB, ~20 s) and compile it for sm_90 only; the GPU tests run meanwhile
#   tests   (a) test_gpu_kernels (swiglu at 70,001 rows, the grid limits) and test_gpu_exec
#   long    (b) one 100,000-token prompt: kiln bench --batch 1 --input-len 100000 --output-len 8
#           (13 prefill steps of the 8,192-token budget)
#   big     (c) kiln bench --batch 512 and 1024 at 128/128 (grid y was 65,536 at 512 before)
#   queue   (d) 1,000 requests over a 2 GiB KV pool, 256 slots: completes, e2e + percentiles
#   mem     (e) --batch 256 --input-len 2048 --kv-memory 4G: peak device memory (kiln's count and
#           nvidia-smi's, sampled every 100 ms) against weights + 4 GiB + the step scratch
#   decode  (f) decode regression: kiln bench at batch 1, 8, 64 (128/128)
#   chunk   the cost of chunking: 64 prompts of 2048 tokens, output 1, in steps of 8,192
#           tokens (the default) and of 131,072 (the whole batch in one step, the old default)
# $OUT/summary.txt holds one line per step and a CHECK line per claim (PASS/FAIL).
set -u
BIN=${BIN:-build-dev}
OUT=${OUT:-out}
BUDGET_S=${BUDGET_S:-500}
CKPT=${CKPT:-/tmp/llama8b}
ENG=${ENG:-/tmp/llama8b.kiln}
steps=${*:-ready tests long big queue mem decode chunk}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/kiln-cache}
export KILN_TEST_SOURCE_DIR=$PWD PYTHONUNBUFFERED=1
[ -n "${SHARED:-}" ] && export KILN_TEST_SHARED_DIR=$PWD/$SHARED
summary=""
note() { summary+="$1"$'\n'; echo "== $1"; echo "$1" >>"$OUT/summary.txt"; }
: >"$OUT/summary.txt"
tests_pid=""

# bench NAME TIMEOUT ARGS...: kiln bench on the engine, JSON lines to NAME.jsonl, stderr to NAME.log
bench() {
  local name=$1 t=$2 c0=$SECONDS rc; shift 2
  timeout "$t" "$BIN/kiln" bench "$ENG" --device gpu --json "$@" >>"$OUT/$name.jsonl" 2>>"$OUT/$name.log"
  rc=$?
  note "$name: kiln bench $* -> rc=$rc in $((SECONDS - c0)) s"
  return $rc
}

# check NAME PYTHON: evaluate a claim over NAME.jsonl (rows: list of dicts; m(metric, batch)), PASS/FAIL
check() {
  local name=$1 expr=$2 res
  res=$(python3 - "$OUT/$name.jsonl" "$expr" <<'PY' 2>&1
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
def m(metric, batch=None, **kw):
    v = [r["value"] for r in rows if r.get("metric") == metric and (batch is None or r["batch"] == batch)
         and all(r.get(k) == x for k, x in kw.items())]
    if not v: raise KeyError(f"{metric} at batch {batch} {kw} missing")
    return v[-1]
ok = eval(sys.argv[2])
print("PASS" if ok else "FAIL")
PY
)
  note "CHECK $name: $expr -> $(echo "$res" | tail -1)"
}

start_tests() {
  { timeout 150 "$BIN/test_gpu_kernels" >"$OUT/test_kernels.log" 2>&1; echo "test_gpu_kernels rc=$?" >"$OUT/tests.rc"
    timeout 240 "$BIN/test_gpu_exec" >"$OUT/test_exec.log" 2>&1; echo "test_gpu_exec rc=$?" >>"$OUT/tests.rc"; } &
  tests_pid=$!
}

for s in $steps; do
  if [ "$SECONDS" -gt "$BUDGET_S" ]; then note "$s: skipped (past the ${BUDGET_S} s budget at $SECONDS s)"; continue; fi
  t0=$SECONDS
  case $s in
  ready)
    { date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv; } >"$OUT/env.log" 2>&1
    case " $steps " in *" tests "*) start_tests ;; esac
    if [ ! -f "$CKPT/config.json" ]; then
      timeout 240 python3 bench/make_checkpoint.py --arch llama-3.1-8b --out "$CKPT" >"$OUT/checkpoint.json" \
        2>"$OUT/checkpoint.log"
      note "checkpoint rc=$? $((SECONDS - t0)) s: $(tail -1 "$OUT/checkpoint.json")"
    fi
    c0=$SECONDS
    timeout 200 "$BIN/kiln" compile "$CKPT" -o "$ENG" --target sm_90 >"$OUT/compile.log" 2>&1
    note "compile rc=$? $((SECONDS - c0)) s"
    sync; cat "$ENG" >/dev/null
    ;;
  tests)
    [ -z "$tests_pid" ] && start_tests
    wait "$tests_pid"
    note "(a) $(tr '\n' ' ' <"$OUT/tests.rc") kernels: $(tail -1 "$OUT/test_kernels.log"); exec: $(tail -1 "$OUT/test_exec.log")"
    ;;
  long)
    bench long 200 --batch 1 --input-len 100000 --output-len 8 --warmup 0 --reps 1
    check long 'm("e2e_output_tokens_per_s", 1) > 0 and m("max_step_tokens", 1) == 8192'
    ;;
  big)
    bench big 150 --batch 512 --input-len 128 --output-len 128 --warmup 1 --reps 2
    bench big 180 --batch 1024 --input-len 128 --output-len 128 --warmup 1 --reps 2
    check big 'm("e2e_output_tokens_per_s", 512) > 0 and m("e2e_output_tokens_per_s", 1024) > 0'
    ;;
  queue)
    bench queue 200 --batch 256 --requests 1000 --input-len 128 --output-len 128 --kv-memory 2G --warmup 1 --reps 1
    check queue 'm("e2e_output_tokens_per_s", 256) > 0 and m("ttft_p50_ms", 256) <= m("ttft_p90_ms", 256) <= m("ttft_p99_ms", 256) and m("tpot_p50_ms", 256) <= m("tpot_p90_ms", 256) <= m("tpot_p99_ms", 256) and m("kv_memory", 256) <= 2048 and m("max_running", 256) <= 64'
    ;;
  mem)
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 >"$OUT/mem_smi.txt" 2>/dev/null &
    smi=$!
    bench mem 240 --batch 256 --input-len 2048 --output-len 128 --kv-memory 4G --warmup 0 --reps 1
    kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null
    note "(e) nvidia-smi peak memory.used: $(sort -n "$OUT/mem_smi.txt" | tail -1) MiB (was 79.5 GB before the step budget)"
    check mem 'm("peak_device_memory", 256) <= m("weights_memory", 256) + m("kv_memory", 256) + m("scratch_memory", 256) and m("kv_memory", 256) <= 4096 and m("scratch_memory", 256) <= 3072'
    ;;
  decode)
    for b in 1 8 64; do bench decode 120 --batch $b --input-len 128 --output-len 128 --warmup 1 --reps 3; done
    check decode 'm("decode_tokens_per_s", 1) > 0 and m("decode_tokens_per_s", 8) > 0 and m("decode_tokens_per_s", 64) > 0'
    ;;
  chunk)
    bench chunk 150 --batch 64 --input-len 2048 --output-len 1 --warmup 1 --reps 2
    bench chunk 150 --batch 64 --input-len 2048 --output-len 1 --warmup 1 --reps 2 --max-step-tokens 131072
    ;;
  *) note "unknown step $s" ;;
  esac
  echo "step $s: $((SECONDS - t0)) s" >>"$OUT/steps.log"
done
[ -n "$tests_pid" ] && wait "$tests_pid" 2>/dev/null
note "total $SECONDS s"
# the headline numbers, one line each
python3 - "$OUT" <<'PY' >"$OUT/headline.txt" 2>&1
import glob, json, os, sys
keep = {"prefill_ms", "ttft_ms", "decode_tokens_per_s", "decode_ms_per_token", "e2e_s", "e2e_output_tokens_per_s",
        "e2e_total_tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "peak_device_memory",
        "weights_memory", "kv_memory", "scratch_memory", "max_step_tokens", "max_running", "load_ms"}
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.jsonl"))):
    for l in open(f):
        if not l.startswith("{"): continue
        r = json.loads(l)
        if r["metric"] in keep:
            print(f'{os.path.basename(f)[:-6]:7s} b={r["batch"]:<5d} req={r["requests"]:<5d} in={r["input_len"]:<6d} '
                  f'out={r["output_len"]:<4d} {r["metric"]:24s} {r["value"]:.4g} {r["unit"]}')
PY
echo "$summary"
cat "$OUT/headline.txt"
