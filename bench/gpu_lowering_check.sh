#!/usr/bin/env bash
# gpu_lowering_check.sh — one device command for the lowering change (issue 9):
# the CUDA executor's tests on the new plan (linear_add, packed weights,
# flags), then the random-weight Mistral-7B compiled by this kiln and by a
# baseline kiln (the commit before), decoded by both in the same run:
# kiln_gpu_decode at batch 1/8/64, prefill 2048, TTFT 128. Writes
# $OUT/summary.txt and the logs; leaves /tmp/m7 (the checkpoint, with the
# llama2 tokenizer) for bench/gpu_serve_load.sh's next command.
#
#   BIN=.carry/bin BASE=.carry/base TOK=.carry/tok/llama2 bash bench/gpu_lowering_check.sh
# BIN: kiln, test_gpu_nvrtc, test_gpu_exec, test_gpu_kernels, kiln_gpu_decode (this commit);
# BASE: kiln, kiln_gpu_decode (the baseline).
set -u
BIN=${BIN:-.carry/bin}
BASE=${BASE:-.carry/base}
TOK=${TOK:-.carry/tok/llama2}
OUT=${OUT:-out}
. bench/gpu_lib.sh # part, S, LD_LIBRARY_PATH, $OUT/env.txt
part test_gpu_nvrtc 120 "$BIN/test_gpu_nvrtc"
part test_gpu_exec 300 "$BIN/test_gpu_exec"
part test_gpu_kernels 300 "$BIN/test_gpu_kernels"
if [ ! -f /tmp/m7/config.json ]; then
    part checkpoint 240 python3 bench/make_checkpoint.py --arch mistral-7b --out /tmp/m7
    cp "$TOK/tokenizer.json" "$TOK/tokenizer_config.json" /tmp/m7/
    mkdir -p /tmp/gsl && echo "mistral-7b layers=32" >/tmp/gsl/ckpt.done
fi
part compile_new 240 "$BIN/kiln" compile /tmp/m7 -o /tmp/m7.kiln --target sm_90 --force
part compile_base 240 "$BASE/kiln" compile /tmp/m7 -o /tmp/m7-base.kiln --target sm_90 --force
"$BIN/kiln" inspect /tmp/m7.kiln >"$OUT/inspect_new.txt" 2>&1
# A/B in one run, alternating: base, new, base, new
for r in 1 2; do
    for v in base new; do
        exe=$BASE/kiln_gpu_decode eng=/tmp/m7-base.kiln
        [ $v = new ] && exe=$BIN/kiln_gpu_decode eng=/tmp/m7.kiln
        KILN_COMMIT=$v timeout 240 "$exe" "$eng" --batches 1,8,64 --prompt 512 --steps 64 --prefill 2048 --ttft 128 \
            --reps 5 --no-graph-compare >"$OUT/decode_${v}_$r.jsonl" 2>"$OUT/decode_${v}_$r.log"
        echo "decode $v run $r: rc $?" >>"$S"
    done
done
python3 - "$OUT" >>"$S" <<'PY'
import json, sys, glob, statistics, os
out = sys.argv[1]
rows = {}
for f in sorted(glob.glob(os.path.join(out, "decode_*_*.jsonl"))):
    v = os.path.basename(f).split("_")[1]
    for line in open(f):
        try:
            d = json.loads(line)
        except ValueError:
            continue
        key = (d.get("metric"), d.get("batch"))
        rows.setdefault(key, {}).setdefault(v, []).append(d.get("value"))
print("metric batch | base | new | new/base")
for key in sorted(rows, key=str):
    b, n = rows[key].get("base", []), rows[key].get("new", [])
    if b and n:
        mb, mn = statistics.median(b), statistics.median(n)
        print("%s %s | %.4g | %.4g | %.3f" % (key[0], key[1], mb, mn, mn / mb if mb else 0))
PY
cat "$S"
