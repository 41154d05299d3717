# gpu_lib.sh — what the device scripts (bench/gpu_*_check.sh) share; sourced, not run.
# The sourcing script sets BIN (its carried binaries) and OUT before sourcing it.
# It makes $OUT (and $W), puts the carried libraries and CUDA on LD_LIBRARY_PATH, points the tests at
# this source tree, empties $OUT/summary.txt (S), writes $OUT/env.txt and starts the budget clock.
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/$BIN/extra:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/kiln-cache} KILN_TEST_SOURCE_DIR=$PWD
S=$OUT/summary.txt
: >"$S"
{ date -u; nvidia-smi -L; } >"$OUT/env.txt" 2>&1
# transformers offline and quiet; the sourcing script's $W (a work folder) made; its time budget
# ($BUDGET seconds, 600 unless set) counted from here: `left` prints the seconds that remain
export HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error PYTHONUNBUFFERED=1
[ -n "${W:-}" ] && mkdir -p "$W"
t0=$SECONDS
left() { echo $((${BUDGET:-600} - (SECONDS - t0))); }

# part NAME SECONDS command...: run it under a timeout into $OUT/NAME.log, add one line (exit status,
# seconds, the log's last passed/failed count) to the summary; returns the command's status
part() {
    local name=$1 secs=$2 t0=$SECONDS
    shift 2
    timeout "$secs" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    echo "$name: rc $rc, $((SECONDS - t0)) s, $(grep -E 'passed|failed' "$OUT/$name.log" | tail -1)" | tee -a "$S"
    return $rc
}

# b1 NAME SECONDS ENGINE ARGS...: `$K bench ENGINE --json ARGS` as part NAME (skipped when the engine is
# missing or the budget too short), its JSON lines into $OUT/bench.jsonl with "run": NAME
b1() { # NAME SECONDS ENGINE ARGS...: one kiln bench into $OUT/bench.jsonl
    local n=$1 s=$2 e=$3
    shift 3
    [ -f "$e" ] && [ "$(left)" -gt $((s + 10)) ] || { echo "$n: skipped" >>"$S"; return; }
    part "$n" "$s" "$K" bench "$e" --json "$@"
    grep '^{' "$OUT/$n.log" | sed "s|^{|{\"run\": \"$n\", |" >>"$OUT/bench.jsonl"
}

# metric_at NAME METRIC BATCH: the value of METRIC at batch BATCH in run NAME's JSON lines ($OUT/NAME.log), "-" when none
metric_at() {
    python3 -c 'import json,sys
v=[d["value"] for d in map(json.loads,(l for l in open(sys.argv[1]) if l.startswith("{")))
   if d.get("metric")==sys.argv[2] and d.get("batch")==int(sys.argv[3])]
print(v[-1] if v else "-")' "$OUT/$1.log" "$2" "$3" 2>/dev/null || echo -
}
