#!/usr/bin/env bash
# gpu_slots_ab.sh — the CUDA executor on the plan's slots (plan version 4, in-place outputs chosen by
# memory planning) against the kiln before it, in one device call: test_gpu_kernels, test_gpu_exec and
# compute-sanitizer memcheck over two engine tests first; then a Mistral-7B checkpoint (random weights,
# bench/make_checkpoint.py) compiled bf16 by each kiln ($BIN: this one, $OLD: the one before), and
# $ROUNDS rounds alternating the two (decode batch 1, 8 and 64 at 128 in / 128 out, prefill 2048 and
# 128), with each one's peak device memory; last, this kiln running the old kiln's engine (a version 2
# plan: no output in an input's slot, so the GPU copies each residual first) must give the same greedy
# ids as the old kiln on it.
#   BIN=.carry/bin OLD=.carry/old OUT=$OUT bash bench/gpu_slots_ab.sh
set -u
BIN=${BIN:-build-dev}
OLD=${OLD:-.carry/old}
OUT=${OUT:-out}
W=${WORK:-/tmp/kiln-slots}
BUDGET=${BUDGET:-570}
ROUNDS=${ROUNDS:-2}
. bench/gpu_lib.sh
python3 bench/make_checkpoint.py --arch mistral-7b --out "$W/m7" >"$OUT/checkpoint.log" 2>&1 &
ck=$!
part kernels 120 "$BIN/test_gpu_kernels"
part exec 120 "$BIN/test_gpu_exec"
grep -h "FAIL" "$OUT/kernels.log" "$OUT/exec.log" | head -8 >>"$S"
part memcheck_exec 90 env KILN_TEST_ONLY=test_tiny_bf16,test_w8a8_matches_cpu \
  compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/test_gpu_exec"
grep -h "ERROR SUMMARY\|Program hit" "$OUT/memcheck_exec.log" | sort | uniq -c >>"$S"
wait $ck || { echo "checkpoint failed" >>"$S"; cat "$S"; exit 0; }
part compile_new 90 "$BIN/kiln" compile "$W/m7" -o "$W/new.kiln" --target sm_90
part compile_old 90 "$OLD/kiln" compile "$W/m7" -o "$W/old.kiln" --target sm_90
val() { grep -h "\"$1\"" "$2" | sed 's/.*"value":\([0-9.e+-]*\).*/\1/' | tail -1; }
for round in $(seq "$ROUNDS"); do
  for who in new old; do
    [ $who = new ] && K=$BIN/kiln || K=$OLD/kiln
    for b in 1 8 64; do
      n="r${round}_${who}_b$b"
      b1 "$n" 40 "$W/$who.kiln" --batch $b --input-len 128 --output-len 128 --reps 3
      echo "round $round $who decode b$b: $(val decode_tokens_per_s "$OUT/$n.log") tok/s, peak $(val peak_device_memory "$OUT/$n.log") MiB" >>"$S"
    done
    for t in 2048 128; do
      n="r${round}_${who}_p$t"
      b1 "$n" 40 "$W/$who.kiln" --batch 1 --input-len $t --output-len 1 --reps 5
      echo "round $round $who prefill $t: $(val prefill_ms "$OUT/$n.log") ms, peak $(val peak_device_memory "$OUT/$n.log") MiB" >>"$S"
    done
  done
done
ids() { "$1" run "$2" --prompt-ids 1,306,461,2051,338,263,1243,29892 --max-tokens 48 --temperature 0 --json 2>&1 |
          sed 's/.*"ids": *\(\[[^]]*\]\).*/\1/' | head -1; }
a=$(ids "$BIN/kiln" "$W/old.kiln"); b=$(ids "$OLD/kiln" "$W/old.kiln"); c=$(ids "$BIN/kiln" "$W/new.kiln")
echo "old engine, this kiln: $a" >>"$S"; echo "old engine, old kiln:  $b" >>"$S"; echo "new engine, this kiln: $c" >>"$S"
[ "$a" = "$b" ] && [ "$a" = "$c" ] && echo "greedy ids: all three identical" >>"$S" || echo "greedy ids: DIFFER" >>"$S"
echo "total: $((SECONDS - t0)) s" >>"$S"
cat "$S"
