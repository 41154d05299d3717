#!/usr/bin/env bash
# gpu_prompt_lp.sh — every row's logits on the GPU (kiln_step.all_logits: prompt logprobs, kiln_score,
# `kiln perplexity`), in one device call:
#   1. test_gpu_exec (its golden checks include a prompt read as one chunk returning every row);
#   2. an engine of pycode-22m compiled here (fp8 projections, W8A8 on the prefill path):
#      `kiln perplexity` on the GPU over the eval text (window 512), also with --measure w8a8=0; the
#      CPU's figure for the same engine file is measured on the build machine;
#   3. `kiln run --prompt-logprobs` on the GPU against `kiln perplexity`'s NLL of the same 512 ids.
# Run from the repository root with BIN (kiln, test_gpu_exec) and DATA (fp8.kiln, the eval text,
# ids512.txt: the text's first 512 ids):
#     BIN=.carry/bin DATA=.carry/ppl [OLD=.carry/old] bash bench/gpu_prompt_lp.sh
# OLD: a directory with another build's kiln, whose perplexity over the same engine runs after.
set -u
BIN=${BIN:-.carry/bin}
DATA=${DATA:-.carry/ppl}
OUT=${OUT:-out}
W=${WORK:-/tmp/kiln-plp}
mkdir -p "$OUT" "$W"
export LD_LIBRARY_PATH=$PWD/$BIN/extra:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export KILN_TEST_SOURCE_DIR=$PWD KILN_TEST_SHARED_DIR=/nonexistent
E=$DATA/fp8.kiln
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

echo "== test_gpu_exec"
t0=$SECONDS
timeout 400 "$BIN/test_gpu_exec" >"$OUT/test_gpu_exec.log" 2>&1
echo "rc=$? in $((SECONDS - t0)) s"
grep -E "FAIL|passed" "$OUT/test_gpu_exec.log" | head -12
grep -E "rows of logits" "$OUT/test_gpu_exec.log" | awk '{print $NF}' | sort -g | tail -1 | sed 's/^/worst every-row rel err: /'

echo "== kiln perplexity on the GPU (window 512)"
for knob in "" "--measure w8a8=0"; do
  # shellcheck disable=SC2086
  timeout 300 "$BIN/kiln" perplexity "$E" --text-file "$DATA/python-stdlib-eval.txt" --device gpu --json $knob \
    >"$W/p.json" 2>"$W/p.err" || { echo "rc=$?"; tail -3 "$W/p.err"; }
  echo "gpu ${knob:-default}: $(cat "$W/p.json")"
done

if [ -n "${OLD:-}" ]; then # the same engine through a kiln from before (one token a step), for the time
  for knob in "" "--measure w8a8=0"; do
    # shellcheck disable=SC2086
    timeout 300 "$OLD/kiln" perplexity "$E" --text-file "$DATA/python-stdlib-eval.txt" --device gpu --json $knob \
      >"$W/o.json" 2>"$W/o.err" || { echo "rc=$?"; tail -3 "$W/o.err"; }
    echo "old gpu ${knob:-default}: $(cat "$W/o.json")"
  done
fi

echo "== kiln run --prompt-logprobs on the GPU against kiln perplexity (one 512-token window)"
"$BIN/kiln" perplexity "$E" --ids-file "$DATA/ids512.txt" --window 512 --device gpu --json >"$W/ps.json" 2>&1
"$BIN/kiln" run "$E" --prompt-ids "$(cat "$DATA/ids512.txt")" --max-tokens 0 --prompt-logprobs 1 --json --device gpu \
  >"$W/run.json" 2>"$W/run.err" || { echo "run rc=$?"; tail -3 "$W/run.err"; }
python3 - "$W/run.json" "$W/ps.json" <<'PY'
import json, sys
r, p = (json.load(open(f)) for f in sys.argv[1:])
lp = [t["logprob"] for t in r["prompt_logprobs"][1:]]
nll = -sum(lp) / len(lp)
print(f"prompt_logprobs: {len(lp)} positions, mean NLL {nll:.6f}; kiln perplexity: nll_mean {p['nll_mean']:.6f} "
      f"(scored {p['scored']}, windows {p['windows']}); one alternative each: {all(len(t['top']) == 1 for t in r['prompt_logprobs'][1:])}")
PY
