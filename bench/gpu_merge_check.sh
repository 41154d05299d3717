#!/usr/bin/env bash
# gpu_merge_check.sh — after merging work: every GPU test, then an A/B of this build's kiln against
# another's (OLD_KILN, e.g. the last landed commit's) on one Mistral-7B checkpoint, alternating,
# two rounds of kiln bench (decode at batch 1, 8, 64; prefill 2048), so that a regression shows
# against the same machine's noise (figures from different device calls are not comparable).
#     BIN=.carry/bin OLD_KILN=.carry/old/kiln OUT=$OUT bash bench/gpu_merge_check.sh
set -u
BIN=${BIN:-build-dev}
OUT=${OUT:-out}
W=${WORK:-/tmp/kiln-merge}
BUDGET=${BUDGET:-540}
. bench/gpu_lib.sh
val() { grep "\"$1\"" | tail -1 | sed 's/.*"value":\([0-9.e+-]*\).*/\1/'; }
( timeout 120 python3 bench/make_checkpoint.py --arch mistral-7b --out "$W/m7" >"$OUT/mk.log" 2>&1
  timeout 60 "$BIN/kiln" compile "$W/m7" -o "$W/new.kiln" --target sm_90 >"$OUT/c_new.log" 2>&1
  [ -z "${OLD_KILN:-}" ] || timeout 60 "$OLD_KILN" compile "$W/m7" -o "$W/old.kiln" --target sm_90 >"$OUT/c_old.log" 2>&1 ) &
b=$!
part kernels 200 "$BIN/test_gpu_kernels"
part exec 200 "$BIN/test_gpu_exec"
wait $b
for round in 1 2; do
    for v in new old; do
        K=$BIN/kiln E=$W/new.kiln
        if [ $v = old ]; then [ -n "${OLD_KILN:-}" ] || continue; K=$OLD_KILN E=$W/old.kiln; fi
        for bb in 1 8 64; do
            echo "$round $v decode batch $bb: $(timeout 60 "$K" bench "$E" --batch $bb --reps 3 --json | val decode_tokens_per_s) tok/s"
        done
        echo "$round $v prefill 2048: $(timeout 60 "$K" bench "$E" --batch 1 --input-len 2048 --output-len 1 --reps 3 --json | val prefill_ms) ms"
    done
done | tee -a "$S"
echo "done at $((SECONDS - t0)) s" | tee -a "$S"
