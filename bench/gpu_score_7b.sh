#!/usr/bin/env bash
# gpu_score_7b.sh — scoring on the GPU at 7B scale and the server's echo on the GPU, in one device call:
#   1. a Mistral-7B-shaped checkpoint with random weights (bench/make_checkpoint.py), compiled (bf16);
#      `kiln perplexity --ids-file` over 16,384 random ids (8 windows of 2048) with this build and, when
#      OLD is set, a build from before kiln_step.all_logits (one token a step): the time of each and
#      their agreement (random weights: the perplexity itself means nothing);
#   2. tests/cli_serve.sh with KILN_TEST_DEVICE=gpu (its echo checks included) on kjv-tiny for sm_90.
#     BIN=.carry/bin [OLD=.carry/old] bash bench/gpu_score_7b.sh
set -u
BIN=${BIN:-.carry/bin}
OUT=${OUT:-out}
W=${WORK:-/tmp/kiln-score7b}
mkdir -p "$OUT" "$W"
export LD_LIBRARY_PATH=$PWD/$BIN/extra:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
t0=$SECONDS
echo "== tests/cli_serve.sh on the GPU"
KILN_TEST_DEVICE=gpu KILN_TEST_TARGET=sm_90 timeout 300 bash tests/cli_serve.sh "$BIN/kiln" "$PWD" >"$OUT/serve.log" 2>&1
echo "rc=$? at $((SECONDS - t0)) s"; grep -E "FAIL|passed" "$OUT/serve.log" | head -8
echo "== 7B"
timeout 150 python3 bench/make_checkpoint.py --arch mistral-7b --out "$W/m7b" >"$W/mk.log" 2>&1 || { echo "checkpoint failed"; tail -3 "$W/mk.log"; exit 1; }
timeout 120 "$BIN/kiln" compile "$W/m7b" -o "$W/m7b.kiln" --target sm_90 >"$W/c.log" 2>&1 || { echo "compile failed"; tail -3 "$W/c.log"; exit 1; }
echo "checkpoint + compile at $((SECONDS - t0)) s"
python3 -c "import random; random.seed(1); print(','.join(str(random.randrange(32000)) for _ in range(16384)))" >"$W/ids.txt"
for b in "$BIN" ${OLD:+"$OLD"}; do
  timeout 200 "$b/kiln" perplexity "$W/m7b.kiln" --ids-file "$W/ids.txt" --window 2048 --device gpu --json >"$W/p.json" 2>"$W/p.err" ||
    { echo "$b: rc=$?"; tail -3 "$W/p.err"; continue; }
  echo "$b: $(cat "$W/p.json")"
done
