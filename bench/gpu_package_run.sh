#!/usr/bin/env bash
# gpu_package_run.sh — load time of a packaged executable against its engine
# file (issue 11): the random-weight Mistral-7B compiled for sm_90, attached
# to an executable template (appended payload, as a 14.5 GB engine always
# is), then run alternately from the file and from the executable. Target:
# the executable's median load within 5% of the file's, the same ids.
#
# Run from the repository root with a folder holding, built on the build
# machine, `kiln` (any build: KILN_LLVM=OFF is fine, it only attaches) and
# `kiln-template` (`kiln package --template -o kiln-template` by a kiln with
# LLVM, Release):
#     BIN=.carry/pkg bash bench/gpu_package_run.sh
# Env: OUT (default out), DEVICE (default gpu), REPS (default 5), CKPT (a
# checkpoint folder to use instead of making the 7B), TARGET (default sm_90).
set -u
BIN=${BIN:-.carry/pkg}
OUT=${OUT:-out}
DEVICE=${DEVICE:-gpu}
REPS=${REPS:-5}
TARGET=${TARGET:-sm_90}
WORK=${WORK:-/tmp/kiln-pkg}
mkdir -p "$OUT" "$WORK"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/kiln-cache}
K=$BIN/kiln
if [ -z "${CKPT:-}" ]; then
  CKPT=$WORK/m7b
  [ -f "$CKPT/config.json" ] || timeout 300 python3 bench/make_checkpoint.py --arch mistral-7b --out "$CKPT" \
    >"$OUT/package_ckpt.log" 2>&1 || { echo "FAIL: make_checkpoint (see $OUT/package_ckpt.log)"; exit 1; }
fi
t0=$SECONDS
timeout 300 "$K" compile "$CKPT" -o "$WORK/e.kiln" --target "$TARGET" 2>"$OUT/package_compile.log" ||
  { echo "FAIL: compile (see $OUT/package_compile.log)"; exit 1; }
echo "compile: $((SECONDS - t0)) s"
[ "$CKPT" = "$WORK/m7b" ] && rm -rf "$CKPT" # disk: checkpoint + engine + executable would be 3 x 14.5 GB
t0=$SECONDS
"$K" package "$WORK/e.kiln" -o "$WORK/e-exe" --from-template "$BIN/kiln-template" 2>&1 || { echo "FAIL: package"; exit 1; }
echo "package (attach): $((SECONDS - t0)) s"
"$WORK/e-exe" --version
sync
cat "$WORK/e.kiln" "$WORK/e-exe" >/dev/null # both in the page cache: the same starting point
: >"$OUT/package_load.jsonl"
for i in $(seq "$REPS"); do
  for who in file exe; do
    if [ $who = file ]; then cmd=("$K" run "$WORK/e.kiln"); else cmd=("$WORK/e-exe" run); fi
    "${cmd[@]}" --prompt-ids 1 --max-tokens 8 --temperature 0 --device "$DEVICE" --json 2>>"$OUT/package_run.log" |
      python3 -c 'import json, sys; d = json.load(sys.stdin); d["who"] = sys.argv[1]; print(json.dumps(d))' $who \
      >>"$OUT/package_load.jsonl" || echo "FAIL: $who run $i (see $OUT/package_run.log)"
  done
done
python3 - "$OUT/package_load.jsonl" <<'PY' | tee "$OUT/package_summary.txt"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
load = {w: [r["timings"]["load_s"] for r in rows if r["who"] == w] for w in ("file", "exe")}
ids = {w: {json.dumps(r["ids"]) for r in rows if r["who"] == w} for w in ("file", "exe")}
mf, me = statistics.median(load["file"]), statistics.median(load["exe"])
print(f"load_s file: median {mf:.4f} of {sorted(round(x, 4) for x in load['file'])}")
print(f"load_s exe:  median {me:.4f} of {sorted(round(x, 4) for x in load['exe'])}")
print(f"exe / file = {me / mf:.3f}: {'PASS' if me <= 1.05 * mf else 'FAIL'} (target <= 1.05)")
same = ids["file"] == ids["exe"] and len(ids["file"]) == 1
print(f"ids: {'PASS same' if same else 'FAIL differ'} {sorted(ids['file'])} {sorted(ids['exe'])}")
PY
for who in file exe; do
  if [ $who = file ]; then cmd=("$K" bench "$WORK/e.kiln"); else cmd=("$WORK/e-exe" bench); fi
  "${cmd[@]}" --device "$DEVICE" --input-len 16 --output-len 4 --warmup 0 --reps 1 --json 2>>"$OUT/package_run.log" |
    grep '"load_ms"' | sed "s/^/$who: /" | tee -a "$OUT/package_summary.txt"
done
