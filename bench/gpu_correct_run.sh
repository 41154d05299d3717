#!/usr/bin/env bash
# gpu_correct_run.sh — issue 4's two GPU correctness measurements in one
# device session; logs and JSON lines under $OUT (default ./out).
#
#   logits   Mistral-7B shapes, random weights (bench/make_checkpoint.py, seed
#            0, drawn on the GPU): kiln's bf16 engine vs HF fp32 and HF bf16
#            (eager attention) on the same random prompts of lengths
#            1,17,512,4096,6000 (prefill in steps of 2048) plus 4 teacher-forced
#            decode steps each; bench/check_logits.py compares (bound 1.25x).
#   ppl      pycode-22m in bf16: kiln's per-token NLL over the eval text
#            (bench/gpu_logits.c ppl mode, one-token steps, 32 and 8 windows at once)
#            vs HF bf16 and fp32 on the same windows (bench/perplexity.py;
#            bound 0.5%).
# The two run side by side on the one GPU (the ppl part is small).
#
# Run from the repository root with the binaries built here (kiln,
# kiln_gpu_logits) in $BIN and pycode-22m + the eval text in $DATA:
#     BIN=.carry/correct/bin DATA=.carry/correct KILN_COMMIT=$(git rev-parse --short HEAD) \
#         bash bench/gpu_correct_run.sh
# Files back: env.log, logits.jsonl, logits.log, ppl.jsonl, ppl.log, data.tar
# (every logits and NLL file, for looking into a failure without another run).
set -u
BIN=${BIN:-build-dev}
DATA=${DATA:-../shared}
OUT=${OUT:-out}
W=${WORK:-/tmp/kiln-correct}
LENGTHS=${LENGTHS:-1,17,512,4096,6000}
DECODE=${DECODE:-4}
ARCH=${ARCH:-mistral-7b} # tiny, with LENGTHS=1,17,100,300 GL_FLAGS=--cpu, tries this script without a GPU
GL_FLAGS=${GL_FLAGS:-}
PPL=${PPL:-1} # 0: the logits part only (pycode-22m and the eval text not carried)
mkdir -p "$OUT" "$W/lg" "$W/ppl"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/kiln-cache} PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
t0=$SECONDS
PY=$DATA/pycode-22m
TEXT=${TEXT:-$DATA/python-stdlib-eval.txt}
[ -d "$PY" ] || PY=$DATA/models/pycode-22m
[ -f "$TEXT" ] || TEXT=$DATA/eval/python-stdlib-eval.txt

{ date -u; echo "commit ${KILN_COMMIT:-unknown}";
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.mem --format=csv;
  nproc; free -g; df -h /tmp | tail -1;
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, torch.cuda.get_device_name())';
} >"$OUT/env.log" 2>&1
echo "== env: $(grep -m1 -i h200 "$OUT/env.log"; grep -m1 ^torch "$OUT/env.log")"

# ---- ppl (background): engine, ids, kiln, HF --------------------------------
(
  set -e
  [ "$PPL" = 1 ] || { echo "ppl: skipped (PPL=0)"; exit 0; }
  timeout 60 "$BIN/kiln" compile "$PY" -o "$W/py.kiln" --target sm_90
  python3 bench/perplexity.py ids --tokenizer "$PY/tokenizer.json" --text "$TEXT" --out "$W/ppl/text.i32"
  # 32 windows per step (cuBLASLt GEMMs), then 8 (the decode GEMV kernels)
  timeout 90 "$BIN/kiln_gpu_logits" "$W/py.kiln" ppl --ids "$W/ppl/text.i32" --out "$W/ppl/kiln_nll_b32.f32" \
    --batch 32 $GL_FLAGS
  timeout 90 "$BIN/kiln_gpu_logits" "$W/py.kiln" ppl --ids "$W/ppl/text.i32" --out "$W/ppl/kiln_nll_b8.f32" \
    --batch 8 $GL_FLAGS
  timeout 120 python3 bench/perplexity.py score --model "$PY" --ids "$W/ppl/text.i32" \
    --kiln-nll "$W/ppl/kiln_nll_b32.f32,$W/ppl/kiln_nll_b8.f32" --out "$W/ppl" >"$OUT/ppl.jsonl"
) >"$OUT/ppl.log" 2>&1 &
ppl_pid=$!

# ---- logits: checkpoint, then kiln (background) and HF side by side --------
timeout 90 python3 bench/make_checkpoint.py --arch "$ARCH" --out "$W/m7b" >"$OUT/logits.log" 2>&1
echo "== 7B checkpoint rc=$? at $((SECONDS - t0)) s"
VOCAB=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['vocab_size'])" "$W/m7b/config.json")
python3 bench/check_logits.py ids --out "$W/lg/ids.i32" --n $((${LENGTHS##*,} + DECODE)) --vocab "$VOCAB" \
  >>"$OUT/logits.log" 2>&1
( c0=$SECONDS
  timeout 100 "$BIN/kiln" compile "$W/m7b" -o "$W/m7b.kiln" --target sm_90 &&
  echo "kiln compile $((SECONDS - c0)) s" &&
  timeout 60 "$BIN/kiln_gpu_logits" "$W/m7b.kiln" logits --ids "$W/lg/ids.i32" --lengths "$LENGTHS" \
    --decode "$DECODE" --chunk 2048 --out "$W/lg" $GL_FLAGS ) >"$W/kiln7b.log" 2>&1 &
kiln_pid=$!
timeout 170 python3 bench/check_logits.py hf --model "$W/m7b" --ids "$W/lg/ids.i32" --lengths "$LENGTHS" \
  --decode "$DECODE" --out "$W/lg" >>"$OUT/logits.log" 2>&1
echo "== HF 7B rc=$? at $((SECONDS - t0)) s"
wait $kiln_pid
echo "== kiln 7B rc=$? at $((SECONDS - t0)) s"
cat "$W/kiln7b.log" >>"$OUT/logits.log"
python3 bench/check_logits.py compare --dir "$W/lg" --lengths "$LENGTHS" --vocab $VOCAB >"$OUT/logits.jsonl" 2>&1
echo "== compare rc=$?"
wait $ppl_pid
echo "== ppl rc=$? at $((SECONDS - t0)) s"

(cd "$W" && tar cf - lg/*.f32 ppl/*.f32 2>/dev/null) >"$OUT/data.tar"
echo "--- logits.log (tail)"; grep -v "^Loading" "$OUT/logits.log" | tail -25 | cut -c1-300
echo "--- logits.jsonl"; cat "$OUT/logits.jsonl"
echo "--- ppl.log (tail)"; grep -v "^Loading" "$OUT/ppl.log" | tail -8 | cut -c1-300
echo "--- ppl.jsonl"; cat "$OUT/ppl.jsonl" 2>/dev/null
echo "== done at $((SECONDS - t0)) s"
