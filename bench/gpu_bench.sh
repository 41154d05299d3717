#!/usr/bin/env bash
# gpu_bench.sh — the whole GPU benchmark in one device call (10-minute limit):
# make a random-weight checkpoint of real shapes (into /tmp, never the repo),
# compile it with kiln, run kiln bench, run the peers, and leave everything
# under $OUT. The parts share one budget (--budget, default 480 s = 8 min);
# run_peers.py gets what the checkpoint leaves and skips late steps
# (recorded as "skipped") rather than overrun.
#
# Run from the repository root:
#   OUT=out KILN_COMMIT=$(git rev-parse --short HEAD) bash bench/gpu_bench.sh [options]
# options:
#   --arch A            mistral-7b (default), llama-3.1-8b, tiny, tiny-llama3
#   --layers N          fewer layers (fast runs; targets then do not apply)
#   --kiln BIN          the kiln binary (default build/kiln)
#   --build DIR         first configure and build kiln in DIR (Release, no tests)
#                       and use DIR/kiln
#   --peers DIR         folder with hf_baselines.py and gptfast_decode.py
#                       (default .carry/peers, else ../shared/peers, if present)
#   --no-peers          kiln only
#   --no-kiln           peers only
#   --gptfast-batches L default 1,8 (each costs a torch.compile, ~1 min)
#   --kiln-runs L       BATCH:INPUT:OUTPUT list (default: run_peers.py's)
#   --bench-args S      extra arguments for every kiln bench (e.g. "--kv-memory 0.5")
#   --compile-args S    extra arguments for kiln compile (e.g. "--target sm_90")
#   --budget S          seconds for everything (default 480)
#   --fresh             remake the checkpoint even if /tmp holds a matching one
#   --dry-run           checkpoint on CPU is fine; print the kiln commands and
#                       check the peer modules instead of measuring (no GPU)
# $OUT gets (at most 6 files, as the device call brings back 8):
#   results.jsonl  one JSON line per measurement (+ a meta line first)
#   table.md       compare.py's markdown for docs/benchmarks.md
#   bench.log      everything the steps printed
#   timeline.log   start/end time and exit code of each part
#   env.log        GPU, driver, versions, disk and memory
#   build.log      with --build
set -u
ARCH=mistral-7b LAYERS="" KILN=build/kiln BUILD="" PEERS="" NO_PEERS=0 NO_KILN=0 FRESH=0 DRY=0
GF_BATCHES=1,8 KILN_RUNS="" BUDGET=480 BENCH_ARGS="" COMPILE_ARGS=""
usage() { sed -n '2,/^set -u/p' "$0" | sed 's/^# \{0,1\}//;$d'; exit "${1:-2}"; }
while [ $# -gt 0 ]; do
  case $1 in
  --arch) ARCH=$2; shift;;
  --layers) LAYERS=$2; shift;;
  --kiln) KILN=$2; shift;;
  --build) BUILD=$2; shift;;
  --peers) PEERS=$2; shift;;
  --no-peers) NO_PEERS=1;;
  --no-kiln) NO_KILN=1;;
  --gptfast-batches) GF_BATCHES=$2; shift;;
  --kiln-runs) KILN_RUNS=$2; shift;;
  --bench-args) BENCH_ARGS=$2; shift;;
  --compile-args) COMPILE_ARGS=$2; shift;;
  --budget) BUDGET=$2; shift;;
  --fresh) FRESH=1;;
  --dry-run) DRY=1;;
  -h|--help) usage 0;;
  *) echo "gpu_bench.sh: unknown option '$1' (see --help)" >&2; exit 2;;
  esac
  shift
done
case $BUDGET in ''|*[!0-9]*) echo "gpu_bench.sh: --budget '$BUDGET': expected whole seconds" >&2; exit 2;; esac
if [ -n "$LAYERS" ]; then
  case $LAYERS in ''|*[!0-9]*) echo "gpu_bench.sh: --layers '$LAYERS': expected a positive integer" >&2; exit 2;; esac
fi

