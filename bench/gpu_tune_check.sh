#!/usr/bin/env bash
# gpu_tune_check.sh — `kiln compile --tune` on the GPU machine: tiny-mistral (bf16) and stories260k
# compiled with --tune (text and --json), the record read back by `kiln inspect --json` (this GPU's SM,
# the shapes the report listed) and used by `kiln bench` (its tuning state "recorded ..."); a line
# per engine in $OUT/summary.txt, with the end of its stderr when a check failed.
#     BIN=.carry/bin OUT=$OUT bash bench/gpu_tune_check.sh
set -u
BIN=${BIN:-build-dev}
OUT=${OUT:-out}
W=${WORK:-/tmp/kiln-tune}
BUDGET=${BUDGET:-200}
. bench/gpu_lib.sh
K=$BIN/kiln
fails=0
for ck in tests/data/tiny-mistral models/stories260k; do
    n=$(basename "$ck")
    E=$W/$n.kiln
    timeout 120 "$K" compile "$ck" -o "$E" --dtype bf16 --target sm_90 --tune --json >"$W/$n.json" 2>"$W/$n.err"
    rc=$?
    "$K" inspect "$E" --json >"$W/$n.inspect.json" 2>>"$W/$n.err"
    timeout 60 "$K" bench "$E" --batch 4 --input-len 16 --output-len 8 --reps 1 --json >"$W/$n.bench.json" 2>>"$W/$n.err"
    python3 - "$rc" "$W/$n.json" "$W/$n.inspect.json" "$W/$n.bench.json" <<'PY' >>"$S" 2>&1 || { fails=$((fails + 1)); tail -5 "$W/$n.err" >>"$S"; }
import json, sys
rc, c, i = int(sys.argv[1]), json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
assert rc == 0, rc
t = c["tuning"]
assert t["written"] and t["sm"] == "sm_90" and t["shapes"], t
assert c["bytes"] == t["bytes_after"] > t["bytes_before"], (c["bytes"], t)
recs = i["tuning"]
assert len(recs) == 1, recs
print(sys.argv[2], "ok:", len(t["shapes"]), "shapes in", t["seconds"], "s; inspect:", json.dumps(recs[0])[:200])
b = [json.loads(l) for l in open(sys.argv[4]) if l.startswith("{")]
tl = [m for m in b if m.get("metric") == "tuning"]
assert tl and tl[0]["value"] > 0, tl  # the bench ran with the recorded shapes
print("bench: tuning", tl[0]["tuning"], tl[0]["value"], "shapes")
PY
done
echo "compile --tune: $fails failed" | tee -a "$S"