OUT=${OUT:-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
export KILN_COMMIT=${KILN_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
PY=${PYTHON:-python3}
START=$SECONDS
TL=$OUT/timeline.log LOG=$OUT/bench.log
: >"$TL"; : >"$LOG"
left() { echo $((BUDGET - (SECONDS - START))); }
# part NAME LIMIT CMD...: run CMD under `timeout LIMIT`, output to bench.log
# (and the terminal), start/end/rc to timeline.log.
part() {
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  echo "$(date -u +%FT%TZ) start $name (limit ${limit}s, $(left)s of budget left)" | tee -a "$TL"
  echo "== $name: $*" >>"$LOG"
  timeout "$limit" "$@" 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  echo "$(date -u +%FT%TZ) end   $name rc=$rc $((SECONDS - t0))s" | tee -a "$TL"
  return "$rc"
}

# ---- environment
{
  date -u; echo "commit $KILN_COMMIT"; uname -a
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1
  "$PY" -c 'import sys, torch, transformers, safetensors; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__, "safetensors", safetensors.__version__, "gpu", torch.cuda.get_device_name() if torch.cuda.is_available() else None)' 2>&1
  nproc; free -g; df -h /tmp
} >"$OUT/env.log" 2>&1
echo "$(date -u +%FT%TZ) gpu_bench.sh arch=$ARCH layers=${LAYERS:-all} budget=${BUDGET}s commit=$KILN_COMMIT" | tee -a "$TL"

# ---- build (optional)
if [ -n "$BUILD" ] && [ "$NO_KILN" = 0 ]; then
  t0=$SECONDS
  echo "$(date -u +%FT%TZ) start build ($BUILD)" | tee -a "$TL"
  { timeout 60 cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DKILN_TESTS=OFF &&
    timeout 200 cmake --build "$BUILD" -j"$(nproc)" --target kiln; } >"$OUT/build.log" 2>&1
  rc=$?
  echo "$(date -u +%FT%TZ) end   build rc=$rc $((SECONDS - t0))s" | tee -a "$TL"
  [ $rc = 0 ] || tail -30 "$OUT/build.log"
  KILN=$BUILD/kiln
fi

# ---- checkpoint (reused when /tmp already holds the same arch/layers/seed)
CK=/tmp/kiln-bench/$ARCH${LAYERS:+-${LAYERS}l}
want_layers=${LAYERS:-}
reuse=0
if [ "$FRESH" = 0 ] && [ -f "$CK/random_weights.json" ] && [ -f "$CK/config.json" ]; then
  reuse=$("$PY" - "$CK" "$ARCH" "$want_layers" <<'EOF'
import json, os, sys
ck, arch, layers = sys.argv[1:]
r = json.load(open(os.path.join(ck, "random_weights.json")))
ok = r.get("arch") == arch and r.get("seed") == 0 and (not layers or r.get("layers") == int(layers))
if ok and not layers:
    ok = r.get("layers") == json.load(open(os.path.join(ck, "config.json"))).get("num_hidden_layers") and \
         r.get("layers") == {"mistral-7b": 32, "llama-3.1-8b": 32}.get(arch, r.get("layers"))
idx = os.path.join(ck, "model.safetensors.index.json")
if ok and os.path.exists(idx):
    ok = all(os.path.exists(os.path.join(ck, f)) for f in set(json.load(open(idx))["weight_map"].values()))
elif ok:
    ok = os.path.exists(os.path.join(ck, "model.safetensors"))
print(1 if ok else 0)
EOF
)
fi
if [ "$reuse" = 1 ]; then
  echo "$(date -u +%FT%TZ) reuse checkpoint $CK" | tee -a "$TL"
else
  # the disk is 64 GiB: drop other checkpoints and engines left by earlier calls
  mkdir -p /tmp/kiln-bench
  for f in /tmp/kiln-bench/*; do [ -e "$f" ] && [ "$f" != "$CK" ] && rm -rf "$f"; done
  part checkpoint 150 "$PY" bench/make_checkpoint.py --arch "$ARCH" ${LAYERS:+--layers "$LAYERS"} --seed 0 --out "$CK" ||
    { echo "gpu_bench.sh: no checkpoint, nothing to measure" | tee -a "$TL"; exit 1; }
fi

# ---- kiln and peers
impls=""
[ "$NO_KILN" = 0 ] && impls=kiln
if [ "$NO_PEERS" = 0 ]; then
  if [ -z "$PEERS" ]; then
    for d in .carry/peers ../shared/peers; do [ -f "$d/hf_baselines.py" ] && { PEERS=$d; break; }; done
  fi
  if [ -n "$PEERS" ]; then
    impls=${impls:+$impls,}hf,gptfast
  else
    echo "gpu_bench.sh: no peers folder (--peers DIR, .carry/peers or ../shared/peers): kiln only" | tee -a "$TL"
  fi
fi
[ -n "$impls" ] || { echo "gpu_bench.sh: nothing to run (--no-kiln and no peers)" >&2; exit 2; }
reserve=25   # for compare.py and the copy back
deadline=$(( $(left) - reserve ))
args=(--ckpt "$CK" --kiln "$KILN" --engine "/tmp/kiln-bench/$(basename "$CK").kiln" --impls "$impls"
      --gptfast-batches "$GF_BATCHES" --deadline "$deadline" --jsonl "$OUT/results.jsonl" --commit "$KILN_COMMIT")
[ -n "$PEERS" ] && args+=(--peers "$PEERS")
[ -n "$KILN_RUNS" ] && args+=(--kiln-runs "$KILN_RUNS")
[ -n "$BENCH_ARGS" ] && args+=(--bench-args "$BENCH_ARGS")
[ -n "$COMPILE_ARGS" ] && args+=(--compile-args "$COMPILE_ARGS")
[ "$DRY" = 1 ] && args+=(--dry-run)
: >"$OUT/results.jsonl"
# run_peers.py: JSON lines on stdout (also in results.jsonl), log on stderr.
part measure $((deadline + 15)) "$PY" bench/run_peers.py "${args[@]}"

# ---- table
if [ "$DRY" = 0 ]; then
  timeout 30 "$PY" bench/compare.py "$OUT/results.jsonl" >"$OUT/table.md" 2>>"$LOG" && cat "$OUT/table.md"
fi
echo "$(date -u +%FT%TZ) gpu_bench.sh done in $((SECONDS - START))s" | tee -a "$TL"
echo; cat "$TL"
